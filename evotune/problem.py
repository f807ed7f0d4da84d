"""Problems: what a kernel is tuned for (a GEMM shape, dtype and layout, or a recorded kernel).

Example::

    from evotune.problem import Problem
    p = Problem.gemm(4096, 4096, 4096, dtype="bf16")
    p.key, p.flops, p.bucket().key
    # ('gemm_bf16_tn_4096x4096x4096', 137438953472, 'gemm_bf16_tn_4096x4096x4096')

Layouts use the BLAS letters for A and B: ``t`` is row-major (K contiguous for
A), ``n`` is column-major. ``tn`` keeps K contiguous in both operands, which is
what torch.matmul(a, b.T) and torch._int_mm(a, b.T) see.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# bytes per element of the inputs, and the accumulator and output dtypes per input dtype
DTYPES: dict[str, dict[str, Any]] = {
    "bf16": {"bytes": 2, "acc": "fp32", "out": "bf16", "out_bytes": 2},
    "fp16": {"bytes": 2, "acc": "fp32", "out": "fp16", "out_bytes": 2},
    "fp8": {"bytes": 1, "acc": "fp32", "out": "bf16", "out_bytes": 2},
    "int8": {"bytes": 1, "acc": "int32", "out": "int32", "out_bytes": 4},
    "fp32": {"bytes": 4, "acc": "fp32", "out": "fp32", "out_bytes": 4},
}
LAYOUTS = ("tn", "nn", "nt", "tt")


@dataclass(frozen=True)
class Problem:
    """A GEMM ``C[m, n] = A[m, k] @ B[k, n]``, or a named recorded kernel (``kind != "gemm"``)."""

    kind: str = "gemm"
    m: int = 0
    n: int = 0
    k: int = 0
    dtype: str = "bf16"
    layout: str = "tn"
    label: str = ""  # for recorded non-GEMM kernels: the problem size, e.g. "20000000"
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def gemm(cls, m: int, n: int, k: int, dtype: str = "bf16", layout: str = "tn") -> Problem:
        p = cls("gemm", m, n, k, dtype, layout)
        p.check()
        return p

    def check(self) -> None:
        """Raise ValueError naming the first bad field."""
        if self.kind != "gemm":
            return
        for dim in ("m", "n", "k"):
            value = getattr(self, dim)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{dim}: must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {sorted(DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} is not one of {list(LAYOUTS)}")

    @property
    def key(self) -> str:
        if self.kind != "gemm":
            slug = "".join(ch if ch.isalnum() else "_" for ch in self.label).strip("_")
            return f"{self.kind}_{slug}" if slug else self.kind
        return f"gemm_{self.dtype}_{self.layout}_{self.m}x{self.n}x{self.k}"

    @property
    def in_bytes(self) -> int:
        return DTYPES[self.dtype]["bytes"]

    @property
    def out_bytes(self) -> int:
        return DTYPES[self.dtype]["out_bytes"]

    @property
    def flops(self) -> int | None:
        """Floating-point (int8: integer) operations of a GEMM; None for a recorded kernel, whose count is unknown."""
        return 2 * self.m * self.n * self.k if self.kind == "gemm" else None

    @property
    def min_bytes(self) -> int | None:
        """The fewest bytes a GEMM must move: each input read once, the output written once (None if not a GEMM)."""
        if self.kind != "gemm":
            return None
        return (self.m * self.k + self.n * self.k) * self.in_bytes + self.m * self.n * self.out_bytes

    def k_major(self, operand: str) -> bool:
        """Whether K is the contiguous dimension of operand ``"a"`` or ``"b"``."""
        return self.layout[0] == "t" if operand == "a" else self.layout[1] == "n"

    def bucket(self) -> Problem:
        """The same problem with every dimension rounded to the nearest power of two."""
        if self.kind != "gemm":
            return self
        def r(x: int) -> int:
            return 1 << max(0, round(math.log2(x)))
        return Problem("gemm", r(self.m), r(self.n), r(self.k), self.dtype, self.layout)

    def to_dict(self) -> dict[str, Any]:
        """The problem as JSON holds it (study attributes, landscapes, ``best`` exports).

        A recorded kernel that is not a GEMM (a Kernel Tuner file's) is known by its kernel name
        and problem size only: it is written as ``kind``, ``label`` and ``extra``, with no GEMM
        shape, dtype or layout that would describe it as something it is not.
        """
        d = asdict(self)
        d["extra"] = dict(self.extra)
        if self.kind != "gemm":
            d = {"kind": self.kind, "label": self.label, "extra": d["extra"]}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Problem:
        d = dict(d)
        d["extra"] = tuple(sorted(dict(d.get("extra") or {}).items()))
        return cls(**d)

    def describe(self) -> str:
        if self.kind != "gemm":
            return f"{self.kind} {self.label}".strip()
        return f"{self.m}x{self.n}x{self.k} {self.dtype} {self.layout}"

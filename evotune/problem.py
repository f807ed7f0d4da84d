"""Problems: what a kernel is tuned for (a GEMM shape, dtype and layout, another workload's problem, or a
recorded kernel).

A problem's kind names its workload (:mod:`evotune.workloads`), which owns its
key, bucket, FLOP and byte counts and JSON form; a kind that is no workload is a
recorded kernel (a Kernel Tuner file's), known by its name and label only.

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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evotune.workloads.base import Workload

# bytes per element of the inputs, and the accumulator and output dtypes per input dtype
DTYPES: dict[str, dict[str, Any]] = {
    "bf16": {"bytes": 2, "acc": "fp32", "out": "bf16", "out_bytes": 2},
    "fp16": {"bytes": 2, "acc": "fp32", "out": "fp16", "out_bytes": 2},
    "fp8": {"bytes": 1, "acc": "fp32", "out": "bf16", "out_bytes": 2},
    "int8": {"bytes": 1, "acc": "int32", "out": "int32", "out_bytes": 4},
    "fp32": {"bytes": 4, "acc": "fp32", "out": "fp32", "out_bytes": 4},
}
LAYOUTS = ("tn", "nn", "nt", "tt")
DEFAULT_DTYPE = "bf16"


@dataclass(frozen=True)
class Problem:
    """A GEMM ``C[m, n] = A[m, k] @ B[k, n]``, another workload's problem (its sizes in ``extra``), or a named
    recorded kernel (``label``)."""

    kind: str = "gemm"
    m: int = 0
    n: int = 0
    k: int = 0
    dtype: str = DEFAULT_DTYPE
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
    def workload(self) -> Workload | None:
        """The workload of this problem's kind; None for a recorded kernel."""
        from evotune.workloads import find_workload

        return find_workload(self.kind)

    @property
    def key(self) -> str:
        w = self.workload
        if w is not None:
            return w.key(self)
        slug = "".join(ch if ch.isalnum() else "_" for ch in self.label).strip("_")
        return f"{self.kind}_{slug}" if slug else self.kind

    @property
    def in_bytes(self) -> int:
        return DTYPES[self.dtype]["bytes"]

    @property
    def out_bytes(self) -> int:
        return DTYPES[self.dtype]["out_bytes"]

    @property
    def flops(self) -> int | None:
        """Operations (int8: integer ones) of the problem; None for a recorded kernel, whose count is unknown."""
        w = self.workload
        return w.flops(self) if w is not None else None

    @property
    def min_bytes(self) -> int | None:
        """The fewest bytes a kernel must move: each input read once, the output written once (None if unknown)."""
        w = self.workload
        return w.min_bytes(self) if w is not None else None

    def k_major(self, operand: str) -> bool:
        """Whether K is the contiguous dimension of operand ``"a"`` or ``"b"``."""
        return self.layout[0] == "t" if operand == "a" else self.layout[1] == "n"

    def bucket(self) -> Problem:
        """The same problem with its sizes rounded as its workload buckets them (GEMM: each to a power of two)."""
        w = self.workload
        return w.bucket(self) if w is not None else self

    def to_dict(self) -> dict[str, Any]:
        """The problem as JSON holds it (study attributes, landscapes, ``best`` exports).

        A workload's problem is written as its workload says (a GEMM: every field). A recorded
        kernel (a Kernel Tuner file's) is known by its kernel name, problem size and data type: it
        is written as ``kind``, ``label``, ``dtype`` (left out at the default, which it reads back
        as) and ``extra``, with no GEMM shape or layout that would describe it as something it is not.
        """
        w = self.workload
        if w is not None:
            return w.to_dict(self)
        dtype = {} if self.dtype == DEFAULT_DTYPE else {"dtype": self.dtype}
        return {"kind": self.kind, "label": self.label, **dtype, "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Problem:
        d = dict(d)
        d["extra"] = tuple(sorted(dict(d.get("extra") or {}).items()))
        return cls(**d)

    def describe(self) -> str:
        w = self.workload
        if w is not None:
            return w.describe(self)
        return f"{self.kind} {self.label}".strip()

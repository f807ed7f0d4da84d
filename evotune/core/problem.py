"""Problems: what a kernel is tuned for (a GEMM shape, dtype and layout, another workload's problem, or a
recorded kernel).

A problem's kind names its workload (a :class:`Workload`), which owns its
key, bucket, FLOP and byte counts and JSON form; a kind that is no workload is a
recorded kernel (a Kernel Tuner file's), known by its name and label only.

The workload seam lives here too, below every layer that asks a problem about itself:
:class:`Workload` (what a problem kind must say about itself) and the registry that finds one by
its kind: the built-ins of :mod:`evotune.measurement.workloads`, then the ``evotune.workloads``
entry points.

Example::

    from evotune.core.problem import Problem
    p = Problem.gemm(4096, 4096, 4096, dtype="bf16")
    p.key, p.flops, p.bucket().key
    # ('gemm_bf16_tn_4096x4096x4096', 137438953472, 'gemm_bf16_tn_4096x4096x4096')

Layouts use the BLAS letters for A and B: ``t`` is row-major (K contiguous for
A), ``n`` is column-major. ``tn`` keeps K contiguous in both operands, which is
what torch.matmul(a, b.T) and torch._int_mm(a, b.T) see.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar


@dataclass(frozen=True)
class DType:
    """An input dtype: bytes per input element, the accumulator and output dtypes, bytes per output element."""

    bytes: int
    acc: str
    out: str
    out_bytes: int


DTYPES: dict[str, DType] = {
    "bf16": DType(bytes=2, acc="fp32", out="bf16", out_bytes=2),
    "fp16": DType(bytes=2, acc="fp32", out="fp16", out_bytes=2),
    "fp8": DType(bytes=1, acc="fp32", out="bf16", out_bytes=2),
    "int8": DType(bytes=1, acc="int32", out="int32", out_bytes=4),
    "fp32": DType(bytes=4, acc="fp32", out="fp32", out_bytes=4),
}
LAYOUTS = ("tn", "nn", "nt", "tt")
DEFAULT_DTYPE = "bf16"
# how fp8 (e4m3) GEMM inputs are scaled (a GEMM's ``scaling``; "" is unscaled): one fp32 scale per operand
# ("tensor"), one per row of A and per column of C ("row"), or per 1 x SCALE_BLOCK group along K of A and per
# SCALE_BLOCK x SCALE_BLOCK block of the (N, K) weights B ("block", as DeepSeek-V3 style checkpoints are stored)
SCALINGS = ("tensor", "row", "block")
SCALE_BLOCK = 128


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
    def gemm(cls, m: int, n: int, k: int, dtype: str = "bf16", layout: str = "tn", scaling: str = "") -> Problem:
        """A GEMM; ``scaling`` (fp8 only, one of :data:`SCALINGS`) makes it a scaled fp8 GEMM."""
        p = cls("gemm", m, n, k, dtype, layout, extra=(("scaling", scaling),) if scaling else ())
        p.check()
        return p

    def check(self) -> None:
        """Raise ValueError (a :class:`FieldError` for the scaling rules) naming the first bad field."""
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
        self._check_scaling()

    def _check_scaling(self) -> None:
        scaling = self.scaling
        if not scaling:
            return
        if self.dtype != "fp8":
            raise FieldError("scaling", f"only fp8 inputs are scaled, not {self.dtype}")
        if scaling not in SCALINGS:
            raise FieldError("scaling", f"unknown scaling {scaling!r}; accepted: {', '.join(SCALINGS)}")
        if self.layout != "tn":
            # what torch._scaled_mm and the FP8 tensor cores take: A (M, K) and the weights (N, K) K-contiguous
            raise FieldError("layout", f"scaled fp8 takes layout tn (K contiguous in A and B), not {self.layout}")
        if scaling == "block":
            for dim in ("k", "n"):
                value = getattr(self, dim)
                if value % SCALE_BLOCK:
                    raise FieldError(dim, f"must be a multiple of {SCALE_BLOCK} for scaling = \"block\" (1x"
                                          f"{SCALE_BLOCK} groups of A, {SCALE_BLOCK}x{SCALE_BLOCK} blocks of B), "
                                          f"got {value}")

    @property
    def scaling(self) -> str:
        """How the problem's numbers are scaled ("" when they are not): a scaled fp8 GEMM's inputs, one of
        :data:`SCALINGS`; a workload that keeps a ``scaling`` of its own in ``extra`` (conv2d) reads the same."""
        return str(dict(self.extra).get("scaling", ""))

    @property
    def workload(self) -> Workload | None:
        """The workload of this problem's kind; None for a recorded kernel."""
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
        return DTYPES[self.dtype].bytes

    @property
    def out_bytes(self) -> int:
        return DTYPES[self.dtype].out_bytes

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


# The workload seam: what a problem kind (a GEMM, a convolution, ...) must say about itself.
#
# A :class:`Workload` is the one place that knows a kind's fields, its cache keys,
# its FLOP and byte counts, its inputs, its reference and its baselines. The
# experiment parser, the CPU and GPU workers, ``report.py`` and ``lookup()`` call
# it through :func:`get_workload` and never assume a GEMM.
#
# Kernels are called with the inputs in order, the output last:
# ``kernel(*inputs)`` on the GPU (torch tensors, the output written in place),
# ``fn(*cpu_inputs) -> output`` on the CPU oracle (numpy arrays, the output
# returned). A GPU kernel or baseline that wants its operands in another form
# (a filter in the kernel's own layout, fp16 copies for a baseline of another
# precision) carries ``prepare(inputs) -> args``: the worker calls it once per
# set of inputs, outside the timing, as a deployment converts its weights once,
# and launches ``kernel(*args)``. A kernel's ``args[-1]`` must be ``inputs[-1]``,
# the output that is verified; see :func:`call_args`.


def call_args(fn: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments ``fn`` is launched with: ``fn.prepare(inputs)`` when it has one, else ``inputs``."""
    prepare = getattr(fn, "prepare", None)
    return tuple(prepare(inputs)) if prepare is not None else inputs


class FieldError(ValueError):
    """A bad field of a ``[[problem]]`` table: ``field`` is its name inside the table (``stride``)."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def int_field(table: dict[str, Any], name: str, default: int | None = None, minimum: int = 1) -> int:
    """An integer field of a ``[[problem]]`` table, at least ``minimum``; required when ``default`` is None."""
    if name not in table and default is None:
        raise FieldError(name, "missing (required)")
    value = table.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise FieldError(name, f"must be {what}, got {value!r}")
    return value


def choice_field(table: dict[str, Any], name: str, default: str, accepted: Iterable[str]) -> str:
    """A field of a ``[[problem]]`` table that takes one of ``accepted``."""
    value, accepted = table.get(name, default), list(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise FieldError(name, f"unknown {name} {value!r}; accepted: {', '.join(accepted)}")
    return value


class Workload:
    """One problem kind. Subclasses set ``kind`` and ``fields`` and implement the methods below."""

    kind: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()  # the keys a [[problem]] table of this kind accepts besides kind

    # -- describing a problem --------------------------------------------------
    def parse(self, table: dict[str, Any]) -> Problem:
        """The problem a ``[[problem]]`` table describes; raises :class:`FieldError` naming the bad field."""
        raise NotImplementedError

    def key(self, problem: Problem) -> str:
        """The problem's stable name: studies, landscapes and the tuning-result cache are keyed by it."""
        raise NotImplementedError

    def bucket(self, problem: Problem) -> Problem:
        """The problem with its sizes rounded (to powers of two): problems in one bucket share a kernel."""
        return problem

    def bucket_key(self, problem: Problem) -> str:
        return self.key(self.bucket(problem))

    def family(self, problem: Problem) -> tuple[Any, ...]:
        """What must agree for one problem's tuned kernel to serve another (kind, dtype, layout...)."""
        return (problem.kind, problem.dtype, problem.layout)

    def bucket_distance(self, a: Problem, b: Problem) -> float:
        """How far apart two problems of one family are; ``lookup()`` falls back to the nearest."""
        return 0.0 if self.key(a) == self.key(b) else 1.0

    def flops(self, problem: Problem) -> int | None:
        """Operations (multiply and add count as two); None when unknown."""
        return None

    def min_bytes(self, problem: Problem) -> int | None:
        """The fewest bytes a kernel must move (inputs read once, output written once); None when unknown."""
        return None

    def peak_dtype(self, problem: Problem) -> str:
        """The dtype whose dense peak (``Hardware.peak``) bounds this problem."""
        return problem.dtype

    def describe(self, problem: Problem) -> str:
        return self.key(problem)

    def to_dict(self, problem: Problem) -> dict[str, Any]:
        """The problem as JSON holds it; ``Problem.from_dict`` reads it back."""
        return {"kind": problem.kind, "dtype": problem.dtype, "layout": problem.layout, "label": problem.label,
                "extra": dict(problem.extra)}

    # -- on the GPU (torch) ----------------------------------------------------
    def make_inputs(self, problem: Problem, seed: int = 0, fill: bool = True) -> tuple[Any, ...]:
        """Fresh random inputs and a poisoned output on the GPU; ``fill=False`` only allocates them."""
        raise NotImplementedError(f"workload {self.kind!r} has no GPU inputs")

    def poison(self, inputs: tuple[Any, ...]) -> None:
        """Fill the output (the last input) with values a correct kernel overwrites."""
        raise NotImplementedError

    def verify(self, problem: Problem, inputs: tuple[Any, ...]) -> tuple[bool, float, str]:
        """(passed, error, reason when it failed) of the output against the reference."""
        raise NotImplementedError

    def baselines(self, problem: Problem) -> dict[str, Callable[..., object]]:
        """The kernels a user would otherwise run, called as ``fn(*inputs)``."""
        return {}

    # -- on the CPU oracle (numpy) ---------------------------------------------
    def cpu_inputs(self, problem: Problem, seed: int) -> tuple[Any, ...]:
        """Random numpy inputs for ``fn(*inputs) -> output``."""
        raise NotImplementedError(f"workload {self.kind!r} has no CPU inputs")

    def cpu_verify(self, problem: Problem, inputs: tuple[Any, ...], out: Any) -> tuple[bool, float | None, str]:
        """(ok, error, why not) of ``out`` against the numpy reference."""
        raise NotImplementedError


# Finding a workload by its kind.
ENTRY_POINT_GROUP = "evotune.workloads"
# the built-in workloads: each module defines WORKLOAD; imported by name, as entry points are
BUILTIN_WORKLOADS = ("evotune.measurement.workloads.gemm", "evotune.measurement.workloads.conv2d")


class WorkloadNotFound(LookupError):
    pass


def _workload_of(obj: object, name: str) -> Workload:
    obj = getattr(obj, "WORKLOAD", obj)
    if not isinstance(obj, Workload):
        raise WorkloadNotFound(f"{name} is not an evotune.core.problem.Workload")
    return obj


@functools.cache
def _registry() -> dict[str, Workload]:
    found: dict[str, Workload] = {}
    for module in BUILTIN_WORKLOADS:
        w = _workload_of(importlib.import_module(module), module)
        found[w.kind] = w
    return found


def workload_names() -> list[str]:
    """Every kind a [[problem]] table may name: built-ins and entry points."""
    return sorted({*_registry(), *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


@functools.cache
def find_workload(kind: str) -> Workload | None:
    """The workload of ``kind``, or None (a recorded kernel of another kind is no workload)."""
    if kind in _registry():
        return _registry()[kind]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == kind:
            return _workload_of(ep.load(), kind)
    return None


def get_workload(kind: str) -> Workload:
    """The workload of ``kind``; raises :class:`WorkloadNotFound`."""
    w = find_workload(kind)
    if w is None:
        raise WorkloadNotFound(f"unknown workload {kind!r}; accepted: {', '.join(workload_names())}")
    return w

"""The workload seam: what a problem kind (a GEMM, a convolution, ...) must say about itself.

A :class:`Workload` is the one place that knows a kind's fields, its cache keys,
its FLOP and byte counts, its inputs, its reference and its baselines. The
experiment parser, the CPU and GPU workers, ``report.py`` and ``lookup()`` call
it through :func:`evotune.workloads.get_workload` and never assume a GEMM.

Kernels are called with the inputs in order, the output last:
``kernel(*inputs)`` on the GPU (torch tensors, the output written in place),
``fn(*cpu_inputs) -> output`` on the CPU oracle (numpy arrays, the output
returned). A GPU kernel or baseline that wants its operands in another form
(a filter in the kernel's own layout, fp16 copies for a baseline of another
precision) carries ``prepare(inputs) -> args``: the worker calls it once per
set of inputs, outside the timing, as a deployment converts its weights once,
and launches ``kernel(*args)``. A kernel's ``args[-1]`` must be ``inputs[-1]``,
the output that is verified; see :func:`call_args`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from evotune.problem import Problem


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
    if value not in accepted:
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

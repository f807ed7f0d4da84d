"""Search spaces: parameters, named constraints, enumeration, encoding and repair.

A space is declared once and stays static; what is feasible depends on a
:class:`Context` (the GPU and the problem), so the same space prunes
differently on an H100 and a B200, or for bf16 and int8.

Example::

    from evotune.space import SearchSpace, ordinal, categorical, power_of_two, constraint

    space = SearchSpace(
        "toy",
        [power_of_two("block", 16, 256), categorical("order", ["m", "n"])],
        constraints=[constraint("small-order-n", lambda p, ctx: p["block"] >= 32 or p["order"] == "m",
                                "block {block} is too small to raster along N")],
    )
    feasible = space.feasible(Context())
    print(space.size, len(feasible))   # 10 9
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evotune.hardware import Hardware
    from evotune.problem import Problem

Point = dict[str, Any]

# Enumerating more points than this would take minutes of Python predicates;
# every space evotune ships is far below it.
MAX_ENUMERATION = 5_000_000


@dataclass(frozen=True)
class Param:
    """One knob: a name and its choices.

    ``ordered`` choices have a neighbourhood (4 is between 2 and 8), which
    mutation, repair and the samplers use; unordered ones are plain categories.
    """

    name: str
    choices: tuple[Any, ...]
    ordered: bool = True
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"parameter {self.name!r} has no choices")
        if len(set(map(_hashable, self.choices))) != len(self.choices):
            raise ValueError(f"parameter {self.name!r} repeats a choice")
        if len(set(self.storage_choices())) != len(self.choices):
            raise ValueError(f"parameter {self.name!r} has two choices that store alike: {self.choices}")
        bad = [c for c in self.storage_choices() if isinstance(c, str) and ("," in c or "=" in c)]
        if bad or "," in self.name or "=" in self.name:
            # a point's key is "name=value,..." and identifies it in storage: keep it unambiguous
            raise ValueError(f"parameter {self.name!r}: names and text choices may not hold ',' or '=': {bad}")

    def index(self, value: Any) -> int:
        """Position of ``value`` among the choices (tuples and lists compare equal)."""
        key = _hashable(value)
        for i, c in enumerate(self.choices):
            if _hashable(c) == key:
                return i
        raise ValueError(f"{value!r} is not a choice of {self.name!r}: {list(self.choices)}")

    def storage_value(self, value: Any) -> bool | int | float | str:
        """A primitive for Optuna storage: tuples become ``"2x1"``."""
        if isinstance(value, (tuple, list)):
            return "x".join(str(v) for v in value)
        return value

    def storage_choices(self) -> tuple[bool | int | float | str, ...]:
        return tuple(self.storage_value(c) for c in self.choices)

    def from_storage(self, value: Any) -> Any:
        return self.choices[self.storage_choices().index(value)]


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def categorical(name: str, choices: Iterable[Any], doc: str = "") -> Param:
    """Unordered choices (raster order, a layout, an algorithm)."""
    return Param(name, tuple(_hashable(c) for c in choices), ordered=False, doc=doc)


def ordinal(name: str, choices: Iterable[Any], doc: str = "") -> Param:
    """Ordered choices, kept in the order given (tile sizes, stage counts)."""
    return Param(name, tuple(_hashable(c) for c in choices), ordered=True, doc=doc)


def int_range(name: str, low: int, high: int, step: int = 1, doc: str = "") -> Param:
    """Integers ``low, low + step, ..., high`` (inclusive)."""
    return ordinal(name, range(low, high + 1, step), doc=doc)


def power_of_two(name: str, low: int, high: int, doc: str = "") -> Param:
    """Powers of two from ``low`` to ``high`` inclusive, e.g. 16, 32, ..., 256."""
    if low < 1 or high < low or low & (low - 1) or high & (high - 1):
        raise ValueError(f"{name}: bounds must be powers of two, low <= high")
    return ordinal(name, [1 << e for e in range(low.bit_length() - 1, high.bit_length())], doc=doc)


def boolean(name: str, doc: str = "") -> Param:
    return ordinal(name, (False, True), doc=doc)


def tuples(name: str, choices: Iterable[Sequence[Any]], doc: str = "") -> Param:
    """Tuple-valued choices, such as cluster shapes ``(1, 2)``; ordered by product."""
    items = sorted((tuple(c) for c in choices), key=lambda t: (math.prod(t), t))
    return Param(name, tuple(items), ordered=True, doc=doc)


@dataclass(frozen=True)
class Context:
    """What feasibility depends on besides the point itself."""

    hardware: Hardware | None = None
    problem: Problem | None = None
    # what the compiler said about the space's points on this hardware (an evotune.compiled.CompiledTable):
    # estimates then take registers, shared memory and stages from the binaries; feasibility ignores it
    compiled: Any = field(default=None, compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str]:
        return (
            self.hardware.name if self.hardware else "-",
            self.problem.key if self.problem else "-",
        )


Predicate = Callable[[Point, Context], bool]


@dataclass(frozen=True)
class Constraint:
    """A named rule. ``message`` is formatted with the point's values when it prunes.

    ``hardware`` marks limits of the chip (shared memory, cluster size, arch
    features) as opposed to rules of the kernel family itself.
    """

    name: str
    predicate: Predicate
    message: str
    hardware: bool = False

    def reason(self, point: Point, ctx: Context) -> str | None:
        if self.predicate(point, ctx):
            return None
        try:
            text = self.message.format(**point, ctx=ctx)
        except (KeyError, IndexError, AttributeError):
            text = self.message
        return f"{self.name}: {text}"


def deferred(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported on first call: keeps GPU-only imports (triton, cutlass) out of CPU runs."""
    import importlib

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


def constraint(name: str, predicate: Predicate, message: str) -> Constraint:
    """A rule of the kernel family (divisibility, a knob that needs another)."""
    return Constraint(name, predicate, message, hardware=False)


def hardware_limit(name: str, predicate: Predicate, message: str) -> Constraint:
    """A limit of the chip, checked before anything is compiled."""
    return Constraint(name, predicate, message, hardware=True)


@dataclass(frozen=True)
class Needs:
    """What a space's compiler needs on this machine: importable ``modules`` (its DSL), ``programs`` on
    ``PATH`` (its compiler), and what ``check()`` finds missing otherwise (in words; e.g. headers that an
    environment variable may point to instead of a module). Checked before anything is compiled, so a machine
    without them is told so once instead of failing every point."""

    modules: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    check: Callable[[], list[str]] | None = None

    def missing(self) -> list[str]:
        """What of it this machine lacks, in words (empty when nothing)."""
        out = []
        for module in self.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # its parent package is missing
                found = False
            if not found:
                out.append(f"Python module {module}")
        out += [f"program {p} (not on PATH)" for p in self.programs if shutil.which(p) is None]
        return out + (self.check() if self.check is not None else [])


@dataclass
class SearchSpace:
    """Parameters, constraints and (for real kernels) how to build, run and check them.

    ``build(point, problem)`` returns a compiled kernel, ``run(kernel, inputs)``
    launches it and ``reference(problem, inputs)`` gives the expected output;
    they are optional so that recorded landscapes and CPU tests need no GPU.

    For the CPU oracle (``oracle.kind = "cpu"``, :mod:`evotune.evaluation.cpu`)
    ``build(point, problem)`` is all that is needed: it returns a callable
    ``fn(*inputs) -> output`` on the numpy inputs of the problem's workload,
    which checks the output: for a GEMM ``fn(a, b) -> c`` on float64 arrays,
    ``a`` of shape (m, k) and ``b`` of shape (k, n), and ``c`` is checked
    against ``a @ b`` (relative Frobenius error at most
    ``evotune.workloads.gemm.CPU_TOLERANCE``, 1e-9, else the point is
    ``wrong_result``). Both run in a worker process that loads the space again
    from ``source``; an exception in ``build`` is a ``compile_error``, one in
    ``fn`` a ``runtime_error``, and a crash or a hang fails only that point.
    ``named`` maps a label to a configuration a user would otherwise deploy (a
    hand-picked one): on a GPU it is built, verified and timed beside the
    workload's baselines in every run. ``baselines(problem)`` adds the space's
    own baselines, ``{label: fn}`` launched like the workload's (with an optional
    ``fn.prepare``): another kernel a user would otherwise deploy for the problem,
    such as a configuration of another space.
    ``estimate(point, ctx)`` returns a predicted time (lower is better) from the
    hardware model; seeding ranks points by it.
    On a GPU, ``precompile(point, problem)`` fills the space's on-disk cache
    without launching (True when it was there), so that a pool of compile
    processes works ahead of the GPU worker, whose ``build`` then loads it;
    ``preload`` names the modules (its compiler) that the GPU worker and the
    compile processes import once, in the server they fork from.
    ``cute_hopper_gemm`` sets both.
    ``compiled_params`` and ``built`` tell a search which points share a kernel
    and which kernels are built already (:mod:`evotune.strategies.kernels`).
    """

    name: str
    params: list[Param]
    constraints: list[Constraint] = field(default_factory=list)
    description: str = ""
    estimate: Callable[[Point, Context], float] | None = None
    default_problem: Problem | None = None
    build: Callable[..., Any] | None = None
    precompile: Callable[..., Any] | None = None  # fills an on-disk cache without launching (compile pool)
    # what its compiler needs on this machine, checked before any point is compiled
    needs: Needs = field(default_factory=Needs)
    # modules its GPU worker and compile processes import (its compiler): imported once, in the process they
    # all fork from (evotune.evaluation.processes), not in each of them
    preload: tuple[str, ...] = ()
    # the parameters the compiler sees; the others are launch arguments of a built kernel, free to vary once it
    # is built (evotune.strategies.kernels). Empty: every parameter is compiled into the kernel.
    compiled_params: tuple[str, ...] = ()
    # (point, problem) -> whether that point's kernel is in the on-disk cache already (built by an earlier run
    # or problem), so that a search counts it as free
    built: Callable[..., bool] | None = None
    # compile for any GPU of the table with no GPU present: (point, problem, hardware) -> resource use
    compile_only: Callable[..., Any] | None = None
    run: Callable[..., Any] | None = None
    reference: Callable[..., Any] | None = None
    make_inputs: Callable[..., Any] | None = None
    # configurations worth naming (a library default, a hand-picked deployment): timed beside the baselines
    named: dict[str, Point] = field(default_factory=dict)
    baselines: Callable[..., Any] | None = None  # (problem) -> {label: fn}, timed beside the workload's
    workload: str = "gemm"  # the problem kind it serves (evotune.workloads); the runner refuses any other
    source: str = ""  # how plugins.load_space found it (a name or a path), so a worker process can load it too
    _feasible: dict[tuple[str, str], FeasibleSet] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"space {self.name!r} repeats a parameter name")
        self._by_name = {p.name: p for p in self.params}
        for point in self.named.values():
            self.validate(point)

    # -- basic facts -----------------------------------------------------
    @property
    def size(self) -> int:
        return math.prod(len(p.choices) for p in self.params)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        return self._by_name[name]

    def key(self, point: Point) -> str:
        """Canonical text for a point: stable across runs, used for de-duplication."""
        return ",".join(f"{p.name}={p.storage_value(point[p.name])}" for p in self.params)

    # -- encoding --------------------------------------------------------
    def encode(self, point: Point) -> tuple[int, ...]:
        return tuple(p.index(point[p.name]) for p in self.params)

    def decode(self, code: Sequence[int]) -> Point:
        return {p.name: p.choices[int(i)] for p, i in zip(self.params, code, strict=True)}

    def to_storage(self, point: Point) -> dict[str, bool | int | float | str]:
        return {p.name: p.storage_value(point[p.name]) for p in self.params}

    def from_storage(self, params: dict[str, Any]) -> Point:
        return {p.name: p.from_storage(params[p.name]) for p in self.params}

    def validate(self, point: Point) -> None:
        """Raise ValueError unless ``point`` names every parameter with a valid choice."""
        missing = [n for n in self.names if n not in point]
        extra = [n for n in point if n not in self._by_name]
        if missing or extra:
            raise ValueError(f"point {point} for space {self.name!r}: missing {missing}, unknown {extra}")
        self.encode(point)

    # -- feasibility -----------------------------------------------------
    def check(self, point: Point, ctx: Context) -> str | None:
        """The first reason ``point`` is pruned in ``ctx``, or None if it is feasible."""
        for c in self.constraints:
            reason = c.reason(point, ctx)
            if reason is not None:
                return reason
        return None

    def points(self) -> Iterator[Point]:
        """Every point of the full product, feasible or not, in a stable order."""
        if self.size > MAX_ENUMERATION:
            raise ValueError(f"space {self.name!r} has {self.size} points, too many to enumerate")
        names = self.names
        for values in itertools.product(*(p.choices for p in self.params)):
            yield dict(zip(names, values, strict=True))

    def preset_feasible(self, feasible: FeasibleSet) -> None:
        """Use ``feasible`` in every context: for spaces whose feasibility is fixed by data."""
        self._feasible[("*", "*")] = feasible

    def feasible(self, ctx: Context) -> FeasibleSet:
        """All feasible points for ``ctx``, enumerated once and cached."""
        cached = self._feasible.get(("*", "*")) or self._feasible.get(ctx.key)
        if cached is None:
            cached = FeasibleSet.build(self, ctx)
            self._feasible[ctx.key] = cached
        return cached


# FeasibleSet lives in evotune/feasible.py; it is part of this module's interface too
from evotune.feasible import FeasibleSet  # noqa: E402

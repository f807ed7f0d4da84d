"""Search spaces: parameters and named constraints together, enumeration, encoding and repair.

The parameter kinds, points, contexts and constraints are declared in :mod:`evotune.core.params` and
are importable from here too; :class:`FeasibleSet` (:mod:`evotune.core.feasible`) likewise.

A space is declared once and stays static; what is feasible depends on a
:class:`Context` (the GPU and the problem), so the same space prunes
differently on an H100 and a B200, or for bf16 and int8.

Example::

    from evotune.core.space import SearchSpace, ordinal, categorical, power_of_two, constraint

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

import importlib.machinery
import importlib.util
import itertools
import math
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from evotune.core.feasible import FeasibleSet
from evotune.core.params import (
    Constraint,
    Context,
    Param,
    Point,
    Predicate,
    SpacePoint,
    Stored,
    boolean,
    categorical,
    constraint,
    deferred,
    hardware_limit,
    int_range,
    ordinal,
    power_of_two,
    tuples,
)
from evotune.core.problem import Problem

# Enumerating more points than this would take minutes of Python predicates;
# every space evotune ships is far below it.
MAX_ENUMERATION = 5_000_000


def findable(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing it or, where the files say, its parent
    packages: ``importlib.util.find_spec("cutlass.cute")`` imports ``cutlass`` (CuTe DSL: seconds), and the
    tuner process that checks a space's needs never uses its compiler."""
    if module in sys.modules:
        return True
    top, *rest = module.split(".")
    try:
        name, spec = top, importlib.util.find_spec(top)  # a top-level name is found without importing anything
        if spec is None:
            return False
        for part in rest:  # each submodule among its package's files
            name = f"{name}.{part}"
            locations = spec.submodule_search_locations if spec is not None else None
            spec = importlib.machinery.PathFinder.find_spec(name, list(locations)) if locations else None
        # not among the package's files (made by its __init__, or by a finder of its own): import the parents
        return spec is not None or importlib.util.find_spec(module) is not None
    except Exception:  # a parent package is missing, or fails to import: neither can the module
        return False


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
        out = [f"Python module {module}" for module in self.modules if not findable(module)]
        out += [f"program {p} (not on PATH)" for p in self.programs if shutil.which(p) is None]
        return out + (self.check() if self.check is not None else [])


@dataclass
class SearchSpace:
    """Parameters, constraints and (for real kernels) how to build them.

    ``build(point, problem)`` returns a compiled kernel; it is optional so that
    recorded landscapes need no compiler. On a GPU the kernel is launched as
    ``kernel(*inputs)`` (or on what its ``prepare(inputs)`` returns:
    :func:`evotune.core.problem.call_args`) on the inputs of the problem's
    workload (:class:`evotune.core.problem.Workload`), which also checks the
    output and gives the library baselines.

    For the CPU oracle (``oracle.kind = "cpu"``, :mod:`evotune.measurement.cpu`)
    ``build(point, problem)`` is all that is needed: it returns a callable
    ``fn(*inputs) -> output`` on the numpy inputs of the problem's workload,
    which checks the output: for a GEMM ``fn(a, b) -> c`` on float64 arrays,
    ``a`` of shape (m, k) and ``b`` of shape (k, n), and ``c`` is checked
    against ``a @ b`` (relative Frobenius error at most
    ``evotune.measurement.workloads.gemm.CPU_TOLERANCE``, 1e-9, else the point is
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
    and which kernels are built already (:mod:`evotune.search.compile_cost`).
    """

    name: str
    params: list[Param]
    constraints: list[Constraint] = field(default_factory=list)
    description: str = ""
    estimate: Callable[[SpacePoint, Context], float] | None = None
    default_problem: Problem | None = None
    build: Callable[..., Any] | None = None
    precompile: Callable[..., Any] | None = None  # fills an on-disk cache without launching (compile pool)
    # what its compiler needs on this machine, checked before any point is compiled
    needs: Needs = field(default_factory=Needs)
    # modules its GPU worker and compile processes import (its compiler): imported once, in the process they
    # all fork from (evotune.measurement.processes), not in each of them
    preload: tuple[str, ...] = ()
    # the parameters the compiler sees; the others are launch arguments of a built kernel, free to vary once it
    # is built (evotune.search.compile_cost). Empty: every parameter is compiled into the kernel.
    compiled_params: tuple[str, ...] = ()
    # (point, problem) -> whether that point's kernel is in the on-disk cache already (built by an earlier run
    # or problem), so that a search counts it as free
    built: Callable[..., bool] | None = None
    # compile for any GPU of the table with no GPU present: (point, problem, hardware) -> resource use
    compile_only: Callable[..., Any] | None = None
    # configurations worth naming (a library default, a hand-picked deployment): timed beside the baselines
    named: dict[str, SpacePoint] = field(default_factory=dict)
    baselines: Callable[..., Any] | None = None  # (problem) -> {label: fn}, timed beside the workload's
    workload: str = "gemm"  # the problem kind it serves (evotune.core.problem); the runner refuses any other
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

    def to_storage(self, point: Point) -> dict[str, Stored]:
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


__all__ = [
    "MAX_ENUMERATION", "Constraint", "Context", "FeasibleSet", "Needs", "Param", "Point", "Predicate",
    "SearchSpace", "boolean", "categorical", "constraint", "deferred", "hardware_limit", "int_range", "ordinal",
    "power_of_two", "tuples",
]

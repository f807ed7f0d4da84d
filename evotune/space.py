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

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

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
    ``estimate(point, ctx)`` returns a predicted time (lower is better) from the
    hardware model; seeding ranks points by it.
    """

    name: str
    params: list[Param]
    constraints: list[Constraint] = field(default_factory=list)
    description: str = ""
    estimate: Callable[[Point, Context], float] | None = None
    default_problem: Problem | None = None
    build: Callable[..., Any] | None = None
    precompile: Callable[..., Any] | None = None  # fills an on-disk cache without launching (compile pool)
    # compile for any GPU of the table with no GPU present: (point, problem, hardware) -> resource use
    compile_only: Callable[..., Any] | None = None
    run: Callable[..., Any] | None = None
    reference: Callable[..., Any] | None = None
    make_inputs: Callable[..., Any] | None = None
    workload: str = "gemm"  # the problem kind it serves (evotune.workloads); the runner refuses any other
    source: str = ""  # how plugins.load_space found it (a name or a path), so a worker process can load it too
    _feasible: dict[tuple[str, str], FeasibleSet] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"space {self.name!r} repeats a parameter name")
        self._by_name = {p.name: p for p in self.params}

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


class _Unset(BaseException):
    """A predicate read a parameter that the enumeration has not set yet. Not an ``Exception``, so that a
    predicate's own ``except Exception`` cannot swallow it and decide on half a point."""


class _Partial(dict):
    """A point whose parameters from ``depth`` on are unset: reading one of them raises :class:`_Unset`.

    A predicate that reads an unset parameter (``p["tile_m"]``, ``p.get``, ``in``), or the whole point
    (iteration, ``len``, ``keys``, ``values``, ``items``) before it is complete, raises :class:`_Unset`.
    """

    def __init__(self, names: Sequence[str]):
        super().__init__()
        self._position = {n: i for i, n in enumerate(names)}
        self.depth = 0

    def _unset(self, key: str) -> bool:
        position = self._position.get(key)
        return position is not None and position >= self.depth

    def __missing__(self, key: str) -> Any:
        if self._unset(key):
            raise _Unset(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if self._unset(key):
            raise _Unset(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str) and self._unset(key):
            raise _Unset(key)
        return super().__contains__(key)

    # A predicate that looks at the whole point (sum(p.values()), len(p), {**p}) waits for all of it.
    def _whole(self) -> None:
        if self.depth < len(self._position):
            raise _Unset("*")

    def __iter__(self) -> Iterator[str]:
        self._whole()
        return super().__iter__()

    def __len__(self) -> int:
        self._whole()
        return super().__len__()

    def keys(self) -> Any:
        self._whole()
        return super().keys()

    def values(self) -> Any:
        self._whole()
        return super().values()

    def items(self) -> Any:
        self._whole()
        return super().items()


class FeasibleSet:
    """The feasible points of a space in one context, with fast nearest-point repair.

    Points are rows of an integer code matrix; distance between two points is
    the sum over parameters of the normalised index step (ordered parameters)
    or 0/1 (unordered ones).
    """

    def __init__(self, space: SearchSpace, codes: np.ndarray, pruned: Counter[str],
                 reasons: dict[str, str] | None = None):
        self.space = space
        self.codes = codes
        self.pruned = pruned  # constraint name -> points it pruned
        self.reasons = reasons or {}  # constraint name -> the full reason for one pruned point
        self._row = {tuple(int(v) for v in c): i for i, c in enumerate(codes)}
        sizes = np.array([max(len(p.choices) - 1, 1) for p in space.params], dtype=float)
        self._scale = 1.0 / sizes
        self._ordered = np.array([p.ordered for p in space.params], dtype=bool)

    @classmethod
    def build(cls, space: SearchSpace, ctx: Context) -> FeasibleSet:
        """Every feasible point, in the order of :meth:`SearchSpace.points`, with each pruned point counted
        under the first constraint (in declaration order) that rejects it.

        The product is walked one parameter at a time, and a constraint is tried as soon as every
        constraint before it has passed and its predicate can be answered from the parameters set so
        far (reading an unset one raises inside the predicate): a failing one prunes the whole subtree
        at once. A space whose later parameters are launch arguments multiplies its raw size without
        multiplying the work, as long as its compile-time rules come first.
        """
        params, names, constraints = space.params, space.names, space.constraints
        below = [math.prod(len(p.choices) for p in params[d:]) for d in range(len(params) + 1)]
        codes: list[tuple[int, ...]] = []
        pruned: Counter[str] = Counter()
        reasons: dict[str, str] = {}
        code: list[int] = []
        partial = _Partial(names)  # one point, set and unset in place as the walk goes down and up

        def visit(depth: int, passed: int) -> None:
            partial.depth = depth
            while passed < len(constraints):
                c = constraints[passed]
                try:
                    ok = c.predicate(partial, ctx)
                except _Unset:
                    break
                if not ok:
                    pruned[c.name] += below[depth]
                    if c.name not in reasons:  # the subtree's first point stands for it, as in a walk of every point
                        first = dict(dict.items(partial))
                        first.update({n: params[i].choices[0] for i, n in enumerate(names) if i >= depth})
                        reasons[c.name] = c.reason(first, ctx) or c.name
                    return
                passed += 1
            if depth == len(params):
                codes.append(tuple(code))
                return
            name, choices = names[depth], params[depth].choices
            for i, value in enumerate(choices):
                code.append(i)
                partial[name] = value
                visit(depth + 1, passed)
                partial.depth = depth
                code.pop()
            del partial[name]

        visit(0, 0)
        arr = np.array(codes, dtype=np.int32).reshape(len(codes), len(params))
        return cls(space, arr, pruned, reasons)

    @classmethod
    def from_codes(cls, space: SearchSpace, codes: Iterable[Sequence[int]]) -> FeasibleSet:
        """A set given directly, e.g. the points a recorded landscape holds."""
        arr = np.array(sorted(set(map(tuple, codes))), dtype=np.int32)
        return cls(space, arr.reshape(len(arr), len(space.params)), Counter())

    def __len__(self) -> int:
        return len(self.codes)

    def __contains__(self, point: Point) -> bool:
        try:
            return self.space.encode(point) in self._row
        except (ValueError, KeyError):
            return False

    def row(self, point: Point) -> int | None:
        try:
            return self._row.get(self.space.encode(point))
        except (ValueError, KeyError):
            return None

    def row_of(self, code: tuple[int, ...]) -> int | None:
        """The row of an encoded point, or None when it is not feasible."""
        return self._row.get(code)

    def point(self, row: int) -> Point:
        return self.space.decode(self.codes[row])

    def distances(self, code: Sequence[int]) -> np.ndarray:
        """Distance from ``code`` (possibly infeasible) to every feasible row."""
        diff = np.abs(self.codes - np.asarray(code, dtype=np.int32))
        step = np.where(self._ordered, diff * self._scale, (diff > 0).astype(float))
        return step.sum(axis=1)

    def nearest(self, code: Sequence[int], exclude: np.ndarray | None = None,
                rng: np.random.Generator | None = None) -> int | None:
        """Row of the nearest feasible point not masked by ``exclude``; ties broken by ``rng``."""
        d = self.distances(code)
        if exclude is not None:
            d = np.where(exclude, np.inf, d)
        best = d.min() if len(d) else np.inf
        if not np.isfinite(best):
            return None
        rows = np.flatnonzero(d == best)
        if rng is None or len(rows) == 1:
            return int(rows[0])
        return int(rng.choice(rows))

"""The feasible points of a search space in one context: enumeration with pruning, and nearest-point repair.

:meth:`FeasibleSet.build` walks the space's product one parameter at a time and prunes a whole subtree as
soon as a rule fails on the parameters set so far; ``SearchSpace.feasible(ctx)`` builds and caches one.

Example::

    fs = space.feasible(Context(get_hardware("H100"), problem))
    row = fs.nearest(space.encode(point))   # the closest feasible point to a (possibly infeasible) one
    fs.point(row)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from evotune.core.params import Constraint, Context, Param, Point


class Declared(Protocol):
    """What a feasible set reads of its space (a :class:`evotune.core.space.SearchSpace`): the parameters
    in order, the named constraints, and the encoding of a point as one choice index per parameter."""

    @property
    def params(self) -> Sequence[Param]: ...
    @property
    def names(self) -> list[str]: ...
    @property
    def constraints(self) -> Sequence[Constraint]: ...
    def encode(self, point: Point) -> tuple[int, ...]: ...
    def decode(self, code: Sequence[int]) -> Point: ...


class _Unset(BaseException):
    """A predicate read a parameter that the enumeration has not set yet. Not an ``Exception``, so that a
    predicate's own ``except Exception`` cannot swallow it and decide on half a point."""


class _Partial(dict[str, Any]):
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

    def __init__(self, space: Declared, codes: npt.NDArray[np.int32], pruned: Counter[str],
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
    def build(cls, space: Declared, ctx: Context) -> FeasibleSet:
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
    def from_codes(cls, space: Declared, codes: Iterable[Sequence[int]]) -> FeasibleSet:
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

    def distances(self, code: Sequence[int]) -> npt.NDArray[np.float64]:
        """Distance from ``code`` (possibly infeasible) to every feasible row."""
        diff = np.abs(self.codes - np.asarray(code, dtype=np.int32))
        step = np.where(self._ordered, diff * self._scale, (diff > 0).astype(float))
        # numpy types a sum along an axis as Any; this one is float64 already, so asarray copies nothing
        return np.asarray(step.sum(axis=1), dtype=np.float64)

    def nearest(self, code: Sequence[int], exclude: npt.NDArray[np.bool_] | None = None,
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

"""The configurations a tuned kernel may run with, as an evotune search space.

``triton.Config`` objects and evotune points are two views of one thing: a point
names every parameter of a :class:`~evotune.core.space.SearchSpace` (the kernel's
meta-parameters plus the launch options ``num_warps``, ``num_stages`` and, when
a list sets them, ``num_ctas`` and ``maxnreg``), and :meth:`Candidates.config`
turns it into the ``triton.Config`` the kernel is launched with.

Two ways in:

* ``configs=[triton.Config(...), ...]`` (:meth:`Candidates.from_configs`): a space
  whose parameters take the values the list holds, of which exactly the listed
  points are feasible (a config's own ``pre_hook`` is kept with it);
* ``space=SearchSpace(...)`` (:meth:`Candidates.from_space`): every feasible point
  of the space; its named constraints prune with their reasons, and a constraint
  may read the launch's arguments as ``ctx.args`` (:class:`LaunchContext`).

Example::

    cands = Candidates.from_configs("matmul", [triton.Config({"BLOCK": 32}, num_warps=4)])
    cands.points, cands.config(cands.points[0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evotune.core.space import Context, FeasibleSet, Param, Point, SearchSpace, categorical, ordinal

#: the launch options of ``triton.Config`` and their defaults; the rest of a point are meta-parameters
LAUNCH_OPTIONS: dict[str, Any] = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None}
#: launch options every space of configurations names (the others only when a list sets them)
ALWAYS = ("num_warps", "num_stages")


@dataclass(frozen=True)
class LaunchContext(Context):
    """A context whose constraints can read the launch: ``ctx.args`` maps each argument name to its value."""

    args: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _param(name: str, values: Sequence[Any]) -> Param:
    unique = list(dict.fromkeys(values))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in unique)
    return ordinal(name, sorted(unique)) if numeric else categorical(name, unique)


@dataclass
class Candidates:
    """A space of configurations and, for a list of them, the listed points and their ``triton.Config``."""

    space: SearchSpace
    listed: list[Point] | None = None  # None: every feasible point of the space
    originals: dict[str, Any] = field(default_factory=dict)  # point key -> the user's triton.Config

    @classmethod
    def from_configs(cls, name: str, configs: Sequence[Any]) -> Candidates:
        kwargs_names = list(dict.fromkeys(k for c in configs for k in c.kwargs))
        for c in configs:
            missing = [k for k in kwargs_names if k not in c.kwargs]
            if missing:
                raise ValueError(f"configs: {c} does not set {', '.join(missing)} (every config sets the same "
                                 "meta-parameters)")
        options = [o for o in LAUNCH_OPTIONS
                   if o in ALWAYS or any(getattr(c, o) != LAUNCH_OPTIONS[o] for c in configs)]
        rows = [{**c.kwargs, **{o: getattr(c, o) for o in options}} for c in configs]
        params = [_param(n, [r[n] for r in rows]) for n in [*kwargs_names, *options]]
        space = SearchSpace(name, params, description="the configurations listed to triton autotune")
        originals: dict[str, Any] = {}
        listed = []
        for row, c in zip(rows, configs, strict=True):
            key = space.key(row)
            if key not in originals:
                originals[key] = c
                listed.append(row)
        return cls(space, listed, originals)

    @classmethod
    def from_space(cls, space: SearchSpace) -> Candidates:
        return cls(space)

    @property
    def points(self) -> list[Point]:
        """The listed points (every feasible one of a space comes from :meth:`feasible`)."""
        return list(self.listed or [])

    def feasible(self, ctx: LaunchContext) -> FeasibleSet:
        """The points the space's constraints keep for this launch (a list: the listed points that pass them)."""
        if self.listed is None:
            return FeasibleSet.build(self.space, ctx)  # not the space's cache: it is keyed by hardware and problem
        kept = [p for p in self.listed if self.space.check(p, ctx) is None]
        return FeasibleSet.from_codes(self.space, [self.space.encode(p) for p in kept])

    def config(self, point: Point) -> Any:
        """The ``triton.Config`` of ``point``: the listed one when it was listed, else built from the point."""
        original = self.originals.get(self.space.key(point))
        if original is not None:
            return original
        import triton

        kwargs = {k: v for k, v in point.items() if k not in LAUNCH_OPTIONS}
        options = {o: point[o] for o in LAUNCH_OPTIONS if o in point}  # the others keep triton.Config's defaults
        return triton.Config(kwargs, **options)

    def describe(self, point: Point) -> dict[str, Any]:
        """The point as plain JSON values: meta-parameters, then the launch options."""
        return {k: self.space.param(k).storage_value(v) for k, v in point.items()}

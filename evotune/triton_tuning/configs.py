"""The configurations a tuned kernel may run with, as an evotune search space.

``triton.Config`` objects and evotune points are two views of one thing: a point
names every parameter of a :class:`~evotune.core.space.SearchSpace` (the kernel's
meta-parameters plus the launch options ``num_warps``, ``num_stages`` and, when
a list sets them, ``num_ctas``, ``maxnreg`` and ``ir_override``), and :meth:`Candidates.config`
turns it into the ``triton.Config`` the kernel is launched with.

A configuration is its values, as ``triton.Config`` compares them: its ``all_kwargs()`` and its
``pre_hook``. Two listed configurations that differ only in their ``pre_hook`` are told apart by a
``pre_hook`` parameter (each hook by its qualified name); :meth:`Candidates.find` answers the point of
any configuration equal to a candidate, so a ``prune_configs_by`` function may return new objects.

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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from evotune.core.space import Context, FeasibleSet, Param, Point, SearchSpace, categorical, ordinal

#: the launch options of ``triton.Config`` and their defaults; the rest of a point are meta-parameters
LAUNCH_OPTIONS: dict[str, Any] = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None, "ir_override": None}
#: the parameter that tells apart listed configurations equal but for their ``pre_hook``
PRE_HOOK = "pre_hook"
#: launch options every space of configurations names (the others only when a list sets them)
ALWAYS = ("num_warps", "num_stages")


class TritonConfig(Protocol):
    """What evotune reads of a ``triton.Config`` (Triton ships no type information): its meta-parameters, its
    ``pre_hook`` and every keyword it launches the kernel with; the launch options are read by name
    (:func:`launch_option`)."""

    kwargs: dict[str, Any]
    pre_hook: Callable[..., Any] | None
    num_warps: int

    def all_kwargs(self) -> dict[str, Any]:
        ...


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
    originals: dict[str, TritonConfig] = field(default_factory=dict)  # point key -> the user's triton.Config
    hook_labels: dict[int, str | None] = field(default_factory=dict)  # id(pre_hook) -> label (with a PRE_HOOK param)

    @classmethod
    def from_configs(cls, name: str, configs: Sequence[TritonConfig]) -> Candidates:
        kwargs_names = list(dict.fromkeys(k for c in configs for k in c.kwargs))
        for c in configs:
            missing = [k for k in kwargs_names if k not in c.kwargs]
            if missing:
                raise ValueError(f"configs: {c} does not set {', '.join(missing)} (every config sets the same "
                                 "meta-parameters)")
        options = [o for o in LAUNCH_OPTIONS if o not in kwargs_names
                   and (o in ALWAYS or any(launch_option(c, o) != LAUNCH_OPTIONS[o] for c in configs))]
        rows = [{**c.kwargs, **{o: launch_option(c, o) for o in options}} for c in configs]
        hooks = _hook_labels(configs, rows)
        if hooks:
            rows = [{**r, PRE_HOOK: hooks[id(c.pre_hook)]} for r, c in zip(rows, configs, strict=True)]
        names = [*kwargs_names, *options, *([PRE_HOOK] if hooks else [])]
        params = [_param(n, [r[n] for r in rows]) for n in names]
        space = SearchSpace(name, params, description="the configurations listed to triton autotune")
        originals: dict[str, TritonConfig] = {}
        listed = []
        for row, c in zip(rows, configs, strict=True):
            key = space.key(row)
            if key not in originals:
                originals[key] = c
                listed.append(row)
        return cls(space, listed, originals, hooks)

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

    def find(self, config: TritonConfig) -> Point | None:
        """The point of the candidate equal to ``config`` (its ``all_kwargs()`` and ``pre_hook``), or None (of a
        list: a listed one)."""
        names = set(self.space.names)
        if not set(config.kwargs) <= names:
            return None
        point = dict(config.kwargs)
        for o, default in LAUNCH_OPTIONS.items():
            if o in config.kwargs:  # a launch option given as a meta-parameter (Triton reads both the same)
                continue
            value = launch_option(config, o)
            if o in names:
                point[o] = value
            elif value != default:
                return None  # a launch option this space does not vary, set to another value
        if PRE_HOOK in names:
            point[PRE_HOOK] = self.hook_labels.get(id(config.pre_hook))
        try:
            self.space.validate(point)
        except ValueError:
            return None
        if self.listed is not None and self.space.key(point) not in self.originals:
            return None
        mine = self.config(point)
        same = mine.all_kwargs() == config.all_kwargs() and mine.pre_hook is config.pre_hook
        return point if same else None

    def config(self, point: Point) -> TritonConfig:
        """The ``triton.Config`` of ``point``: the listed one when it was listed, else built from the point."""
        original = self.originals.get(self.space.key(point))
        if original is not None:
            return original
        import triton

        kwargs = {k: v for k, v in point.items() if k not in LAUNCH_OPTIONS and k != PRE_HOOK}
        options = {o: point[o] for o in LAUNCH_OPTIONS if o in point}  # the others keep triton.Config's defaults
        built: TritonConfig = triton.Config(kwargs, **options)
        return built

    def stored_config(self, stored: dict[str, Any]) -> TritonConfig:
        """The configuration of a point as storage keeps it: its candidate, or, for a point this space does not
        hold (a configuration ``early_config_prune`` added elsewhere), a ``triton.Config`` of its values."""
        try:
            return self.config(self.space.from_storage(stored))
        except (KeyError, ValueError):
            import triton

            kwargs = {k: v for k, v in stored.items() if k not in LAUNCH_OPTIONS and k != PRE_HOOK}
            built: TritonConfig = triton.Config(kwargs, **{o: stored[o] for o in LAUNCH_OPTIONS if o in stored})
            return built

    def extended(self, name: str, configs: Sequence[TritonConfig]) -> Candidates:
        """These listed candidates and ``configs`` (those not among them), as one list."""
        listed = [self.config(p) for p in self.points]
        return Candidates.from_configs(name, [*listed, *[c for c in configs if self.find(c) is None]])

    def describe(self, point: Point) -> dict[str, Any]:
        """The point as plain JSON values: meta-parameters, then the launch options."""
        return {k: self.space.param(k).storage_value(v) for k, v in point.items()}


def launch_option(config: TritonConfig, name: str) -> Any:
    """A launch option of ``config`` (an older ``triton.Config`` lacks ``ir_override``: its default)."""
    return getattr(config, name, LAUNCH_OPTIONS[name])


def _hook_labels(configs: Sequence[TritonConfig], rows: list[Point]) -> dict[int, str | None]:
    """id(pre_hook) -> its label, when two configurations have the same values but different pre_hooks (else
    empty: the hooks tell nothing apart); no hook is labelled None, the others by their qualified name."""
    hooks: dict[str, set[int]] = {}
    for row, c in zip(rows, configs, strict=True):
        hooks.setdefault(repr(sorted(row.items(), key=str)), set()).add(id(c.pre_hook))
    if all(len(ids) == 1 for ids in hooks.values()):
        return {}
    labels: dict[int, str | None] = {}
    taken: set[str] = set()
    for c in configs:
        if id(c.pre_hook) in labels:
            continue
        if c.pre_hook is None:
            labels[id(None)] = None
            continue
        base = getattr(c.pre_hook, "__qualname__", type(c.pre_hook).__name__).replace(",", " ").replace("=", " ")
        label, i = base, 1
        while label in taken:
            i += 1
            label = f"{base}#{i}"
        taken.add(label)
        labels[id(c.pre_hook)] = label
    return labels

"""Which configurations of a key are built already: measured for another key that Triton compiles the same.

Triton specialises a kernel by its integer arguments only through their value class: 1, divisible by 16, or
neither (and its tensors by dtype), and not at all by an argument the kernel names in ``do_not_specialize``. A
configuration measured for one key is in Triton's on-disk cache for every key whose values fall in the same
classes (M = 16, 32 and 48 of one N, K share a binary; M = 1, 2 and 16 do not, unless M is not specialised), so a
search over a later key can count it as costing no compile (:mod:`evotune.search.compile_cost`).

A key's search leaves its build processes idle much of the time (they build its next proposals while the GPU times
the built ones); :func:`later_points` is what they build meanwhile for the keys tuned after it, so that a later
key that opens new tile sizes (the fused MoE's 32-row tiles from M = 48) finds many of them built.

Example::

    specialisation({"M": 48, "N": 4096, "a.dtype": "torch.float16"})   # ("M=16", "N=16", "a.dtype=torch.float16")
    specialisation({"M": 48, "N": 4096}, unspecialised=frozenset({"M"}))   # ("M=*", "N=16")
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from typing import Any

from optuna.trial import TrialState

from evotune.core.space import FeasibleSet, Point, SearchSpace
from evotune.triton_tuning.cache import DecisionStore

DIVISIBILITY = 16  # Triton's specialisation of an integer argument


def value_class(value: Any) -> str:
    """What Triton's specialisation keeps of one key value: ``1``, ``16`` (divisible by 16), ``-`` (neither) for an
    integer; any other value as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "1" if value == 1 else str(DIVISIBILITY) if value % DIVISIBILITY == 0 else "-"
    return str(value)


def not_specialised_on(fn: Any) -> frozenset[str]:
    """The arguments a jitted kernel is not specialised on (Triton's ``do_not_specialize``, by name)."""
    return frozenset(p.name for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False))


def specialisation(key: dict[str, Any], unspecialised: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The key as Triton's specialisation sees it: two keys with the same one share every compiled configuration.
    A value of ``unspecialised`` (arguments the kernel is not specialised on) is any value (``*``)."""
    return tuple(f"{name}={'*' if name in unspecialised else value_class(value)}" for name, value in key.items())


def built_points(cache: DecisionStore, key: dict[str, Any], space: SearchSpace,
                 unspecialised: frozenset[str] = frozenset()) -> frozenset[str]:
    """The points (``space.key``) measured for the other keys of ``cache``'s kernel that share ``key``'s
    specialisation (``unspecialised``: the arguments the kernel is not specialised on): built already, in the
    Triton cache every process of the host shares."""
    mine = specialisation(key, unspecialised)
    out: set[str] = set()
    for other, name, decision in cache.tuned():
        if other == key or list(other) != list(key) or specialisation(other, unspecialised) != mine:
            continue
        for t in cache.decided_trials(name, decision):
            if t.state != TrialState.COMPLETE:
                continue
            try:
                out.add(space.key(space.from_storage(t.params)))
            except (KeyError, ValueError):
                continue  # a parameter value this space no longer offers
    return frozenset(out)


def later_points(space: SearchSpace, current: FeasibleSet, later: Sequence[FeasibleSet],
                 built: Collection[str]) -> list[Point]:
    """The configurations of ``later`` keys' candidates (the keys tuned next, nearest first, of the current key's
    specialisation) not ``built``, in the order to build them while the current key is searched: first those the
    current key does not offer (a later key's new tile sizes, which no search has built), then the others. Each
    key's in one fixed pseudo-random order (a hash of the configuration), the same whichever key asks, so that the
    next key takes up the builds where this one's ended."""
    here = {space.key(current.point(r)) for r in range(len(current))}
    seen = set(built)
    first: list[Point] = []
    rest: list[Point] = []
    for fs in later:
        points = sorted((fs.point(r) for r in range(len(fs))), key=lambda p: zlib.crc32(space.key(p).encode()))
        for point in points:
            key = space.key(point)
            if key in seen:
                continue
            seen.add(key)
            (rest if key in here else first).append(point)
    return first + rest

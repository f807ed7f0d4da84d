"""Keys near a new one: how far two keys are, the nearest tuned key, and the trials of others as sources.

Two keys of one kernel are compared value by value (the key's argument values,
then the argument dtypes): ``|log2(a / b)|`` for two positive numbers, ``MISMATCH``
for any other pair that differs. Keys with other names are not comparable. A new key's sources are the tuned keys
within ``NEAR`` of the nearest: a farther key's fastest point is a worse winner to measure
than the nearer keys' (at M = 256 of an M x 4096 x 4096 GEMM, those of M = 16 and 32
reach 0.2-0.3 of the optimum), and its trials say less about the new key's launches.

Example::

    key_distance({"M": 64, "a.dtype": "float16"}, {"M": 256, "a.dtype": "float16"})   # 2.0
"""

from __future__ import annotations

import math
from typing import Any

from optuna.trial import TrialState

from evotune.core.space import SearchSpace
from evotune.search import launch
from evotune.search.prior import MAX_DISTANCE, TAU, Source
from evotune.search.transfer import MISMATCH
from evotune.triton_tuning.cache import Decision, DecisionStore

#: sources further than the nearest by more than this are left out: they weigh less than exp(-2) of its weight
#: in the prior (TAU), yet each would still hand ``default`` its fastest point as a transferred winner, at the same
#: turn as the nearest source's, and train the launch model as much as the nearest (docs/STRATEGY_DESIGN.md)
NEAR = 2 * TAU


def key_distance(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """How far two keys are; None when they do not name the same fields."""
    if list(a) != list(b):
        return None
    total = 0.0
    for name in a:
        x, y = a[name], b[name]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (x, y))
        if numeric:
            total += abs(math.log2(float(x) / float(y)))
        elif x != y:
            total += MISMATCH
    return total


def nearest_tuned(cache: DecisionStore, key: dict[str, Any]) -> tuple[dict[str, Any], Decision] | None:
    """The tuned key nearest to ``key`` (ties: the first in key order) and its decision."""
    best: tuple[float, str, dict[str, Any], Decision] | None = None
    for other, _, decision in cache.tuned():
        d = key_distance(key, other)
        if d is None or other == key:
            continue
        text = repr(sorted(other.items(), key=str))
        if best is None or (d, text) < (best[0], best[1]):
            best = (d, text, other, decision)
    return None if best is None else (best[2], best[3])


def sources(cache: DecisionStore, key: dict[str, Any], space: SearchSpace, sms: int | None = None) -> list[Source]:
    """The measured trials of the other tuned keys within MAX_DISTANCE and within NEAR of the nearest such key,
    one source each, nearest first; with their launch features (on a GPU of ``sms`` multiprocessors) when every
    trial kept its program count."""
    out = []
    for other, name, decision in cache.tuned():
        d = key_distance(key, other)
        if d is None or other == key or d > MAX_DISTANCE:
            continue
        results, programs = [], []
        for t in cache.decided_trials(name, decision):
            try:
                point = space.from_storage(t.params)
            except (KeyError, ValueError):
                continue  # a parameter value this space no longer offers
            results.append((point, t.value if t.state == TrialState.COMPLETE else None))
            programs.append(t.user_attrs.get("programs"))
        if results:
            counts = [p for p in programs if isinstance(p, int)]
            feats = tuple(launch.features(p, sms) for p in counts) if len(counts) == len(programs) else None
            out.append(Source(f"key:{name.removeprefix(cache.kernel.prefix)}", tuple(results), d, feats))
    out.sort(key=lambda s: s.distance)
    return [s for s in out if s.distance <= out[0].distance + NEAR + 1e-9]

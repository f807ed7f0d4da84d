"""The candidates of one key, before anything is timed: the space's named constraints, then ``prune_configs_by``.

Constraints prune first, each point counted under the first one that rejects it, with its reason (logged on
``evotune.autotune``); then, as ``triton.autotune`` does, ``early_config_prune(configs, named_args, **kwargs)``
keeps the configurations it returns and ``perf_model(**named_args, **kwargs, **config.all_kwargs())`` ranks
them, of which the ``top_k`` best are kept (a float <= 1: that share, at least one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evotune.autotune.configs import Candidates, LaunchContext
from evotune.core.space import FeasibleSet

log = logging.getLogger("evotune.autotune")


@dataclass(frozen=True)
class PruneBy:
    """``prune_configs_by`` of ``triton.autotune``, typed."""

    early_config_prune: Callable[..., Any] | None = None
    perf_model: Callable[..., Any] | None = None
    top_k: int | float = 1.0


def prune(candidates: Candidates, args: dict[str, Any], nargs: dict[str, Any], kwargs: dict[str, Any],
          by: PruneBy, name: str) -> FeasibleSet:
    """The feasible points of ``candidates`` for a launch with arguments ``args`` after every pruning."""
    space = candidates.space
    fs = candidates.feasible(LaunchContext(args=args))
    for reason, count in fs.pruned.most_common():
        log.info("%s: %d configurations pruned by %s", name, count, fs.reasons[reason])
    points = [fs.point(r) for r in range(len(fs))]
    if candidates.listed is not None:
        order = {space.key(p): i for i, p in enumerate(candidates.listed)}
        points.sort(key=lambda p: order[space.key(p)])
    configs = {space.key(p): candidates.config(p) for p in points}
    if by.early_config_prune:
        kept = by.early_config_prune(list(configs.values()), nargs, **kwargs)
        if not kept:
            raise ValueError("early_config_prune returned no configuration (it must return at least one)")
        ids = {id(c) for c in kept}
        points = [p for p in points if id(configs[space.key(p)]) in ids]
    if by.perf_model:
        top_k = by.top_k
        if isinstance(top_k, float) and top_k <= 1.0:
            top_k = max(1, int(len(points) * top_k))
        est = {space.key(p): by.perf_model(**nargs, **kwargs, **configs[space.key(p)].all_kwargs()) for p in points}
        points = sorted(points, key=lambda p: est[space.key(p)])[: int(top_k)]
    if len(points) < len(fs):
        log.info("%s: %d of %d configurations left by prune_configs_by", name, len(points), len(fs))
    return FeasibleSet.from_codes(space, [space.encode(p) for p in points])

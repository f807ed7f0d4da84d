"""The first points a strategy tries: ranked by the hardware model, or spread out.

``seeding = "hardware"`` ranks every fresh feasible point by the space's
``estimate`` (a predicted time from occupancy, tile waves and a roofline) and
takes the best half of the first population from the top of that ranking; the
other half stays diverse so that a wrong model cannot trap the search.
Without an estimate, or with ``seeding = "random"``, the whole first population
is a greedy max-min spread over a random candidate pool.

A strategy that weighs compile cost (a ``compile_cost`` above 0, in a space whose
launch arguments are free once a kernel is built) takes its first population
among the points of kernels already built, when there are enough of them: an
earlier problem's kernels are measured in a fraction of a second, where a new one
takes a minute of nvcc before the model has seen anything.
"""

from __future__ import annotations

import numpy as np

from evotune.search.state import StrategyState


def ranked_by_estimate(strategy: StrategyState) -> list[int]:
    """Fresh feasible rows, best predicted first (empty when the space has no estimate)."""
    space, fs = strategy.space, strategy.feasible
    if space.estimate is None:
        return []
    free = np.flatnonzero(~strategy.taken)
    scores = np.array([space.estimate(fs.point(int(r)), strategy.ctx) for r in free], dtype=float)
    return [int(free[i]) for i in np.argsort(scores, kind="stable")]


def spread_rows(strategy: StrategyState, n: int, pool: int = 40) -> list[int]:
    """``n`` fresh rows chosen greedily to be far from each other (max-min distance)."""
    fs, rng = strategy.feasible, strategy.rng
    if n <= 0:  # the ranked half took every row asked for (a first population one short of full)
        return []
    free = np.flatnonzero(~strategy.taken)
    if len(free) <= n:
        return [int(r) for r in free]
    cand = rng.choice(free, size=min(len(free), n * pool), replace=False)
    chosen = [int(cand[0])]
    mind = fs.distances(fs.codes[chosen[0]])[cand]
    while len(chosen) < n:
        i = int(np.argmax(mind))
        chosen.append(int(cand[i]))
        mind = np.minimum(mind, fs.distances(fs.codes[cand[i]])[cand])
    return chosen


def initial_rows(strategy: StrategyState, n: int) -> list[int]:
    taken_before = strategy.taken.copy()
    kernels = strategy.kernels
    if kernels is not None and strategy.compile_cost > 0:
        unbuilt = kernels.new(np.arange(len(strategy.feasible)))
        if (~unbuilt & ~taken_before).sum() >= n:
            strategy.taken[unbuilt] = True  # hidden while the first population is drawn
    rows: list[int] = []
    if strategy.seeding == "hardware":
        rows = ranked_by_estimate(strategy)[: (n + 1) // 2]
    strategy.taken[rows] = True  # so the spread half does not pick them again
    rows += spread_rows(strategy, n - len(rows))
    strategy.taken[:] = taken_before
    return rows

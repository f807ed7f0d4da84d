"""Strategies: peers behind one call shape (``ask(n)`` / ``tell(results)``), found by name.

Example::

    from evotune.search.strategies import make_strategy, strategy_names
    strategy_names()  # ['cmaes', 'default', 'exhaustive', 'ga', 'gp', 'nsga2', 'optuna-gp', 'qmc', 'random', 'tpe']
    s = make_strategy("tpe", space, space.feasible(ctx), seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from evotune.core.space import Context, FeasibleSet, Point, SearchSpace
from evotune.search.prior import Source
from evotune.search.strategies.base import Strategy, Told
from evotune.search.strategies.default import Default
from evotune.search.strategies.exhaustive import Exhaustive
from evotune.search.strategies.genetic import GeneticAlgorithm
from evotune.search.strategies.gp import GaussianProcess
from evotune.search.strategies.optuna_samplers import CMAES, NSGA2, QMC, TPE, OptunaGP
from evotune.search.strategies.random_search import RandomSearch

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (Default, GeneticAlgorithm, TPE, CMAES, NSGA2, GaussianProcess, OptunaGP, QMC, RandomSearch, Exhaustive)
}


def strategy_names() -> list[str]:
    return sorted(STRATEGIES)


def make_strategy(name: str, space: SearchSpace, feasible: FeasibleSet, *, seed: int = 0,
                  ctx: Context | None = None, sources: Sequence[Source] = (), launch: np.ndarray | None = None,
                  first: Sequence[Point] = (), **options: Any) -> Strategy:
    """Build a strategy by name with ``options`` (its :attr:`Strategy.Options` by name). Raises KeyError for an
    unknown name, OptionError (a ValueError) for a bad option.

    ``sources`` are related results (:class:`~evotune.search.prior.Source`) for the strategies
    that transfer (``default``); the others ignore them. ``launch``: the launch features of each feasible
    row (:mod:`evotune.search.launch`), read by the GP surrogate and the transfer prior; the others ignore it.
    ``first``: points every strategy proposes before its own choices (those that are feasible and not yet told).
    """
    if name not in STRATEGIES:
        raise KeyError(name)
    cls = STRATEGIES[name]
    return cls(space, feasible, cls.parse_options(options), seed=seed, ctx=ctx, sources=sources, launch=launch,
               first=first)


__all__ = ["STRATEGIES", "Source", "Strategy", "Told", "make_strategy", "strategy_names"]

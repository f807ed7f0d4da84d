"""Bayesian optimisation with a Gaussian process, in numpy, over the feasible points.

The space is discrete and enumerated, so the acquisition (expected
improvement) is maximised exactly over the fresh feasible points (a random
subset of them when there are very many) instead of by gradient ascent in a
relaxed continuous space. The GP models log-time with a Matérn-5/2 kernel on
the encoded points; its length-scales are picked by marginal likelihood
(:class:`evotune.search.surrogate.Surrogate`). Points handed out but not yet measured are
"constant liars" at the best value seen.

Optuna's own ``GPSampler`` is available as ``optuna-gp`` where torch is installed.

Example::

    s = make_strategy("gp", space, feasible, seed=0, startup=10, candidates=2000)
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Unpack

import numpy as np

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.strategies.base import Strategy, StrategyArgs
from evotune.search.strategies.options import StrategyOptions, option
from evotune.search.surrogate import COMPILE_COST, Surrogate

#: the runners-up of a proposal kept as :meth:`Strategy.ahead`'s ranking
AHEAD = 32


@dataclass(frozen=True, kw_only=True)
class SurrogateOptions(StrategyOptions):
    """The options of a search that ranks candidates by the GP's expected improvement."""

    startup: int = option(10, low=1)  # points before the GP is trusted
    noise: float = option(1e-3, low=1e-9, high=1.0)
    refit: int = option(10, low=1)  # results between length-scale fits
    relevance: bool = option(False)  # a length-scale per feature
    # a new kernel's cost in evaluations, for spaces with launch arguments (0: every point costs the same)
    compile_cost: float = option(COMPILE_COST, low=0.0)


@dataclass(frozen=True, kw_only=True)
class GPOptions(SurrogateOptions):
    candidates: int = option(2000, low=1)  # fresh random points scored per proposal


class SurrogateSearch(Strategy):
    """Expected improvement over the rows :meth:`candidates` gives, after ``startup`` first points."""

    options: SurrogateOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: SurrogateOptions,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options, **args)
        o = self.options
        self.model = Surrogate(self, o.noise, o.refit, relevance=o.relevance)

    @property
    def compile_cost(self) -> float:
        return self.options.compile_cost

    def _propose(self) -> int | None:
        if len(self.values) < self.options.startup:
            return self.startup_row(self.options.startup)
        return self.model_row()

    def model_row(self) -> int | None:
        """The candidate of highest expected improvement (a random fresh row when the GP cannot be fitted)."""
        free = np.flatnonzero(~self.taken)
        if not len(free):
            return None
        rows = self.candidates(free)
        ei = self.model.expected_improvement(rows)
        if ei is None:
            return self.random_fresh()
        cost = self.options.compile_cost
        if self.kernels is not None and cost:  # improvement per evaluation's worth of time, a compile counted in
            ei = ei / (1.0 + cost * self.kernels.new(rows))
        order = np.argsort(-ei, kind="stable")[: AHEAD + 1]
        self._ahead = [int(r) for r in rows[order[1:]]]
        return int(rows[int(order[0])])

    @abstractmethod
    def candidates(self, free: np.ndarray) -> np.ndarray:
        """The rows scored for one proposal, of the ``free`` ones."""

    def random_subset(self, free: np.ndarray, n: int) -> np.ndarray:
        return self.rng.choice(free, size=n, replace=False) if len(free) > n else free

    def fastest(self, n: int) -> list[int]:
        """The ``n`` fastest measured rows, fastest first."""
        return [r for _, r in sorted((v, r) for r, v in self.values.items() if v is not None)[:n]]


class GaussianProcess(SurrogateSearch):
    """Expected improvement over a random subset of the fresh points."""

    name = "gp"
    Options = GPOptions
    options: GPOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: GPOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or GPOptions(), **args)

    def candidates(self, free: np.ndarray) -> np.ndarray:
        """``candidates`` of the ``free`` rows at random."""
        return self.random_subset(free, self.options.candidates)

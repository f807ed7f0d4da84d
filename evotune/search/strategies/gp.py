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

from typing import Any

import numpy as np

from evotune.search.strategies.base import Option, Strategy
from evotune.search.surrogate import COMPILE_COST, Surrogate


class GaussianProcess(Strategy):
    """Expected improvement over a random subset of the fresh points; subclasses add candidates."""

    name = "gp"
    schema = {"startup": Option(10, int, 1), "candidates": Option(2000, int, 1),
              "noise": Option(1e-3, float, 1e-9, 1.0), "refit": Option(10, int, 1),
              "relevance": Option(False, bool), "compile_cost": Option(COMPILE_COST, float, 0.0)}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        o = self.options
        self.model = Surrogate(self, float(o["noise"]), int(o["refit"]), relevance=bool(o["relevance"]))

    def _propose(self) -> int | None:
        if len(self.values) < int(self.options["startup"]):
            return self.startup_row(int(self.options["startup"]))
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
        cost = float(self.options["compile_cost"])
        if self.kernels is not None and cost:  # improvement per evaluation's worth of time, a compile counted in
            ei = ei / (1.0 + cost * self.kernels.new(rows))
        return int(rows[int(np.argmax(ei))])

    def candidates(self, free: np.ndarray) -> np.ndarray:
        """The rows scored for one proposal: ``candidates`` of the ``free`` rows at random."""
        return self.random_subset(free, int(self.options["candidates"]))

    def random_subset(self, free: np.ndarray, n: int) -> np.ndarray:
        return self.rng.choice(free, size=n, replace=False) if len(free) > n else free

    def fastest(self, n: int) -> list[int]:
        """The ``n`` fastest measured rows, fastest first."""
        return [r for _, r in sorted((v, r) for r, v in self.values.items() if v is not None)[:n]]

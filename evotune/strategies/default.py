"""``default``: Bayesian optimisation that knows GPU kernels like aligned sizes.

Design (issue #5; the numbers are in ``benchmarks/RESULTS.md``):

1. **Start**: ``startup`` points, the first population of :meth:`Strategy.seed_rows`
   (half ranked by the hardware model with ``seeding = "hardware"``, the rest a
   greedy max-min spread over the space).
2. **Model**: a Gaussian process on standardised log-time (:class:`gp.Surrogate`):
   Matérn-5/2 on the encoded point, which carries *alignment* features (power of
   two, 2-adic valuation) beside each integer parameter's position, because
   divisibility, not magnitude, is what separates fast GPU configurations from
   slow neighbours. With ``relevance`` each feature gets its own length-scale by
   marginal likelihood, so parameters that do not matter stop diluting distances.
   Failed points count as twice the slowest time seen. Until ``shared`` results are
   in, and again once stalled (``stall_shared``), every other proposal is ranked by
   the same GP with one length-scale for all features instead, because per-feature
   length-scales fitted on a few dozen points can over-fit.
3. **Proposal**: the highest expected improvement among ``pool`` fresh random
   feasible points (global search), every fresh point one parameter away from
   the ``top`` best measured points (local search) and ``cross`` uniform-crossover
   children of two of the ``2 x top`` best (recombination, as a GA would breed them).
   Once ``patience`` results have brought no better time, a share ``local`` of the
   proposals instead takes the highest expected improvement among the fresh
   one-parameter neighbours of the best point only (two-parameter ones once those are
   all measured), so a stalled search cannot stop one or two parameters short of the
   optimum because the model is sure of it.

What the landscapes taught (tuning half of the shared landscapes, 10 seeds; see RESULTS.md):
the previous ``default``, the GA with half of its children screened by this GP, stalled on the
convolution landscapes, whose optima sit at powers of two that one-step mutation and an
index-based distance both miss; without the alignment features this strategy stalls there too.
A larger random pool (5000) made it greedier and worse, and 1000 did as well as 2000 in half the
time; a longer random start (20) was worse at budget 25 and no better later; one length-scale for
all features (``relevance = false``) stalled on convolution_A4000 (0.87 at 100 against 1.00);
crossover children lifted gemm_RTX_2080_Ti at 50-100 (0.91 / 0.99 against 0.91 / 0.98).
Without the ``local`` step the search stayed at 0.994 on pnpoly_RTX_2080_Ti up to budget 400 in 11
of 20 runs, one ``between_method`` away from the optimum. A local step in a quarter of all
proposals reached it by 200 (an eighth did not) but slowed bf16 64x65536x4096 on the H100 (median
114 evaluations to 0.99 over 20 seeds, against 88.5 without); taken only once stalled (``patience``
40, half of the proposals) it reached pnpoly's optimum by 200 and kept that H100 shape at 89.
A lower GP noise (1e-5) did not help.

Session 5 (all twelve shared landscapes, 20 seeds, then fresh seeds 100-119 to check; RESULTS.md):
stalled gemm runs sat two parameters from the optimum (MWG with SA, or MWG with VWM: each move
alone is slower), so the local step now looks two parameters away once the one-parameter
neighbours are used up, and starts after 30 results without progress instead of 40. On seeds
0-19 budget 100 rose from 0.973 to 0.983 (gmean of medians), but on fresh seeds 100-119 it fell
(0.967 against 0.987 with patience 40 and no shared length-scale), so that gain is not
established: medians over 20 runs are bimodal on several landscapes. One length-scale for every
other early proposal lifted gemm_RTX_3060_laptop at budget 25 from 0.76 to 0.83 (the plain
``ga`` has 0.81); doing so for all proposals, or for half of them throughout, cost
convolution_A4000 at 50 (0.90 against 0.98); averaging the two models' expected improvements,
or charging each extra length-scale a likelihood penalty (0.3 nats, or BIC), was worse on
convolution_A4000 too.

Session 7 (both seed sets, 20 runs each, gmean at 25 / 50 / 100 / 200): patience 40 with the shared
length-scale gave 0.862 / 0.925 / 0.974 / 0.992 on seeds 100-119 (shipped 0.862 / 0.925 / 0.967 /
0.998) and 0.880 / 0.942 / 0.987 / 1.000 on seeds 0-19 (shipped 0.880 / 0.942 / 0.983 / 1.000):
mixed, 30 kept. Ranking one- and two-parameter neighbours together in every stalled local step
(``wide = 1``) lifted budget 100 (0.992 on seeds 0-19, 0.976 on seeds 100-119), in half of them
(``wide = 0.5``) hardly (0.982, 0.971); both lost pnpoly_RTX_2080_Ti, whose optimum is one
parameter away, at 200 (0.989 and 0.987 on seeds 0-19, against the plain ``ga``'s 0.997), and
neither freed convolution_A4000 from its 0.809 plateau on seeds 100-119 by budget 100.
Ranking every other proposal with one length-scale again once stalled (``stall_shared``) gave
0.880 / 0.934 / 0.984 / 1.000 on seeds 0-19 and 0.862 / 0.925 / 0.973 / 0.997 on seeds 100-119,
at or above the plain ``ga`` on every landscape and budget 25-400 on seeds 0-19 and 45 of 45 H100
landscapes at 0.99 within 10% of their points; on by default since session 7.

Example::

    s = make_strategy("default", space, feasible, seed=0, pool=1000, top=5, cross=50)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evotune.strategies.base import Option
from evotune.strategies.gp import GaussianProcess, Surrogate


class Default(GaussianProcess):
    name = "default"
    schema = {
        "startup": Option(10, int, 1),  # points before the GP is trusted
        "pool": Option(1000, int, 1),  # fresh random points scored per proposal
        "top": Option(5, int, 0),  # best points whose one-parameter neighbours are scored too
        "cross": Option(50, int, 0),  # uniform-crossover children of two of the 2 x top best points, scored too
        "local": Option(0.5, float, 0.0, 1.0),  # share of proposals, once stalled, among the best's neighbours only
        "patience": Option(30, int, 0),  # results without a better time before the search counts as stalled
        "wide": Option(0.0, float, 0.0, 1.0),  # share of the stalled local steps that look two parameters away
        "relevance": Option(True, bool),  # a length-scale per feature
        "shared": Option(40, int, 0),  # until this many results, every other proposal uses one length-scale
        "stall_shared": Option(True, bool),  # once stalled, every other proposal uses one length-scale again
        "noise": Option(1e-3, float, 1e-9, 1.0),
        "refit": Option(10, int, 1),  # results between length-scale fits
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        o = self.options
        self._relevant = self.model
        self._shared = Surrogate(self, float(o["noise"]), int(o["refit"]), relevance=False)
        self._best: float | None = None
        self._improved_at = 0  # results told when the best time last improved
        self._proposals = 0

    def _propose(self) -> int | None:
        # Length-scales per feature fitted on a few dozen points can over-fit (gemm: 0.77 of the optimum at
        # budget 25 against 0.85 with one shared length-scale), yet they are what finds the convolution optima;
        # early on, and again once stalled (the per-feature model is then sure of its plateau), every other
        # proposal is ranked by the GP with one shared length-scale instead.
        self._proposals += 1
        o = self.options
        uniform = len(self.values) < int(o["shared"]) or (bool(o["stall_shared"]) and self._stalled())
        use_shared = uniform and self._proposals % 2 == 0 and bool(o["relevance"])
        self.model = self._shared if use_shared else self._relevant
        return super()._propose()

    def _stalled(self) -> bool:
        """Whether ``patience`` results have passed without a better time."""
        return len(self.values) - self._improved_at >= int(self.options["patience"])

    def candidates(self, free: np.ndarray) -> np.ndarray:
        o = self.options
        if self._stalled() and float(o["local"]) and self.rng.random() < float(o["local"]):
            # no draw when wide is 0, so that results for a seed stay as they were before this option
            wide = float(o["wide"]) > 0 and self.rng.random() < float(o["wide"])
            rows = self.neighbours(1, distance=2 if wide else 1)
            if not len(rows) and not wide:  # every one-parameter neighbour of the best is measured: look two away
                rows = self.neighbours(1, distance=2)
            if len(rows):
                return rows
        top = int(o["top"])
        return np.union1d(np.union1d(self.random_subset(free, int(o["pool"])), self.neighbours(top)),
                          self.children(int(o["cross"]), 2 * top))

    def _observe(self, row: int, value: float | None) -> None:
        if value is not None and (self._best is None or value < self._best):
            self._best, self._improved_at = value, len(self.values)

    def neighbours(self, top: int, distance: int = 1) -> np.ndarray:
        """Fresh rows that differ in 1 to ``distance`` parameters from one of the ``top`` fastest measured rows."""
        codes = self.feasible.codes
        found = []
        for r in self.fastest(top):
            differ = (codes != codes[r]).sum(1)
            found.append(np.flatnonzero((differ >= 1) & (differ <= distance) & ~self.taken))
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def children(self, n: int, top: int) -> np.ndarray:
        """The fresh feasible ones of ``n`` uniform-crossover children of two of the ``top`` fastest rows."""
        best = np.array(self.fastest(top), dtype=np.int64)
        if n == 0 or len(best) < 2:
            return np.zeros(0, dtype=np.int64)
        codes = self.feasible.codes
        pairs = best[self.rng.integers(len(best), size=(n, 2))]
        mask = self.rng.random((n, codes.shape[1])) < 0.5
        kids = np.where(mask, codes[pairs[:, 0]], codes[pairs[:, 1]])
        rows = {self.feasible.row_of(tuple(int(v) for v in k)) for k in kids}
        return np.array(sorted(r for r in rows if r is not None and not self.taken[r]), dtype=np.int64)

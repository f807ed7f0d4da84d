"""``default``: Bayesian optimisation that knows GPU kernels like aligned sizes.

The algorithm:

1. **Start**: ``startup`` points, the first population of :meth:`Strategy.seed_rows` (half ranked by the
   hardware model with ``seeding = "hardware"``, the rest a greedy max-min spread over the space).
2. **Model**: a Gaussian process on standardised log-time (:class:`~evotune.search.surrogate.Surrogate`):
   Matérn-5/2 on the encoded point, which carries *alignment* features (power of two, 2-adic valuation) beside
   each integer parameter's position, because divisibility, not magnitude, separates fast GPU configurations from
   slow neighbours. With ``relevance`` each feature gets its own length-scale by marginal likelihood. Failed points
   count as twice the slowest time seen. Given launch features (``launch=``: each point's program count against
   the SMs, :mod:`evotune.search.launch`), the GP and the transfer prior see those too.
3. **Two models in turn**: per-feature length-scales fitted on a few dozen points can over-fit. Until
   ``shared`` results are in, and again once stalled (``stall_shared``), every other proposal is ranked by the
   same GP with one length-scale for all features instead.
4. **Proposal**: the highest expected improvement among ``pool`` fresh random feasible points, every fresh point
   one parameter away from the ``top`` best measured points and ``cross`` uniform-crossover children of two of
   the ``2 x top`` best.
5. **Stalled local step**: once ``patience`` results have brought no better time, a share ``local`` of the
   proposals takes the highest expected improvement among the fresh one-parameter neighbours of the best point
   only (two-parameter ones once those are all measured).
6. **Transfer** (``sources`` given and ``transfer`` on): related results of the same space (other shapes, other
   GPUs; :mod:`evotune.search.prior`) make a prior over the feasible points, each source weighted by how well
   it ranks the told results (RGPE, :class:`evotune.search.ensemble.Transfer`, which also says whose turn each
   proposal is). The sources' turns measure their ``transfer_first`` winners, then the GP models what the
   weighted prior (scaled by least squares) leaves unexplained, the prior's best-ranked fresh points join the
   candidates, and the stalled local step comes after TRUSTED_PATIENCE results without a better time and takes
   every such turn: the winners are close to the optimum, and the last percent is usually one or two
   parameters away. The other turns are made by an inner plain ``default`` told only their results.
7. **Compile cost**: in a space whose launch arguments are free once a kernel is built
   (``SearchSpace.compiled_params``), the expected improvement of a point whose kernel is neither built nor
   handed out is divided by ``1 + compile_cost`` (:mod:`evotune.search.compile_cost`).

Options (defaults): ``startup`` 10, ``pool`` 1000, ``top`` 5, ``cross`` 50, ``local`` 0.5, ``patience`` 30,
``relevance`` true, ``shared`` 40, ``stall_shared`` true, ``noise`` 1e-3, ``refit`` 10 (results between length-scale
fits), ``transfer`` true, ``transfer_first`` 4, ``lone_patience`` 1, ``compile_cost`` 20.
The measurements behind each choice are in ``docs/STRATEGY_DESIGN.md``.

Example::

    s = make_strategy("default", space, feasible, seed=0, pool=1000, top=5, cross=50)
    (point,) = s.ask(1)
    s.tell([(point, 0.42)])   # its time in ms; None for a failed point
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Unpack

import numpy as np

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.ensemble import MODEL, Transfer
from evotune.search.prior import Prior
from evotune.search.strategies.base import StrategyArgs
from evotune.search.strategies.gp import AHEAD, SurrogateOptions, SurrogateSearch
from evotune.search.strategies.options import option
from evotune.search.surrogate import Surrogate

#: with the sources in use, their best-ranked fresh rows join every proposal's candidates
PRIOR_CANDIDATES = 20
#: with the sources in use, results without a better time before the stalled local step (then every proposal):
#: their winners are near the optimum
TRUSTED_PATIENCE = 3
#: rows whose parameter differences to every feasible row are kept (Default._differing)
DIFFER_CACHE = 16


@dataclass(frozen=True, kw_only=True)
class DefaultOptions(SurrogateOptions):
    pool: int = option(1000, low=1)  # fresh random points scored per proposal
    top: int = option(5, low=0)  # best points whose one-parameter neighbours are scored too
    cross: int = option(50, low=0)  # uniform-crossover children of two of the 2 x top best points, scored too
    local: float = option(0.5, low=0.0, high=1.0)  # share of proposals, once stalled, among the best's neighbours only
    patience: int = option(30, low=0)  # results without a better time before the search counts as stalled
    relevance: bool = option(True)  # a length-scale per feature
    shared: int = option(40, low=0)  # until this many results, every other proposal uses one length-scale
    stall_shared: bool = option(True)  # once stalled, every other proposal uses one length-scale again
    transfer: bool = option(True)  # learn from related results (sources) when there are any
    transfer_first: int = option(4, low=0)  # the sources' winners measured
    lone_patience: int = option(1, low=0)  # a lone source's own results before it is dropped (0: never)


class Default(SurrogateSearch):
    name = "default"
    Options = DefaultOptions
    options: DefaultOptions
    transfers = True

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: DefaultOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or DefaultOptions(), **args)
        o = self.options
        self._relevant = self.model
        self._shared = Surrogate(self, o.noise, o.refit, relevance=False)
        self._best: float | None = None
        self._improved_at = 0  # results told when the best time last improved
        self._proposals = 0
        self._differ: dict[int, np.ndarray] = {}  # row -> parameters each feasible row differs in (_differing)
        self.prior = (Prior(self, self.sources) or None) if self.sources and o.transfer else None
        self.transfer: Transfer | None = None
        if self.prior is not None:
            self.transfer = Transfer(self, self.prior, self._plain, o.transfer_first, o.lone_patience, o.startup)
            self._relevant.prior = self._shared.prior = self.prior.mean

    def _plain(self) -> Default:
        """Plain ``default`` with these options, for the turns that are its own."""
        return Default(self.space, self.feasible, replace(self.options, transfer=False), seed=self.seed,
                       ctx=self.ctx, launch=self.launch)

    def _propose(self) -> int | None:
        # Length-scales per feature fitted on a few dozen points can over-fit (gemm: 0.77 of the optimum at
        # budget 25 against 0.85 with one shared length-scale), yet they are what finds the convolution optima;
        # early on, and again once stalled (the per-feature model is then sure of its plateau), every other
        # proposal is ranked by the GP with one shared length-scale instead.
        self._proposals += 1
        if self.transfer is None or (turn := self.transfer.turn()) == MODEL:
            return self._own()
        self._ahead = self.transfer.ahead(AHEAD)
        return turn

    def _own(self) -> int | None:
        """The proposal of the GP (around the sources' prior, when they are in use)."""
        o = self.options
        uniform = len(self.values) < o.shared or (o.stall_shared and self._stalled())
        use_shared = uniform and self._proposals % 2 == 0 and o.relevance
        self.model = self._shared if use_shared else self._relevant
        # the sources stand in for the start-up sample
        return self.model_row() if self.transfer is not None else super()._propose()

    def _in_use(self) -> bool:
        return self.transfer is not None and self.transfer.in_use

    def _stalled(self) -> bool:
        """Whether ``patience`` results (TRUSTED_PATIENCE on the sources' turns) passed without a better time."""
        patience = min(self.options.patience, TRUSTED_PATIENCE) if self._in_use() else self.options.patience
        return len(self.values) - self._improved_at >= patience

    def candidates(self, free: np.ndarray) -> np.ndarray:
        o = self.options
        local = 1.0 if self._in_use() else o.local
        if self._stalled() and local and self.rng.random() < local:
            rows = self.neighbours(1)
            if not len(rows):  # every one-parameter neighbour of the best is measured: look two away
                rows = self.neighbours(1, distance=2)
            if len(rows):
                return rows
        rows = np.union1d(np.union1d(self.random_subset(free, o.pool), self.neighbours(o.top)),
                          self.children(o.cross, 2 * o.top))
        if self._in_use() and self.prior is not None:  # the rows the sources rank best, wherever they are
            rows = np.union1d(rows, self.prior.best_rows(PRIOR_CANDIDATES))
        return rows

    def _observe(self, row: int, value: float | None) -> None:
        if value is not None and (self._best is None or value < self._best):
            self._best, self._improved_at = value, len(self.values)
        if self.transfer is not None:
            self.transfer.observe(row, value)

    def neighbours(self, top: int, distance: int = 1) -> np.ndarray:
        """Fresh rows that differ in 1 to ``distance`` parameters from one of the ``top`` fastest measured rows."""
        found = []
        for r in self.fastest(top):
            differ = self._differing(r)
            found.append(np.flatnonzero((differ >= 1) & (differ <= distance) & ~self.taken))
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _differing(self, row: int) -> np.ndarray:
        """How many parameters each feasible row differs in from ``row``. Kept for the last few rows asked about:
        the fastest rows change seldom, and comparing every feasible point with each of them at every proposal
        was a quarter of a proposal's time on an 18k-point landscape."""
        got = self._differ.get(row)
        if got is None:
            if len(self._differ) >= DIFFER_CACHE:
                del self._differ[next(iter(self._differ))]  # the oldest
            got = self._differ[row] = (self.feasible.codes != self.feasible.codes[row]).sum(1).astype(np.uint16)
        return got

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

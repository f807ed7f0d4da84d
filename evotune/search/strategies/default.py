"""``default``: Bayesian optimisation that knows GPU kernels like aligned sizes.

The algorithm:

1. **Start**: ``startup`` points, the first population of :meth:`Strategy.seed_rows`
   (half ranked by the hardware model with ``seeding = "hardware"``, the rest a
   greedy max-min spread over the space).
2. **Model**: a Gaussian process on standardised log-time (:class:`gp.Surrogate`):
   Matérn-5/2 on the encoded point, which carries *alignment* features (power of
   two, 2-adic valuation) beside each integer parameter's position, because
   divisibility, not magnitude, is what separates fast GPU configurations from
   slow neighbours. With ``relevance`` each feature gets its own length-scale by
   marginal likelihood, so parameters that do not matter stop diluting distances.
   Failed points count as twice the slowest time seen. Given launch features
   (``launch=``: each point's program count against the SMs, :mod:`evotune.search.launch`),
   the GP sees those too, and so does the transfer prior (6.).
3. **Two models in turn**: per-feature length-scales fitted on a few dozen points
   can over-fit. Until ``shared`` results are in, and again once the search has
   stalled (``stall_shared``), every other proposal is ranked by the same GP with
   one length-scale for all features instead.
4. **Proposal**: the highest expected improvement among ``pool`` fresh random
   feasible points (global search), every fresh point one parameter away from
   the ``top`` best measured points (local search) and ``cross`` uniform-crossover
   children of two of the ``2 x top`` best (recombination, as a GA would breed them).
5. **Stalled local step**: once ``patience`` results have brought no better time,
   a share ``local`` of the proposals instead takes the highest expected
   improvement among the fresh one-parameter neighbours of the best point only
   (two-parameter ones once those are all measured), so that a search cannot stop
   one or two parameters short of the optimum because the model is sure of it.

6. **Transfer** (``sources`` given and ``transfer`` on): related results of the same
   space (other shapes, other GPUs; :mod:`evotune.search.prior`) make a prior
   over the feasible points. The first proposals are the ``transfer_checks`` first points
   of plain ``default``'s own start-up sample (a tuning cache's remembered winners, which
   have no ranking to check, come before them): plain ``default`` would have measured them
   too, so a prior found out on them costs nothing. If the prior ranks them with a Spearman
   correlation of at least ``trust``, the ``transfer_first`` winners of the sources follow,
   nearest source first; between ``probation`` and ``trust``, one winner is measured and
   the prior judged again with it. Sources that corroborate each other (two or more whose
   rankings of the target's rows agree at ``trust``, :meth:`Prior.corroborated`: the other
   shapes of one GPU) have half of the winners measured first, in place of as many checks.
   While the prior is trusted it replaces the start-up sample: the GP models what the prior
   (scaled by least squares) leaves unexplained, and the prior's best-ranked fresh
   points join the candidates. The transferred winners are then close to the optimum
   and the last percent is usually one or two parameters away: the stalled local
   step comes after ``trusted_patience`` results without a better time, not
   ``patience``, and takes every proposal it applies to (``trusted_local``). A prior
   that ranks the checks below ``trust`` (after its probation winner) is dropped.
   **The floor**: a prior can mislead while ranking the told results well (its best point a local optimum of
   the target, say), and then the trusted local step alone would keep proposing that optimum's neighbours.
   So after the start-up a share of the proposals is plain ``default``'s own: an inner plain ``default``,
   told only the results of its own proposals (points it asks for that were measured already, the checks
   among them, are told at once, for no evaluation), makes them: a share ``floor``, plus ``floor_step`` for
   each result since the last better time (none by default: a growing share cost the convolution priors of
   other GPUs their gains, as they need more than eight results for the last percent). While the prior's
   correlation is below ``trust`` after the checks, it is left out and that plain ``default`` proposes; it is
   used again once the correlation recovers (a source of another GPU can rank the told results at about
   ``trust``, and its local work near the optimum is what transfer gains). The prior is dropped for good once
   ``distrust`` of its own results bring no gain, or once plain ``default``'s own points (the checks, its share)
   hold a better time than every point the prior chose; every proposal is then that plain ``default``'s, so the
   search goes on as plain ``default`` would have from the start, a few evaluations later (none where the
   prior was found out on the checks). ``distrust`` counts the prior's own results (winners, its model's
   proposals), not plain ``default``'s share, and a better time resets it only when it beats the last such time
   by ``distrust_gain`` (0.5%): the prior is judged by what it proposes, and a tile of the same plateau a
   fraction of a percent faster is no sign that it leads anywhere. **A lone source** (one source with a
   ranking: nothing corroborates the region its winners point to) is dropped sooner: once ``lone_patience`` of
   its own results (its winners, its model's proposals) are measured; its first winner is what it can be right
   about. Its best point can be a local optimum of the target while it ranks every point the search sees as the
   target does, and nothing but a better time tells the two apart; several sources that each rank the told
   results well keep ``distrust``, which the last percent of another GPU's convolution prior needs. Without
   sources nothing changes.
7. **Compile cost**: in a space whose launch arguments are free once a kernel is
   built (``SearchSpace.compiled_params``: a CUTLASS kernel's raster, swizzle and
   stream-K decomposition), the expected improvement of a point whose kernel is
   neither built nor handed out is divided by ``1 + compile_cost``: improvement per
   evaluation's worth of time (:mod:`evotune.search.compile_cost`). Kernels built by
   an earlier problem or run (the space's ``built``) count as built.

Options (defaults): ``startup`` 10, ``pool`` 1000, ``top`` 5, ``cross`` 50,
``local`` 0.5, ``patience`` 30, ``relevance`` true, ``shared`` 40,
``stall_shared`` true, ``noise`` 1e-3, ``refit`` 10 (results between length-scale
fits), ``transfer`` true, ``transfer_first`` 4, ``transfer_checks`` 5, ``trust`` 0.6, ``probation`` 0.2,
``trusted_patience`` 3, ``trusted_local`` 1.0, ``floor`` 0.2, ``floor_step`` 0, ``distrust`` 12,
``distrust_gain`` 0.005, ``lone_patience`` 1, ``compile_cost`` 20.
The measurements behind each choice are in ``docs/STRATEGY_DESIGN.md``.

Example::

    s = make_strategy("default", space, feasible, seed=0, pool=1000, top=5, cross=50)
    (point,) = s.ask(1)
    s.tell([(point, 0.42)])   # its time in ms; None for a failed point
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evotune.search.prior import Prior
from evotune.search.strategies.base import Option
from evotune.search.strategies.gp import GaussianProcess
from evotune.search.surrogate import COMPILE_COST, Surrogate

#: with a trusted prior, its best-ranked fresh rows join every proposal's candidates
PRIOR_CANDIDATES = 20
#: rows whose parameter differences to every feasible row are kept (Default._differing)
DIFFER_CACHE = 16


class Default(GaussianProcess):
    name = "default"
    schema = {
        "startup": Option(10, int, 1),  # points before the GP is trusted
        "pool": Option(1000, int, 1),  # fresh random points scored per proposal
        "top": Option(5, int, 0),  # best points whose one-parameter neighbours are scored too
        "cross": Option(50, int, 0),  # uniform-crossover children of two of the 2 x top best points, scored too
        "local": Option(0.5, float, 0.0, 1.0),  # share of proposals, once stalled, among the best's neighbours only
        "patience": Option(30, int, 0),  # results without a better time before the search counts as stalled
        "relevance": Option(True, bool),  # a length-scale per feature
        "shared": Option(40, int, 0),  # until this many results, every other proposal uses one length-scale
        "stall_shared": Option(True, bool),  # once stalled, every other proposal uses one length-scale again
        "noise": Option(1e-3, float, 1e-9, 1.0),
        "refit": Option(10, int, 1),  # results between length-scale fits
        "transfer": Option(True, bool),  # learn from related results (sources) when there are any
        "transfer_first": Option(4, int, 0),  # the sources' winners measured once the prior passes its checks
        # plain default's first start-up points, measured first: the prior's ranking is checked against them
        "transfer_checks": Option(5, int, 0),
        "trust": Option(0.6, float, -1.0, 1.0),  # rank correlation the prior must keep with the told times
        # a prior ranking the checks at least this well (but below trust) gets one winner measured, then is judged
        "probation": Option(0.2, float, -1.0, 1.0),
        # with a trusted prior the transferred winners are near the optimum: step to their neighbours sooner
        "trusted_patience": Option(3, int, 1),
        "trusted_local": Option(1.0, float, 0.0, 1.0),
        # with a trusted prior, this share of proposals is plain default's own: those it makes on its own
        "floor": Option(0.2, float, 0.0, 1.0),
        # ... growing by this with each result since the last better time
        "floor_step": Option(0.0, float, 0.0, 1.0),
        # the prior's own results (winners, its model's proposals) without a gain after which it is dropped
        "distrust": Option(12, int, 1),
        # a better time is a gain (resets distrust) only when it beats the last gain by this share (0: any)
        "distrust_gain": Option(0.005, float, 0.0, 1.0),
        # a lone source's own results after which its prior is dropped (0: never)
        "lone_patience": Option(1, int, 0),
        # a new kernel's cost in evaluations, for spaces with launch arguments (0: every point costs the same)
        "compile_cost": Option(COMPILE_COST, float, 0.0),
    }
    transfers = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        o = self.options
        self._relevant = self.model
        self._shared = Surrogate(self, float(o["noise"]), int(o["refit"]), relevance=False)
        self._best: float | None = None
        self._improved_at = 0  # results told when the best time last improved
        self._proposals = 0
        self.prior: Prior | None = None
        if self.sources and bool(o["transfer"]):
            self.prior = Prior(self, self.sources) or None
        self._trusted = False  # whether the prior is in use (after the checks, until it is given up)
        self._used = False  # whether the prior passed its checks
        self._given_up = False  # whether the prior was dropped for good: the search is plain default's own
        self._winners = 0  # transferred winners handed out
        self._probed = False  # whether the prior had its probation winner
        self._remembered: list[int] = []  # the winners measured before the checks
        self._early = 0  # of which corroborated sources' winners, measured in place of as many checks
        self._checks: set[int] = set()  # the check rows: plain default's own start-up points
        self._trusted_from = 0  # results told when the prior came into use
        self._plain: Default | None = None  # plain default, on its own: told only the results of its proposals
        self._plain_rows: set[int] = set()  # the rows it proposed
        self._differ: dict[int, np.ndarray] = {}  # row -> parameters each feasible row differs in (_differing)
        self._gained: float | None = None  # the time at the last gain (a better time by distrust_gain at least)
        self._dry = 0  # the prior's own results (once in use) since then
        self._own = 0  # the prior's own results once in use
        if self.prior is not None:  # the GPs with the prior as their mean
            self._prior_relevant = Surrogate(self, float(o["noise"]), int(o["refit"]), relevance=bool(o["relevance"]))
            self._prior_shared = Surrogate(self, float(o["noise"]), int(o["refit"]), relevance=False)

    def _propose(self) -> int | None:
        # Length-scales per feature fitted on a few dozen points can over-fit (gemm: 0.77 of the optimum at
        # budget 25 against 0.85 with one shared length-scale), yet they are what finds the convolution optima;
        # early on, and again once stalled (the per-feature model is then sure of its plateau), every other
        # proposal is ranked by the GP with one shared length-scale instead.
        self._proposals += 1
        if self.prior is not None:
            if not self._given_up:
                row = self._transferred()
                if row is not None:
                    return row
            if self._given_up or not self._trusted or self._floor_turn():
                row = self._plain_row()
                if row is not None or self._given_up:
                    return row
        o = self.options
        uniform = len(self.values) < int(o["shared"]) or (bool(o["stall_shared"]) and self._stalled())
        use_shared = uniform and self._proposals % 2 == 0 and bool(o["relevance"])
        if self._trusted:  # the prior stands in for the start-up sample
            self.model = self._prior_shared if use_shared else self._prior_relevant
            if not self.values:  # a batch asked before any result (a compile pool ahead): the prior alone ranks
                assert self.prior is not None  # trusted only ever with a prior
                best = self.prior.best_rows(1)
                return int(best[0]) if len(best) else self.random_fresh()
            return self.model_row()
        self.model = self._shared if use_shared else self._relevant
        return super()._propose()

    def _floor_turn(self) -> bool:
        """Whether this proposal, with the prior in use, is one of plain default's share (none before the end of
        the start-up: the prior's gains come early): ``floor``, plus ``floor_step`` for each result since the
        last better time (or since the prior came into use)."""
        o = self.options
        if self._proposals <= int(o["startup"]):
            return False
        waited = len(self.values) - max(self._improved_at, self._trusted_from)
        share = min(1.0, float(o["floor"]) + float(o["floor_step"]) * waited)
        return share > 0 and self.rng.random() < share

    def _plain_row(self) -> int | None:
        """Plain default's next proposal, as it would make it on its own: a point it proposes that was measured
        already (a check, a transferred pick) is told to it at once and costs no evaluation."""
        if self._plain is None:
            opts = {k: v for k, v in self.options.items() if k in self.schema and k != "transfer"}
            self._plain = Default(self.space, self.feasible, seed=self.seed, ctx=self.ctx, launch=self.launch,
                                  seeding=self.seeding, **opts)
        while True:
            points = self._plain.ask(1)
            if not points:
                return None
            row = self.feasible.row(points[0])
            assert row is not None
            if row in self.values:
                self._plain.tell([(points[0], self.values[row])])
                continue
            self._plain_rows.add(row)
            if not self.taken[row]:  # else handed out by this search and not told yet: its result is forwarded
                return row

    def _transferred(self) -> int | None:
        """A remembered winner or a check point while those last; else decide whether the prior stays in use.

        The check points are the first of plain default's own start-up sample, spread out: plain default
        measures them too, so a prior found out on them costs no evaluation, and a trusted one has been
        checked against ordinary points before its favourites. The prior is dropped for good, and the search
        is plain ``default``'s own from then on (:meth:`_plain_row`), if it ranks the told results with a
        Spearman correlation below ``trust`` at the end of the checks (below ``probation``, or again after
        its probation winner), once ``distrust`` of its own results have brought no gain (a lone source: once
        ``lone_patience`` of its own results are in), or once plain default's
        own points hold a better time than every point the prior chose: it has then led to a local optimum, or
        to the optimum, and either way what remains is plain ``default``'s global work. A correlation below
        ``trust`` later only leaves the prior out (``_trusted`` false: plain default proposes) until it recovers.
        """
        assert self.prior is not None
        o = self.options
        first, checks = int(o["transfer_first"]), int(o["transfer_checks"])
        if self._proposals == 1:
            self._startup = self.seed_rows(int(o["startup"]))  # before any pick is taken, as plain default does
            self._remembered = self.prior.remembered(first)
            if self.prior.corroborated(float(o["trust"])):  # sources that agree: half their winners come first
                picks = [r for r in self.prior.picks((first + 1) // 2) if r not in self._remembered]
                self._remembered += picks
                self._early = len(picks)
                self._winners += len(picks)
        if self._proposals <= len(self._remembered):
            remembered = self._remembered[self._proposals - 1]
            if not self.taken[remembered]:
                return remembered
        elif self._proposals <= len(self._remembered) + checks - self._early:
            check = self.startup_row(int(o["startup"]))
            if check is not None:
                self._checks.add(check)
                return check
        agree = self.prior.agreement()
        low = agree is not None and agree < float(o["trust"])
        if not self._used:
            self._trusted_from = len(self.values)  # the checks' results do not count against the prior
        stalled = self._used and self._dry >= int(o["distrust"])
        if self._lone() and int(o["lone_patience"]) and self._own >= int(o["lone_patience"]):
            stalled = True  # a lone source had its say: its region, uncorroborated, may be a local optimum
        if low and not self._used and not self._probed and agree is not None and agree >= float(o["probation"]):
            self._probed = True  # ranked the checks fairly: its first winner decides
            winner = self._winner()
            if winner is not None:
                return winner
        if stalled or self._outrun() or (low and not self._used):
            self._given_up, self._trusted = True, False
            return None
        self._used, self._trusted = True, not low
        if low:
            return None
        self._prior_relevant.prior = self._prior_shared.prior = self.prior.mean
        return self._winner() if self._winners < first else None

    def _lone(self) -> bool:
        """Whether at most one source lends a ranking (the launch model's column, fitted on the sources, not
        counted): its winners' region is then backed by that source alone."""
        assert self.prior is not None
        return int(self.prior.ranked[int(self.prior.joint):].sum()) <= 1

    def _outrun(self) -> bool:
        """Whether plain default's own points (the checks, its proposals) hold a better time than every point
        the prior chose (its winners, its model's proposals): plain default is then ahead on its own."""
        own: list[float] = []
        chosen: list[float] = []
        for row, value in self.values.items():
            if value is not None:
                (own if row in self._checks or row in self._plain_rows else chosen).append(value)
        return bool(own and chosen) and min(own) < min(chosen)

    def _winner(self) -> int | None:
        """The next transferred winner (the sources' fastest points in turn), if any is fresh."""
        assert self.prior is not None
        picks = self.prior.picks(1)
        if not picks:
            return None
        self._winners += 1
        return picks[0]

    def _stalled(self) -> bool:
        """Whether ``patience`` results (``trusted_patience`` while the prior is trusted) have passed without a
        better time."""
        o = self.options
        patience = int(o["patience"])
        if self._trusted:
            patience = min(patience, int(o["trusted_patience"]))
        return len(self.values) - self._improved_at >= patience

    def candidates(self, free: np.ndarray) -> np.ndarray:
        o = self.options
        local = float(o["trusted_local"] if self._trusted else o["local"])
        if self._stalled() and local and self.rng.random() < local:
            rows = self.neighbours(1)
            if not len(rows):  # every one-parameter neighbour of the best is measured: look two away
                rows = self.neighbours(1, distance=2)
            if len(rows):
                return rows
        top = int(o["top"])
        rows = np.union1d(np.union1d(self.random_subset(free, int(o["pool"])), self.neighbours(top)),
                          self.children(int(o["cross"]), 2 * top))
        if self._trusted and self.prior is not None:  # the rows the sources rank best, wherever they are
            rows = np.union1d(rows, self.prior.best_rows(PRIOR_CANDIDATES))
        return rows

    def _observe(self, row: int, value: float | None) -> None:
        better = value is not None and (self._best is None or value < self._best)
        gained = value is not None and (self._gained is None
                                        or value < self._gained * (1.0 - float(self.options["distrust_gain"])))
        if gained:
            self._gained = value
        if self._used and row not in self._checks and row not in self._plain_rows:  # the prior's own result
            self._dry = 0 if gained else self._dry + 1
            self._own += 1
        if better:
            self._best, self._improved_at = value, len(self.values)
        if self._plain is not None and row in self._plain_rows:
            self._plain.tell([(self.feasible.point(row), value)])

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

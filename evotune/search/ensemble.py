"""How ``default`` learns from sources: ranking-weighted sources (RGPE) and whose turn each proposal is.

The weighting follows RGPE, ranking-weighted Gaussian process ensembles (Feurer, Letham and Bakshy, "Scalable
Meta-Learning for Bayesian Optimization", 2018): each source's model (a column of :class:`Prior`: its standardised
log-times on the target's rows) and the target's own GP are scored by the pairs of the target's told results they
mis-rank, on bootstrap resamples of those results, the target's GP by leave-one-out; a model's weight is the share
of resamples on which it mis-ranks fewest (ties shared). A source that mis-ranks more than the target GP on most
resamples (a lone source, unless ``lone`` is 0: on more than one in three) drops out: it weighs nothing.

How the weights enter proposals (:meth:`Transfer.turn`):

* **The opening.** Remembered winners (a tuning cache's entries for other problems) first. Several sources have
  half of ``first`` winners (the fastest of each source in turn, nearest first) measured first; a lone source,
  which nothing corroborates, none. Then plain ``default``'s own first points, OPENING evaluations in all: an
  inner plain ``default``, told only the results of its own proposals, makes them, so that a source found out
  on them costs nothing.
* **After it**, while a source weighs, the turn is the sources' (the rest of the winners, then the GP around the
  weighted prior), except for a share equal to the target GP's weight after the start-up, which is plain
  ``default``'s: as the target's own results outrank the sources, the search becomes plain ``default``'s. While
  no source weighs every turn is plain ``default``'s; a source may weigh again later.
* **A lone source is dropped for good after ``lone`` of its own results** (0: never, and it is held to the same
  evidence as several). A source whose best point
  is a local optimum of the target ranks every point the search sees as the target does, so no ranking finds it
  out; only a better time elsewhere would, and plain ``default`` passes such an optimum at about the evaluation
  where it reaches 0.99 on its own. Each evaluation the source is given delays plain ``default`` by one.

Departures from the paper: a source drops out when it loses to the target GP on most resamples, not when its
median loss is above the 95th percentile of the target GP's (at five results, resamples of two or three distinct
points let a reversed source through that rule); the weighted sources enter as the prior mean of one GP on the
target's results (the GP models the residual), not as a weighted sum of posterior means; and the target GP's
weight is a share of the turns rather than of a mean.

Example::

    t = Transfer(strategy, Prior(strategy, sources), plain=make_plain, first=4, lone=1, startup=10)
    row = t.turn()   # a row to measure, MODEL (the GP around the prior proposes) or None
    t.observe(row, 0.42)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from evotune.core.space import Point
from evotune.search.prior import Prior
from evotune.search.state import StrategyState
from evotune.search.surrogate import LENGTHSCALES, encode, log_likelihood, one_blas_thread

#: the share of resamples on which a lone source must mis-rank fewer pairs than the target GP to weigh
LONE_EVIDENCE = 2.0 / 3.0
#: :meth:`Transfer.turn`'s answer when the GP around the weighted sources is to propose
MODEL = -1
#: evaluations of the opening: winners first (several sources) and plain default's own first points
OPENING = 5
#: bootstrap resamples of the told results on which the models' ranking losses are compared
RESAMPLES = 100
#: told results on which the models' rankings are compared (a random subset beyond this)
RANKED_ROWS = 100
#: results told before the sources are weighed by their rankings (fewer: by distance only)
MIN_RANKED = 5
#: the target GP's leave-one-out means closer than this share of the told results' spread tie: on a few results
#: the GP may explain nothing (a length-scale shorter than the points' distances), its means then one constant up to
#: round-off, whose order would decide whether it mis-ranks a pair
LOO_TIE = 1e-9


def misranked(pred: np.ndarray, y: np.ndarray, tie: float = 0.0) -> np.ndarray:
    """1 where the pair (j, k) is ordered differently by ``pred`` and ``y``, a half where ``pred`` ties them (they
    differ by ``tie`` at most: a coin's guess), 0 where ``y`` ties them (no order to get wrong)."""
    dpred = pred[:, None] - pred[None, :]
    dp = np.where(np.abs(dpred) <= tie, 0.0, np.sign(dpred))
    dy = np.sign(y[:, None] - y[None, :])
    return np.where(dy == 0, 0.0, np.where(dp == 0, 0.5, (dp != dy).astype(float)))


def loo_mean(x: np.ndarray, y: np.ndarray, noise: float = 1e-3) -> np.ndarray:
    """Leave-one-out posterior means of a GP (Matérn-5/2, one length-scale by likelihood) at its training rows."""
    ys = y - y.mean()
    best = None
    for ls in LENGTHSCALES:
        got = log_likelihood(x / ls, ys, noise)
        if got is not None and (best is None or got[0] > best[0]):
            best = got
    if best is None:
        return np.full(len(y), y.mean())
    _, chol, alpha = best
    from scipy.linalg import solve_triangular

    inv = solve_triangular(chol, np.eye(len(y)), lower=True)
    diag = (inv * inv).sum(0)  # the diagonal of K^-1 = L^-T L^-1
    loo: np.ndarray = y - alpha / diag
    return loo


class Asks(Protocol):
    """What the turns need of plain ``default``: its ask and tell."""

    def ask(self, n: int = 1) -> list[Point]: ...

    def ahead(self, n: int) -> list[Point]: ...

    def tell(self, results: Sequence[tuple[Point, float | None]]) -> None: ...


class Transfer:
    """The sources of one search: their RGPE weights and which proposal is theirs (module docstring)."""

    def __init__(self, strategy: StrategyState, prior: Prior, plain: Callable[[], Asks], first: int, lone: int,
                 startup: int):
        self.strategy, self.prior, self.first, self.lone, self.startup = strategy, prior, first, lone, startup
        self._make_plain = plain
        self._plain: Asks | None = None  # plain default, on its own: told only the results of its own proposals
        self.plain_rows: set[int] = set()
        self.asked = 0
        self.opening: list[int] = []
        self.winners = 0
        self.own = 0  # the sources' own results after the opening: winners, the proposals of the GP around them
        self.given_up = False
        self.in_use = False  # whether the last turn was the sources' (winner or GP around them)
        self._rng = np.random.default_rng(strategy.seed)
        self._weighed: tuple[int, np.ndarray, float] | None = None
        self._x: np.ndarray | None = None  # the encoded feasible rows, for the target GP

    # -- the weights -------------------------------------------------------------------------------------------
    def weights(self) -> tuple[np.ndarray, float]:
        """(each source's weight, the target GP's), RGPE on the told results; by distance alone before MIN_RANKED."""
        told = len(self.strategy.values)
        if self._weighed is None or self._weighed[0] != told:
            w, target = self._rgpe()
            self._weighed = (told, w, target)
            self.prior.weigh(w)
        return self._weighed[1], self._weighed[2]

    def _rgpe(self) -> tuple[np.ndarray, float]:
        p = self.prior
        rows, y = p.told()
        models = [i for i in range(len(p)) if p.ranked[i]]
        if not models:  # single times (a cache's entries): winners to remember, no ranking to lend
            return np.zeros(len(p)), 1.0
        if len(rows) < MIN_RANKED or np.ptp(y) == 0:
            return p.distance_weights() * p.ranked, 0.0
        if len(rows) > RANKED_ROWS:  # a random subset: thousands of pairs are enough to tell the models apart
            keep = np.sort(self._rng.choice(len(rows), size=RANKED_ROWS, replace=False))
            rows, y = rows[keep], y[keep]
        if self._x is None:
            self._x = encode(self.strategy.space, self.strategy.feasible).x
        x = self._x[rows]
        with one_blas_thread():
            z = (y - y.mean()) / max(float(y.std()), 1e-9)
            target = misranked(loo_mean(x, z), y, LOO_TIE * float(np.ptp(z)))
            wrong = np.stack([misranked(p.z[i, rows], y) for i in models] + [target])
            counts = self._rng.multinomial(len(rows), np.full(len(rows), 1.0 / len(rows)), size=RESAMPLES)
            loss = np.stack([((counts @ w) * counts).sum(1) for w in wrong])
        winners = loss == loss.min(0)
        share = (winners / winners.sum(0)).mean(1)
        beats = (loss[:-1] < loss[-1]).mean(1) + 0.5 * (loss[:-1] == loss[-1]).mean(1)
        # a source that mis-ranks more than the target GP on most resamples drops out; a lone one, which nothing
        # corroborates and whose winner delays plain default by an evaluation, needs two resamples in three
        keep = beats >= (LONE_EVIDENCE if self.lone and self.lone_source() else 0.5)
        w = np.zeros(len(p))
        w[models] = share[:-1] * keep
        return w, float(share[-1])

    # -- the turns ---------------------------------------------------------------------------------------------
    def lone_source(self) -> bool:
        """Whether at most one source lends a ranking (the launch model's column, fitted on them, not counted)."""
        return int(self.prior.ranked[int(self.prior.joint):].sum()) <= 1

    def turn(self) -> int | None:
        """The next row to measure, MODEL for the GP around the weighted sources, or None (nothing fresh)."""
        self.asked += 1
        self.in_use = False
        if self.asked == 1:
            self.opening = self.prior.remembered(self.first)
            if not self.lone_source():
                picks = [r for r in self.prior.picks((self.first + 1) // 2) if r not in self.opening]
                self.opening += picks
                self.winners = len(picks)
        if self.given_up:
            return self.plain_row()
        if self.asked <= len(self.opening):
            row = self.opening[self.asked - 1]
            if not self.strategy.taken[row]:
                self.in_use = True
                return row
        if len(self.opening) < self.asked <= OPENING:  # plain default's own first points
            return self.plain_row()
        w, target = self.weights()
        if self.lone and self.lone_source() and self.own >= self.lone:
            self.given_up = True
        if self.given_up or not w.any():
            return self.plain_row()
        if self.asked > self.startup and self._rng.random() < target:
            return self.plain_row()
        self.in_use = True
        if self.winners < self.first:
            picks = self.prior.picks(1)
            if picks:
                self.winners += 1
                return picks[0]
        if not self.strategy.values:  # a batch asked before any result (a compile pool ahead): the prior ranks
            best = self.prior.best_rows(1)
            return int(best[0]) if len(best) else None
        return MODEL

    def plain_row(self) -> int | None:
        """Plain default's next proposal, as it would make it on its own: a point it proposes that was measured
        already (a winner, another turn's point) is told to it at once and costs no evaluation."""
        if self._plain is None:
            self._plain = self._make_plain()
        plain, s = self._plain, self.strategy
        while True:
            points = plain.ask(1)
            if not points:
                return None
            row = s.feasible.row(points[0])
            assert row is not None
            if row in s.values:
                plain.tell([(points[0], s.values[row])])
                continue
            self.plain_rows.add(row)
            if not s.taken[row]:  # else handed out by this search and not told yet: its result is forwarded
                return row

    def ahead(self, n: int) -> list[int]:
        """Up to ``n`` rows the next turns would likely take: the rest of the opening, then plain default's ranking."""
        rows = list(self.opening[self.asked:])
        if self._plain is not None:
            rows += [r for r in map(self.strategy.feasible.row, self._plain.ahead(n)) if r is not None]
        return rows[:n]

    def observe(self, row: int, value: float | None) -> None:
        """A told result: the sources' own results are counted, plain default's forwarded to it."""
        if row in self.plain_rows:
            assert self._plain is not None
            self._plain.tell([(self.strategy.feasible.point(row), value)])
        elif row not in self.opening:
            self.own += 1

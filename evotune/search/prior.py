"""What earlier results say about a new problem: sources, and the prior that ``default`` builds from them.

A :class:`Source` is a list of measured configurations of the same space for a
related problem (another shape, another GPU): a recorded landscape, the trials of
a finished study, the tuning-result cache's entry. It carries how far its problem
and GPU are from the target's (:mod:`evotune.search.transfer` computes that; 0 is the same).

:class:`Prior` puts every source on the target's feasible rows:

* each source's log-times are standardised (failed points count as twice its slowest
  time); rows it did not measure are predicted by a GP fitted on the rows it did;
* the prior at a row is the weighted mean over sources (none beyond MAX_DISTANCE), a source's weight being
  ``exp(-distance / TAU)`` until :mod:`evotune.search.ensemble` sets it by how well the source ranks the
  told results (:meth:`Prior.weigh`), so that a misleading source stops counting;
* with launch features (:mod:`evotune.search.launch`: the target's rows and the sources' results carry
  them), one more column, first: a GP fitted on every such source's results at once, on the encoded point
  plus its launch at the source's problem, predicts each target row from the point and its launch at the
  target's; the sources then speak through the launch shape their fast points had, not only through the
  same parameter values (which, where the problem grows, launch other grids);
* :meth:`Prior.picks` are the transferred winners: the fastest rows of each source
  in turn, nearest source first; :meth:`Prior.remembered` the winners of sources that hold a single
  time (a tuning cache's entries), which ``default`` measures before anything else.

Example::

    prior = Prior(strategy, [Source("landscape:x", results, distance=1.0)])
    prior.picks(4), prior.mean(np.arange(len(strategy.feasible)))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evotune.core.space import Point
from evotune.search.state import StrategyState
from evotune.search.surrogate import (
    LENGTHSCALES,
    choose_scale,
    encode,
    encode_codes,
    log_likelihood,
    matern52,
    one_blas_thread,
    with_launch,
)

#: a source's measured rows used to predict the rows it lacks (a random subset beyond this)
PREDICT_ROWS = 300
#: sources further than this from the target (a factor of 16 in one size, or another dtype and more than a
#: factor of two) are not used: the two H100 Triton landscapes (bf16 4096^3, int8 64 x 4096 x 11008, distance
#: 10) misled each other (42 evaluations to 0.99 against 18 without)
MAX_DISTANCE = 4.0
#: distance scale of the source weights: a source one unit further (a factor of two in one problem size,
#: or another GPU of the same vendor) counts exp(-2) = 0.14 times as much
TAU = 0.5


@dataclass(frozen=True)
class Source:
    """Measured configurations of the target's space for a related problem; ``None``: a failed point."""

    name: str  # what ``best`` and the plots show: "landscape:<file>", "study:<name>", "cache:<problem>"
    results: tuple[tuple[Point, float | None], ...]
    distance: float = 0.0  # how far its problem and GPU are from the target's (0: the same)
    #: the launch features of each result at the source's own problem (evotune.search.launch), when known
    launch: tuple[tuple[float, ...], ...] | None = None


def ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank)."""
    from scipy.stats import rankdata

    ranked: np.ndarray = rankdata(x)
    return ranked


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation; 0 where either side is constant."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / den if den > 0 else 0.0


class Prior:
    """The sources' standardised log-times on the target's feasible rows, and their weights."""

    def __init__(self, strategy: StrategyState, sources: Sequence[Source]):
        self.strategy = strategy
        fs = strategy.feasible
        names, z, fastest, dist, ranked = [], [], [], [], []
        encoding = None
        joint = self._launch_model(sources)
        if joint is not None:
            col, d, n = joint
            names.append(f"launch:{n} sources")
            z.append(col)
            fastest.append([int(r) for r in np.argsort(col, kind="stable")])
            dist.append(d)
            ranked.append(True)
        for src in sources:
            if src.distance > MAX_DISTANCE:
                continue
            rows, vals = [], []
            for point, value in src.results:
                row = fs.row(point)
                if row is not None:
                    rows.append(row)
                    vals.append(value)
            ok = [v for v in vals if v is not None]
            if not ok:
                continue
            order = sorted((v, r) for r, v in zip(rows, vals, strict=True) if v is not None)
            fastest.append([r for _, r in order])
            names.append(src.name)
            dist.append(float(src.distance))
            ranked.append(len(set(ok)) >= 2)
            if not ranked[-1]:  # a single time (the cache's winner): a pick, but no ranking to lend
                z.append(np.zeros(len(fs)))
                continue
            logs = np.log(np.array([v if v is not None else 2.0 * max(ok) for v in vals]))
            col = np.full(len(fs), np.nan)
            col[rows] = (logs - logs.mean()) / max(float(logs.std()), 1e-9)
            if np.isnan(col).any():
                encoding = encoding if encoding is not None else encode(strategy.space, fs).x
                col = self._fill(col, encoding)
            z.append(col)
        self.names = names
        self.joint = joint is not None  # whether column 0 is the launch model's (fitted on every source at once)
        self.z = np.array(z) if z else np.zeros((0, len(fs)))
        self.distance = np.array(dist)
        self.ranked = np.array(ranked, dtype=bool)
        self._fastest = fastest
        self._weights: np.ndarray | None = None  # set by weigh(); by nearness until then

    def _launch_model(self, sources: Sequence[Source]) -> tuple[np.ndarray, float, int] | None:
        """(the prediction at every target row, the nearest distance, how many sources) of one GP fitted on
        the results of every source within MAX_DISTANCE that carries launch features; None without any."""
        s = self.strategy
        if s.launch is None:
            return None
        codes, feats, ys, dists = [], [], [], []
        for src in sources:
            if src.launch is None or src.distance > MAX_DISTANCE or len(src.launch) != len(src.results):
                continue
            kept = []
            for (point, value), launch in zip(src.results, src.launch, strict=True):
                try:
                    kept.append((s.space.encode(point), launch, value))
                except (KeyError, ValueError):
                    continue  # a value the target's space does not offer
            ok = [v for _, _, v in kept if v is not None]
            if len(set(ok)) < 2:
                continue
            logs = np.log(np.array([v if v is not None else 2.0 * max(ok) for _, _, v in kept]))
            ys.append((logs - logs.mean()) / max(float(logs.std()), 1e-9))
            codes += [c for c, _, _ in kept]
            feats += [f for _, f, _ in kept]
            dists.append(float(src.distance))
        if not dists:
            return None
        x = with_launch(encode_codes(s.space, np.array(codes, dtype=np.int64)), np.array(feats, dtype=float))
        y = np.concatenate(ys)
        rng = np.random.default_rng(s.seed)
        if len(y) > PREDICT_ROWS:
            keep = np.sort(rng.choice(len(y), size=PREDICT_ROWS, replace=False))
            x, y = type(x)(x.x[keep], x.features), y[keep]
        target = with_launch(encode(s.space, s.feasible), s.launch).x
        with one_blas_thread():
            scale = choose_scale(x.x, y - y.mean(), 1e-2, x.features, rng)
            got = log_likelihood(x.x * scale, y - y.mean(), 1e-2) if scale is not None else None
            if got is None:
                return None
            col = np.empty(len(target))
            for chunk in np.array_split(np.arange(len(target)), max(1, len(target) // 4000)):
                col[chunk] = y.mean() + matern52(target[chunk] * scale, x.x * scale) @ got[2]
        return col, min(dists), len(dists)

    def __len__(self) -> int:
        return len(self.names)

    def _fill(self, col: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Predict a source's unmeasured rows by a GP (one length-scale, by likelihood) on its measured ones."""
        known = np.flatnonzero(~np.isnan(col))
        rng = np.random.default_rng(self.strategy.seed)
        if len(known) > PREDICT_ROWS:
            known = np.sort(rng.choice(known, size=PREDICT_ROWS, replace=False))
        ys = col[known] - col[known].mean()
        best = None
        with one_blas_thread():
            for ls in LENGTHSCALES:
                got = log_likelihood(x[known] / ls, ys, 1e-3)
                if got is not None and (best is None or got[0] > best[0]):
                    best = (got[0], ls, got[2])
            missing = np.flatnonzero(np.isnan(col))
            out = col.copy()
            if best is None:
                out[missing] = 0.0
                return out
            _, ls, alpha = best
            for chunk in np.array_split(missing, max(1, len(missing) // 4000)):
                out[chunk] = col[known].mean() + matern52(x[chunk] / ls, x[known] / ls) @ alpha
        return out

    # -- what the strategy asks ---------------------------------------------
    def told(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, log-times) of the told results, failures at twice the slowest time."""
        s = self.strategy
        rows = np.array(list(s.values), dtype=np.int64)
        pen = s.penalty()
        return rows, np.log(np.array([s.values[int(r)] if s.values[int(r)] is not None else pen for r in rows]))

    def distance_weights(self) -> np.ndarray:
        """Each source's weight by nearness alone: ``exp(-(distance - nearest) / TAU)``."""
        return np.exp(-(self.distance - (self.distance.min() if len(self) else 0.0)) / TAU)

    def weigh(self, w: np.ndarray) -> None:
        """Set the sources' weights (by how they rank the told results: :mod:`evotune.search.ensemble`)."""
        self._weights = w

    def weights(self) -> np.ndarray:
        """Each source's weight: as last set by :meth:`weigh`, else by nearness."""
        return self._weights if self._weights is not None else self.distance_weights()

    def mean(self, rows: np.ndarray) -> np.ndarray:
        """The prior at ``rows``: the weighted mean of the sources' standardised log-times (0 with no weight)."""
        w = self.weights() * self.ranked
        total = float(w.sum())
        if total <= 0:
            return np.zeros(len(rows))
        mean: np.ndarray = (w @ self.z[:, rows]) / total
        return mean

    def picks(self, n: int) -> list[int]:
        """Up to ``n`` fresh rows: the fastest of each source that weighs in turn, nearest source first. By
        nearness, not weight: weights set on a handful of results move with each of them (ordered by them, the
        launch model's second-best, the optimum of the autotune replay's 256 x 4096 x 4096, came after two
        farther sources' bests)."""
        near = np.argsort(self.distance, kind="stable")
        w = self.weights()
        order = [i for i in near if w[i] > 0] or list(near)
        taken = self.strategy.taken
        out: list[int] = []
        depth = 0
        while len(out) < n and any(depth < len(f) for f in self._fastest):
            for i in order:
                if depth < len(self._fastest[i]):
                    r = self._fastest[i][depth]
                    if not taken[r] and r not in out:
                        out.append(r)
                        if len(out) == n:
                            break
            depth += 1
        return out

    def remembered(self, n: int) -> list[int]:
        """Up to ``n`` fresh rows: the winners of the sources that hold a single time (a tuning cache's entry for
        another problem), nearest first. They have no ranking to check a prior by; remembering them is their use."""
        out: list[int] = []
        for i in np.argsort(self.distance, kind="stable"):
            if not self.ranked[i] and self._fastest[i]:
                r = self._fastest[i][0]
                if not self.strategy.taken[r] and r not in out:
                    out.append(r)
        return out[:n]

    def best_rows(self, n: int) -> np.ndarray:
        """The ``n`` fresh rows the prior ranks fastest."""
        free = np.flatnonzero(~self.strategy.taken)
        if not len(free) or not len(self):
            return np.zeros(0, dtype=np.int64)
        m = self.mean(free)
        return free[np.argsort(m, kind="stable")[:n]]

"""The GP surrogate: log-time modelled over a strategy's feasible rows, in numpy.

A Matérn-5/2 kernel on the encoded points (:func:`encode`: each parameter's choice scaled to [0, 1],
plus alignment features for the power-of-two-like ones); length-scales picked by marginal likelihood
(:class:`Surrogate`); expected improvement; and a prior mean from related results scaled to the told
ones (:func:`scaled_prior`). Used by the ``gp`` and ``default`` strategies and by the transfer prior.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from threadpoolctl import ThreadpoolController

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.state import StrategyState

_SQRT5 = np.sqrt(5.0)
LENGTHSCALES = (0.1, 0.2, 0.4, 0.8, 1.6)
# What compiling a new kernel costs, in evaluations, for a space whose launch arguments are free once a kernel is
# built (SearchSpace.compiled_params): nvcc takes about a minute per CUTLASS kernel with fourteen side by side,
# about 3.5 s of the pool's time, against about 0.2 s to verify and time one point.
COMPILE_COST = 20.0
#: per-feature length-scale multipliers tried by the relevance pass (inf: the feature is ignored)
RELEVANCE_STEPS = (0.25, 0.5, 2.0, 4.0, np.inf)
ALIGNMENT_CAP = 6  # 2-adic valuations above 6 (multiples of 64) count alike
#: length-scales are chosen on at most this many training rows (a random subset): the relevance
#: pass factorises ~5 x (features + 1) kernels, and at 400 rows that alone took ~2 s
FIT_ROWS = 160


_BLAS: ThreadpoolController | None = None


def one_blas_thread() -> AbstractContextManager[object]:
    """A context in which NumPy's and SciPy's BLAS run one thread: the GP's matrices are budget-sized (a few
    hundred rows), and a multi-threaded BLAS spends more on waking its threads than it saves, several times more on
    a busy machine; one thread gives the same proposals. The loaded BLAS libraries are found once per process:
    finding them reads every shared library the process holds, about 3 ms with torch loaded, which was a third
    of a proposal's time."""
    global _BLAS
    if _BLAS is None:
        import scipy.linalg  # noqa: F401 - loads SciPy's own BLAS, which is limited too

        _BLAS = ThreadpoolController()
    limited: AbstractContextManager[object, bool | None] = _BLAS.limit(limits=1, user_api="blas")
    return limited


def matern52(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Matérn-5/2 kernel of unit length-scale between the rows of ``a`` and ``b`` (already scaled)."""
    # |a|^2 + |b|^2 - 2 a.b: no (n, m, d) temporary, which would be hundreds of MB for big candidate sets
    d2 = np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)
    r = np.sqrt(d2)
    k: np.ndarray = (1.0 + _SQRT5 * r + 5.0 / 3.0 * r * r) * np.exp(-_SQRT5 * r)
    return k


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float) -> np.ndarray:
    from scipy.special import ndtr

    sigma = np.maximum(sigma, 1e-12)
    z = (best - mu) / sigma
    pdf = np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    ei: np.ndarray = (best - mu) * ndtr(z) + sigma * pdf
    return ei


@dataclass(frozen=True)
class Encoding:
    """Features of every feasible row, and which columns make up each feature (one-hot: several)."""

    x: np.ndarray
    features: list[np.ndarray]


def _two_adic(v: int) -> int:
    return (v & -v).bit_length() - 1


def encode(space: SearchSpace, feasible: FeasibleSet) -> Encoding:
    """One row per feasible point: :func:`encode_codes` of their codes."""
    return encode_codes(space, feasible.codes)


def encode_codes(space: SearchSpace, codes_matrix: np.ndarray) -> Encoding:
    """One row per point (a row of choice indices), one or more columns per parameter, each in [0, 1].

    * an ordered parameter: its choice index / (choices - 1);
    * an unordered one: one-hot, scaled so two categories are as far apart as the ends of a range;
    * a positive integer parameter also gets **alignment** features, because a GPU kernel's speed
      follows divisibility more than magnitude: a block of 48 or 96 threads, which the index places
      between 32, 64 and 128, is often far slower than all three (it splits warps, shared-memory
      banks and vector loads). So: whether the value is a power of two (when the choices mix both),
      and its 2-adic valuation (how many times 2 divides it, capped at 64) when that is not simply
      its log2.

    Parameters with a single choice carry no distance and are left out.
    """
    cols: list[np.ndarray] = []

    def add(column: np.ndarray) -> None:
        cols.append(column if column.ndim == 2 else column[:, None])

    for j, p in enumerate(space.params):
        k = len(p.choices)
        if k < 2:
            continue
        codes = codes_matrix[:, j].astype(int)
        if not p.ordered:
            add(np.eye(k)[codes] / np.sqrt(2.0))
            continue
        add(codes / (k - 1))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in p.choices):
            continue
        pow2 = np.array([float(v & (v - 1) == 0) for v in p.choices])
        if 0 < pow2.sum() < k:
            add(pow2[codes])
        adic = np.array([min(_two_adic(v), ALIGNMENT_CAP) for v in p.choices], dtype=float)
        if adic.max() > adic.min() and not pow2.all():
            add(((adic - adic.min()) / (adic.max() - adic.min()))[codes])
    if not cols:
        return Encoding(np.zeros((len(codes_matrix), 0)), [])
    starts = np.cumsum([0] + [c.shape[1] for c in cols])
    return Encoding(np.hstack(cols), [np.arange(a, b) for a, b in pairwise(starts)])


def with_launch(enc: Encoding, launch: np.ndarray | None) -> Encoding:
    """``enc`` with the launch features (:mod:`evotune.search.launch`) as extra features, one column each."""
    if launch is None:
        return enc
    start = enc.x.shape[1]
    extra = [np.array([start + i]) for i in range(launch.shape[1])]
    return Encoding(np.hstack([enc.x, launch]), [*enc.features, *extra])


def log_likelihood(x: np.ndarray, ys: np.ndarray, noise: float) -> tuple[float, np.ndarray, np.ndarray] | None:
    """(log marginal likelihood up to a constant, Cholesky factor of K + noise I, K^-1 ys), or None."""
    from scipy.linalg import cho_solve

    k = matern52(x, x) + noise * np.eye(len(x))
    try:
        chol = np.linalg.cholesky(k)
    except np.linalg.LinAlgError:
        return None
    alpha = cho_solve((chol, True), ys)
    return float(-0.5 * ys @ alpha - np.log(np.diag(chol)).sum()), chol, alpha


def choose_scale(x: np.ndarray, ys: np.ndarray, noise: float, features: list[np.ndarray] | None,
                 rng: np.random.Generator) -> np.ndarray | None:
    """1 / length-scale per column of ``x`` by marginal likelihood on at most FIT_ROWS rows: the best shared one
    of LENGTHSCALES, then (with ``features``, the columns of each) one greedy pass that multiplies each
    feature's by the best of RELEVANCE_STEPS. None when no kernel matrix factorises."""
    if len(x) > FIT_ROWS:
        keep = np.sort(rng.choice(len(x), size=FIT_ROWS, replace=False))
        x, ys = x[keep], ys[keep]
    best_ll, best = -np.inf, None
    for ls in LENGTHSCALES:
        got = log_likelihood(x / ls, ys, noise)
        if got is not None and got[0] > best_ll:
            best_ll, best = got[0], np.full(x.shape[1], 1.0 / ls)
    if best is None or features is None:
        return best
    for cols in features:
        current, step = best[cols[0]], None
        for mult in RELEVANCE_STEPS:
            trial = best.copy()
            trial[cols] = current / mult
            got = log_likelihood(x * trial, ys, noise)
            if got is not None and got[0] > best_ll:
                best_ll, step = got[0], mult
        if step is not None:
            best[cols] = current / step
    return best


@dataclass
class Fit:
    scale: np.ndarray  # per column: 1 / length-scale (0: the column is ignored)
    chol: np.ndarray
    alpha: np.ndarray
    x: np.ndarray  # the training rows' scaled features
    best: float  # the best standardised observation
    mean: Callable[[np.ndarray], np.ndarray] | None = None  # the prior mean at given rows (transfer), else 0


class Surrogate:
    """A GP on standardised log-time over a strategy's feasible rows, for the strategies that rank by one.

    Failed points count as the strategy's penalty (worse than anything seen); points handed
    out but not yet told are constant liars at the best value. Every ``refit_every`` results
    the length-scales are re-chosen by marginal likelihood (on at most :data:`FIT_ROWS` of
    the results): one shared length-scale from
    :data:`LENGTHSCALES`, then, with ``relevance``, one greedy pass over the features that
    multiplies each one's length-scale by the best of :data:`RELEVANCE_STEPS` (infinity drops
    a feature that does not matter), a cheap stand-in for gradient-fitted ARD.
    """

    def __init__(self, strategy: StrategyState, noise: float, refit_every: int, relevance: bool = False):
        self.strategy, self.noise, self.refit_every = strategy, float(noise), int(refit_every)
        self.relevance = relevance
        self.encoding = with_launch(encode(strategy.space, strategy.feasible), strategy.launch)
        self._scale: np.ndarray | None = None
        self._fitted_at = 0
        #: a prior over rows (standardised log-time predicted from related results); the GP then models
        #: what the prior leaves unexplained, with the prior scaled by least squares on the told results
        self.prior: Callable[[np.ndarray], np.ndarray] | None = None

    def training_set(self) -> tuple[list[int], np.ndarray, int]:
        """(rows, standardised log-times, how many of the rows were told) including pending rows."""
        s = self.strategy
        told = list(s.values)
        pen = s.penalty()
        y = np.log(np.array([s.values[r] if s.values[r] is not None else pen for r in told]))
        pending = [int(r) for r in np.flatnonzero(s.taken) if int(r) not in s.values]
        y = np.concatenate([y, np.full(len(pending), y.min())])
        return told + pending, (y - y.mean()) / max(y.std(), 1e-9), len(told)

    def choose_scale(self, x: np.ndarray, ys: np.ndarray) -> np.ndarray | None:
        return choose_scale(x, ys, self.noise, self.encoding.features if self.relevance else None,
                            self.strategy.rng)

    def fit(self) -> Fit | None:
        if not self.strategy.values:  # nothing told yet (a batch asked ahead): no model to fit
            return None
        rows, ys, n_told = self.training_set()
        x = self.encoding.x[rows]
        best = float(ys.min())
        mean = None
        if self.prior is not None:
            mean = scaled_prior(self.prior, np.asarray(rows), ys, n_told)
            ys = ys - mean(np.asarray(rows))
        if self._scale is None or n_told >= self._fitted_at + self.refit_every:
            scale = self.choose_scale(x, ys)
            if scale is None:
                return None
            self._scale, self._fitted_at = scale, n_told
        got = log_likelihood(x * self._scale, ys, self.noise)
        if got is None:
            return None
        return Fit(self._scale, got[1], got[2], x * self._scale, best, mean)

    def predict(self, model: Fit, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation (standardised log-time) at ``rows``."""
        from scipy.linalg import solve_triangular

        ks = matern52(self.encoding.x[rows] * model.scale, model.x)
        v = solve_triangular(model.chol, ks.T, lower=True)
        mu = ks @ model.alpha if model.mean is None else ks @ model.alpha + model.mean(rows)
        return mu, np.sqrt(np.maximum(1.0 - (v * v).sum(0), 1e-12))

    def expected_improvement(self, rows: np.ndarray) -> np.ndarray | None:
        """EI of each of ``rows`` under a fresh fit; None when the GP cannot be fitted."""
        with one_blas_thread():
            model = self.fit()
            if model is None:
                return None
            mu, sigma = self.predict(model, rows)
            return expected_improvement(mu, sigma, model.best)


def scaled_prior(prior: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, ys: np.ndarray,
                 n_told: int) -> Callable[[np.ndarray], np.ndarray]:
    """``a + b * prior`` fitted by least squares on the first ``n_told`` of ``rows`` (b >= 0).

    A prior that ranks the told results well gets a slope near one; one that does not gets
    a slope near zero, and the GP is then the plain GP around a constant mean.
    """
    m, y = prior(rows[:n_told]), ys[:n_told]
    var = float(((m - m.mean()) ** 2).sum())
    b = max(float(((m - m.mean()) * (y - y.mean())).sum()) / var, 0.0) if var > 1e-12 else 0.0
    a = float(y.mean() - b * m.mean())
    return lambda r: a + b * prior(r)

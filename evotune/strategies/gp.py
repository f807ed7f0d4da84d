"""Bayesian optimisation with a Gaussian process, in numpy, over the feasible points.

The space is discrete and enumerated, so the acquisition (expected
improvement) is maximised exactly over the fresh feasible points (a random
subset of them when there are very many) instead of by gradient ascent in a
relaxed continuous space. The GP models log-time with a Matérn-5/2 kernel on
the normalised choice indices (one-hot for unordered parameters); its
length-scale is picked by marginal likelihood from a small grid. Points handed
out but not yet measured are "constant liars" at the best value seen.

Optuna's own ``GPSampler`` is available as ``optuna-gp`` where torch is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from evotune.space import FeasibleSet, SearchSpace
from evotune.strategies.base import Option, Strategy

_SQRT5 = np.sqrt(5.0)


def matern52(a: np.ndarray, b: np.ndarray, lengthscale: float) -> np.ndarray:
    # |a|^2 + |b|^2 - 2 a.b: no (n, m, d) temporary, which would be hundreds of MB for big candidate sets
    d2 = np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)
    r = np.sqrt(d2) / lengthscale
    return (1.0 + _SQRT5 * r + 5.0 / 3.0 * r * r) * np.exp(-_SQRT5 * r)


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float) -> np.ndarray:
    from scipy.special import ndtr

    sigma = np.maximum(sigma, 1e-12)
    z = (best - mu) / sigma
    pdf = np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    return (best - mu) * ndtr(z) + sigma * pdf


LENGTHSCALES = (0.1, 0.2, 0.4, 0.8, 1.6)


def fit(x: np.ndarray, ys: np.ndarray, noise: float,
        lengthscales: tuple[float, ...] = LENGTHSCALES) -> tuple[float, np.ndarray, np.ndarray] | None:
    """The Matérn-5/2 GP of the given length-scales with the best marginal likelihood on (x, ys).

    Returns (length-scale, Cholesky factor of K + noise I, K^-1 ys), or None when no factorisation succeeds.
    """
    from scipy.linalg import solve_triangular

    best_ll, best = -np.inf, None
    for ls in lengthscales:
        k = matern52(x, x, ls) + noise * np.eye(len(x))
        try:
            chol = np.linalg.cholesky(k)
        except np.linalg.LinAlgError:
            continue
        alpha = solve_triangular(chol.T, solve_triangular(chol, ys, lower=True), lower=False)
        ll = -0.5 * ys @ alpha - np.log(np.diag(chol)).sum()
        if ll > best_ll:
            best_ll, best = ll, (ls, chol, alpha)
    return best


def predict(cand: np.ndarray, x: np.ndarray, ls: float, chol: np.ndarray,
            alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and standard deviation at the rows of ``cand`` of a GP returned by :func:`fit` on ``x``."""
    from scipy.linalg import solve_triangular

    ks = matern52(cand, x, ls)
    v = solve_triangular(chol, ks.T, lower=True)
    return ks @ alpha, np.sqrt(np.maximum(1.0 - (v * v).sum(0), 1e-12))


def encode(space: SearchSpace, feasible: FeasibleSet) -> np.ndarray:
    """One row per feasible point: ordered choices as index / (choices - 1), categories one-hot.

    One-hot columns are scaled so that two categories are as far apart as the ends of a
    range; parameters with a single choice carry no distance and are left out.
    """
    cols = []
    for j, p in enumerate(space.params):
        if len(p.choices) < 2:
            continue
        codes = feasible.codes[:, j].astype(float)
        if p.ordered:
            cols.append((codes / (len(p.choices) - 1))[:, None])
        else:
            cols.append(np.eye(len(p.choices))[codes.astype(int)] / np.sqrt(2.0))
    return np.hstack(cols) if cols else np.zeros((len(feasible), 0))


@dataclass
class Fit:
    lengthscale: float
    chol: np.ndarray
    alpha: np.ndarray
    x: np.ndarray  # the training rows' features
    best: float  # the best standardised observation


class Surrogate:
    """A GP on standardised log-time over a strategy's feasible rows, for the strategies that rank by one.

    Failed points count as the strategy's penalty (worse than anything seen); points handed
    out but not yet told are constant liars at the best value. The length-scale is
    re-chosen by marginal likelihood every ``refit_every`` results, not on every ask.
    """

    def __init__(self, strategy: Strategy, noise: float, refit_every: int):
        self.strategy, self.noise, self.refit_every = strategy, float(noise), int(refit_every)
        self.features = encode(strategy.space, strategy.feasible)
        self._lengthscale: float | None = None
        self._fitted_at = 0

    def fit(self) -> Fit | None:
        s = self.strategy
        told = list(s.values)
        pen = s.penalty()
        y = np.log(np.array([s.values[r] if s.values[r] is not None else pen for r in told]))
        pending = [int(r) for r in np.flatnonzero(s.taken) if int(r) not in s.values]
        rows = told + pending
        y = np.concatenate([y, np.full(len(pending), y.min())])
        ys = (y - y.mean()) / max(y.std(), 1e-9)
        x = self.features[rows]
        refit = self._lengthscale is None or len(told) >= self._fitted_at + self.refit_every
        got = fit(x, ys, self.noise, LENGTHSCALES if refit else (self._lengthscale,))
        if got is None:
            return None
        ls, chol, alpha = got
        if refit:
            self._lengthscale, self._fitted_at = ls, len(told)
        return Fit(ls, chol, alpha, x, float(ys.min()))

    def predict(self, model: Fit, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return predict(self.features[rows], model.x, model.lengthscale, model.chol, model.alpha)


class GaussianProcess(Strategy):
    name = "gp"
    schema = {"startup": Option(10, int, 1), "candidates": Option(2000, int, 1),
              "noise": Option(1e-3, float, 1e-9, 1.0)}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model = Surrogate(self, float(self.options["noise"]), refit_every=10)

    def _propose(self) -> int | None:
        if len(self.values) < int(self.options["startup"]):
            return self.startup_row(int(self.options["startup"]))
        free = np.flatnonzero(~self.taken)
        if not len(free):
            return None
        ncand = int(self.options["candidates"])
        cand = self.rng.choice(free, size=ncand, replace=False) if len(free) > ncand else free
        model = self.model.fit()
        if model is None:
            return self.random_fresh()
        mu, sigma = self.model.predict(model, cand)
        return int(cand[int(np.argmax(expected_improvement(mu, sigma, model.best)))])

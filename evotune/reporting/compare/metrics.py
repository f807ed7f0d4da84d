"""The scores of a comparison: fraction of the optimum, evaluations to a fraction, the methodology score.

A run is the time of each evaluation in order (nan for a failed point); every
metric of a budget n reads its first n evaluations. Definitions in
``evotune/reporting/compare/__init__.py`` and the README's "Comparing strategies".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from evotune.core.landscape import Landscape, LandscapeError, landscape_stem, load_landscape
from evotune.core.result import Status
from evotune.core.space import Context, FeasibleSet, SearchSpace
from evotune.reporting.compare.plan import CompareError

Floats = npt.NDArray[np.float64]  # one time or fraction per evaluation (or per point)


@dataclass
class Run:
    """One run: each evaluation's time in order (nan: a failed point) and the strategy's time for it."""

    times: Floats
    step_ms: Floats


def time_of(result: Any) -> float:
    """An evaluation's time in ms; nan for a failed point or one the landscape lacks."""
    return float(result.time_ms) if result is not None and result.status is Status.OK else math.nan


def expected_random_best(valid_times: Sequence[float], n_points: int, max_n: int) -> Floats:
    """Expected best time of n points drawn uniformly without replacement, for n = 1..max_n.

    ``n_points`` counts every point of the landscape; the ``n_points - len(valid_times)``
    failed ones have no time. With t_1 <= ... <= t_V the sorted valid times and N the
    number of points, the best of a sample of n is t_i when the sample holds the point
    of t_i and none of the i - 1 faster ones: P = C(N - i, n - 1) / C(N, n). A sample
    of failed points only (P = C(N - V, n) / C(N, n)) counts as the slowest valid time.
    Beyond N, a sample is the whole landscape.
    """
    t = np.sort(np.asarray(valid_times, dtype=float))
    v, n_all = len(t), int(n_points)
    if v == 0 or n_all < v:
        raise ValueError("need at least one valid time and no more valid times than points")
    failed = n_all - v
    i = np.arange(1, v)  # p_{i+1} / p_i = (N - i - n + 1) / (N - i), for i = 1..V-1
    out = np.empty(max_n)
    for n in range(1, max_n + 1):
        m = min(n, n_all)
        ratios = np.clip(n_all - i - m + 1, 0, None) / (n_all - i)
        p = (m / n_all) * np.concatenate(([1.0], np.cumprod(ratios)))
        j = np.arange(m)
        p_none = float(np.prod((failed - j) / (n_all - j))) if m <= failed else 0.0
        out[n - 1] = float(p @ t) + p_none * t[-1]
    return out


def best_so_far(times: Sequence[float] | Floats, n: int) -> Floats:
    """Best valid time after each of the first ``n`` evaluations (nan before the first valid one).

    ``times`` holds one entry per evaluation in order, nan for a failed point; a run
    that stopped early (its strategy ran out of points) keeps its last best.
    """
    t = np.full(n, np.nan)
    got = np.asarray(times, dtype=float)[:n]
    t[: len(got)] = got
    return np.fmin.accumulate(t) if n else t


def fraction_curve(best: Floats, optimum: float) -> Floats:
    """optimum / best after each evaluation; 0 where nothing valid was found yet."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isnan(best), 0.0, optimum / best)


def evals_to(fraction: Floats, threshold: float) -> int:
    """Evaluations until ``fraction >= threshold``; ``len(fraction) + 1`` (budget + 1) if never."""
    hit = np.flatnonzero(fraction >= threshold)
    return int(hit[0]) + 1 if len(hit) else len(fraction) + 1


def run_score(best: Floats, random_best: Floats, optimum: float, worst: float) -> float:
    """Mean over n of (best(n) - random(n)) / (optimum - random(n)); nan best counts as ``worst``."""
    if not len(best):
        return 0.0
    b = np.where(np.isnan(best), worst, best)
    r = np.asarray(random_best[: len(b)], dtype=float)
    den = optimum - r
    flat = np.abs(den) <= 1e-12 * max(abs(optimum), 1e-300)
    with np.errstate(invalid="ignore", divide="ignore"):
        terms = np.where(flat, np.where(b <= optimum, 1.0, 0.0), (b - r) / np.where(flat, 1.0, den))
    return float(np.mean(terms))


@dataclass
class Case:
    """One landscape, with what every run on it needs."""

    name: str
    landscape: Landscape
    n_points: int
    optimum: float
    worst: float
    random_best: Floats = field(repr=False)
    _replay: tuple[SearchSpace, FeasibleSet, Floats] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: str, max_budget: int) -> Case:
        try:
            ls = load_landscape(path)
        except LandscapeError as exc:
            raise CompareError(f"--landscape: {exc}") from None
        times = ls.ok_times
        if not times:
            raise CompareError(f"--landscape: {path}: holds no valid time, so there is no optimum to compare with")
        return cls(landscape_stem(path), ls, len(ls), min(times), max(times),
                   expected_random_best(times, len(ls), max_budget))

    def replay(self) -> tuple[SearchSpace, FeasibleSet, Floats]:
        """The landscape's space, its feasible set (the recorded points) and each row's time (nan: failed)."""
        if self._replay is None:
            space = self.landscape.space()
            fs = space.feasible(Context(problem=self.landscape.problem))
            row_times = np.array([time_of(self.landscape.lookup(fs.point(r))) for r in range(len(fs))])
            self._replay = (space, fs, row_times)
        return self._replay


def run_metrics(run: Run, target: Case, budget: int) -> dict[str, Any]:
    """The metrics of the first ``budget`` evaluations of ``run``."""
    best = best_so_far(run.times, budget)
    frac = fraction_curve(best, target.optimum)
    steps = run.step_ms[:budget]
    return {
        "fraction": float(frac[-1]),
        "evals_to_95": evals_to(frac, 0.95),
        "evals_to_99": evals_to(frac, 0.99),
        "best_ms": None if math.isnan(best[-1]) else float(best[-1]),
        "optimum_ms": target.optimum,
        "ask_ms_mean": float(steps.mean()) if len(steps) else 0.0,
        "ask_ms_max": float(steps.max()) if len(steps) else 0.0,
        "score": run_score(best, target.random_best, target.optimum, target.worst),
        "curve": frac,
    }


def summarise(landscape: str, strategy: str, budget: int, ms: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary row: the median and quartiles of the fraction, median evaluations to 95% / 99%, mean score."""
    fr = np.array([m["fraction"] for m in ms])
    return {
        "landscape": landscape, "strategy": strategy, "budget": budget, "repeats": len(ms),
        "median_fraction": float(np.median(fr)), "p25_fraction": float(np.percentile(fr, 25)),
        "p75_fraction": float(np.percentile(fr, 75)),
        "median_evals_to_95": float(np.median([m["evals_to_95"] for m in ms])),
        "median_evals_to_99": float(np.median([m["evals_to_99"] for m in ms])),
        "score": float(np.mean([m["score"] for m in ms])),
    }


def geometric_mean(xs: Sequence[float]) -> float:
    """Of fractions or ratios: nan for none, 0 when any is 0 or below."""
    if not xs:
        return math.nan
    if min(xs) <= 0:
        return 0.0
    return math.exp(sum(math.log(x) for x in xs) / len(xs))

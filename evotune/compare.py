"""Compare search strategies on recorded landscapes, in memory: no Optuna storage, no GPU.

``python -m evotune compare --landscape PATH ... --strategy NAME ... --budget N ... --repeats R --seed S --out DIR``
drives every strategy directly with ``ask(1)`` / ``tell`` against each landscape
(Kernel Tuner cache files or evotune landscapes, read by ``load_landscape``)
and writes, under ``DIR``:

* ``summary.csv``: one row per (landscape, strategy, budget), columns :data:`SUMMARY_COLUMNS`;
* ``runs.csv``: one row per run (landscape, strategy, budget, seed), columns :data:`RUN_COLUMNS`;
* ``<landscape>.png``: fraction of the optimum against evaluations, one curve per
  strategy (median over the repeats, inter-quartile band);
* ``README.md``: what the files hold, the definitions below and :data:`KT_CAVEAT`.

Definitions
-----------
* **Evaluation**: one distinct point the landscape holds, failed entries included.
  Points the landscape lacks are infeasible and cost nothing: with
  ``space = landscape.space()`` a strategy is only ever handed recorded points.
* **fraction** = optimum time / best time found within the budget (0 when
  nothing valid was found); 1.0 is the landscape's optimum.
* **evals_to_95 / evals_to_99**: the number of evaluations until the best found
  is within 5% / 1% of the optimum (``optimum / best >= 0.95 / 0.99``);
  **budget + 1 when it is never reached** within the budget.
* **score**: the methodology score of Willemsen et al. (2024), averaged over the
  evaluation counts n = 1..budget of
  ``(best(n) - random(n)) / (optimum - random(n))``, on time (lower is better):
  1 = the optimum, 0 = as good as random search, negative = worse than random.
  ``random(n)`` is the *expected* best time of n points drawn uniformly without
  replacement from the landscape's points, computed exactly
  (:func:`expected_random_best`). A failed point has no time: until a run (or a
  random sample) holds a valid point, its best counts as the slowest valid time
  of the landscape. Where ``random(n)`` is already the optimum, the term is 1 if
  the run is at the optimum too, else 0. The summary's score is the mean over the
  repeats, which equals the score of the mean curve (the score is linear in best(n)).
* **ask_ms**: the strategy's own time per evaluation (``ask(1)`` plus ``tell``),
  in milliseconds; for ``kt:`` strategies, Kernel Tuner's ``strategy_time``.

Every budget is read off one long run per (landscape, strategy, seed) up to the
largest budget: the first n evaluations of a run are exactly the run a budget
of n would have made, for every strategy whose proposals do not depend on the
budget. No evotune strategy reads its budget. Of Kernel Tuner's,
``simulated_annealing`` (its cooling schedule) and ``dual_annealing`` (scipy's
``maxfun``) do: they get one run per budget instead.

Kernel Tuner (``kt:NAME``, needs ``pip install 'evotune[bench]'``) runs in its
simulation mode (``kernel_tuner.tune_cache``) on a temporary, uncompressed
Kernel Tuner copy of the same landscape; the configurations it evaluated, in
order and without repeats, are mapped back to the landscape's times so the
same metrics apply. It is seeded through Python's ``random`` and NumPy's global
generator (seed + r, as for evotune), and scipy's Latin hypercube sampler,
which Kernel Tuner leaves unseeded, draws its seed from that stream: the
sequence of evaluations is then the same for a seed, in this process and
across processes. :data:`KT_CAVEAT` applies.

Deterministic for a given ``--seed`` (repeat r uses seed + r): every column of
both CSVs except the two ``ask_ms`` timings.

Example::

    from evotune.compare import make_plan, compare
    result = compare(make_plan(["pnpoly.json.gz"], ["ga", "random"], ["25", "50"], "5", "0", "out"))
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import inspect
import io
import json
import math
import random
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evotune.evaluation.landscape import Landscape, LandscapeError, landscape_stem, load_landscape
from evotune.evaluation.result import Status
from evotune.space import Context, FeasibleSet, SearchSpace
from evotune.strategies import STRATEGIES, make_strategy

SUMMARY_COLUMNS = ["landscape", "strategy", "budget", "repeats", "median_fraction", "p25_fraction", "p75_fraction",
                   "median_evals_to_95", "median_evals_to_99", "score"]
RUN_COLUMNS = ["landscape", "strategy", "budget", "seed", "fraction", "evals_to_95", "evals_to_99", "best_ms",
               "optimum_ms", "ask_ms_mean", "ask_ms_max"]
KT_PREFIX = "kt:"
KT_STRATEGIES = ("genetic_algorithm", "pso", "simulated_annealing", "dual_annealing", "diff_evo",
                 "firefly_algorithm", "random_sample")
#: Kernel Tuner strategies whose proposals depend on max_fevals: one run per budget
KT_BUDGET_DEPENDENT = frozenset({"simulated_annealing", "dual_annealing"})
#: evotune strategies that need a package evotune does not install
NEEDS = {"optuna-gp": "torch"}
KT_CAVEAT = ("Kernel Tuner's tune_cache simulation searches only the error-free entries of a file, "
             "while evotune pays for failing ones.")
MAX_SEED = 2**32 - 1  # NumPy's global generator (seeded for kt: strategies) takes 32-bit seeds


class CompareError(ValueError):
    """A bad argument or input; one line, shown by the command line with exit code 2."""


# -- the metrics --------------------------------------------------------------
def expected_random_best(valid_times: Sequence[float], n_points: int, max_n: int) -> np.ndarray:
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


def best_so_far(times: Sequence[float], n: int) -> np.ndarray:
    """Best valid time after each of the first ``n`` evaluations (nan before the first valid one).

    ``times`` holds one entry per evaluation in order, nan for a failed point; a run
    that stopped early (its strategy ran out of points) keeps its last best.
    """
    t = np.full(n, np.nan)
    got = np.asarray(times, dtype=float)[:n]
    t[: len(got)] = got
    return np.fmin.accumulate(t) if n else t


def fraction_curve(best: np.ndarray, optimum: float) -> np.ndarray:
    """optimum / best after each evaluation; 0 where nothing valid was found yet."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isnan(best), 0.0, optimum / best)


def evals_to(fraction: np.ndarray, threshold: float) -> int:
    """Evaluations until ``fraction >= threshold``; ``len(fraction) + 1`` (budget + 1) if never."""
    hit = np.flatnonzero(fraction >= threshold)
    return int(hit[0]) + 1 if len(hit) else len(fraction) + 1


def run_score(best: np.ndarray, random_best: np.ndarray, optimum: float, worst: float) -> float:
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


# -- what is compared ---------------------------------------------------------
@dataclass
class Target:
    """One landscape, with what every run on it needs."""

    name: str
    landscape: Landscape
    n_points: int
    optimum: float
    worst: float
    random_best: np.ndarray = field(repr=False)
    _replay: tuple[SearchSpace, FeasibleSet, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, path: str, max_budget: int) -> Target:
        try:
            ls = load_landscape(path)
        except LandscapeError as exc:
            raise CompareError(f"--landscape: {exc}") from None
        times = ls.ok_times
        if not times:
            raise CompareError(f"--landscape: {path}: holds no valid time, so there is no optimum to compare with")
        return cls(landscape_stem(path), ls, len(ls), min(times), max(times),
                   expected_random_best(times, len(ls), max_budget))

    def replay(self) -> tuple[SearchSpace, FeasibleSet, np.ndarray]:
        """The landscape's space, its feasible set (the recorded points) and each row's time (nan: failed)."""
        if self._replay is None:
            space = self.landscape.space()
            fs = space.feasible(Context(problem=self.landscape.problem))
            row_times = np.array([_time(self.landscape.lookup(fs.point(r))) for r in range(len(fs))])
            self._replay = (space, fs, row_times)
        return self._replay


def _time(result: Any) -> float:
    return float(result.time_ms) if result is not None and result.status is Status.OK else math.nan


@dataclass
class Run:
    """One run: each evaluation's time in order (nan: a failed point) and the strategy's time for it."""

    times: np.ndarray
    step_ms: np.ndarray


@dataclass
class Plan:
    landscapes: list[str]
    strategies: list[str]
    budgets: list[int]
    repeats: int
    seed: int
    out: Path

    @property
    def seeds(self) -> list[int]:
        return [self.seed + r for r in range(self.repeats)]


def available() -> tuple[list[str], dict[str, str]]:
    """Strategy names that can run here, and those that cannot with the reason."""
    ok, missing = [], {}
    for name in sorted(STRATEGIES):
        need = NEEDS.get(name)
        if need and importlib.util.find_spec(need) is None:
            missing[name] = f"needs {need}, which is not installed"
        else:
            ok.append(name)
    kt = [KT_PREFIX + n for n in KT_STRATEGIES]
    if importlib.util.find_spec("kernel_tuner") is None:
        missing.update({n: "needs kernel_tuner: pip install 'evotune[bench]'" for n in kt})
    else:
        ok.extend(kt)
    return ok, missing


def _positive_int(flag: str, text: str, low: int = 1) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise CompareError(f"{flag}: expected an integer >= {low}, got {text!r}")
    return value


def make_plan(landscapes: Sequence[str], strategies: Sequence[str], budgets: Sequence[str | int],
              repeats: str | int | None, seed: str | int | None, out: str | None) -> Plan:
    """Check the command line's arguments; raise CompareError (one line) for the first bad one."""
    if not landscapes:
        raise CompareError("--landscape PATH is required (Kernel Tuner cache file or evotune landscape)")
    if not strategies:
        raise CompareError("--strategy NAME is required; accepted: " + ", ".join(available()[0]))
    if not budgets:
        raise CompareError("--budget N is required (evaluations per run; give it several times for several budgets)")
    if not out:
        raise CompareError("--out DIR is required (where summary.csv, runs.csv and the plots go)")
    names = [landscape_stem(p) for p in landscapes]
    for p, name in zip(landscapes, names, strict=True):
        if names.count(name) > 1:
            raise CompareError(f"--landscape: two landscapes are named {name!r} ({p}); rename one")
    ok, missing = available()
    for s in strategies:
        if strategies.count(s) > 1:
            raise CompareError(f"--strategy: {s!r} is given twice")
        if s in missing:
            raise CompareError(f"--strategy: {s} is unavailable here: {missing[s]}")
        if s not in ok:
            hint = f"; Kernel Tuner's: {', '.join(KT_PREFIX + n for n in KT_STRATEGIES)}" if s.startswith(KT_PREFIX) \
                else ""
            raise CompareError(f"--strategy: unknown {s!r}; accepted: {', '.join(n for n in ok)}{hint}")
    parsed_budgets = sorted({_positive_int("--budget", b) for b in budgets})
    n_repeats = _positive_int("--repeats", repeats if repeats is not None else 5)
    first_seed = _positive_int("--seed", seed if seed is not None else 0, low=0)
    if first_seed + n_repeats - 1 > MAX_SEED:
        raise CompareError(f"--seed: seed + repeats - 1 must be at most {MAX_SEED}")
    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():
        raise CompareError(f"--out: {out} exists and is not a folder")
    return Plan(list(landscapes), list(strategies), parsed_budgets, n_repeats, first_seed, out_dir)


# -- running ------------------------------------------------------------------
def run_evotune(target: Target, name: str, seed: int, budget: int, **options: Any) -> Run:
    """Drive an evotune strategy (with ``options``) by ask(1) / tell against the landscape, up to ``budget``."""
    space, fs, row_times = target.replay()
    ctx = Context(problem=target.landscape.problem)
    strategy = make_strategy(name, space, fs, seed=seed, ctx=ctx, budget=budget, **options)
    clock = time.perf_counter
    times: list[float] = []
    steps: list[float] = []
    while len(times) < budget:
        t0 = clock()
        points = strategy.ask(1)
        t1 = clock()
        if not points:
            break  # every recorded point has been evaluated
        t = float(row_times[fs.row(points[0])])
        t2 = clock()
        strategy.tell([(points[0], None if math.isnan(t) else t)])
        t3 = clock()
        times.append(t)
        steps.append((t1 - t0 + t3 - t2) * 1e3)
    return Run(np.array(times, dtype=float), np.array(steps, dtype=float))


class KernelTunerSim:
    """Kernel Tuner's strategies in simulation mode on temporary copies of the landscapes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._files: dict[str, tuple[Path, list[dict[Any, Any]]]] = {}

    def cache_file(self, target: Target) -> tuple[Path, list[dict[Any, Any]]]:
        """An uncompressed Kernel Tuner cache file of the landscape, and per parameter KT value -> choice."""
        if target.name not in self._files:
            doc, inverse = kt_cache_document(target.landscape)
            path = self.folder / f"{target.name}.json"
            path.write_text(json.dumps(doc))
            self._files[target.name] = (path, inverse)
        return self._files[target.name]

    def run(self, target: Target, name: str, seed: int, budget: int) -> Run:
        from kernel_tuner import tune_cache

        path, inverse = self.cache_file(target)
        ls = target.landscape
        names = ls.names
        try:
            with _kt_seeded(seed), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                results, _ = tune_cache(str(path), strategy=name, strategy_options={"max_fevals": budget},
                                        quiet=True)
        except Exception as exc:  # Kernel Tuner raises anything: name it on one line
            raise CompareError(f"{target.name}: kt:{name}: Kernel Tuner failed: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        seen: set[tuple[Any, ...]] = set()
        times: list[float] = []
        steps: list[float] = []
        for r in results:
            if not r or "__error__" in r:
                continue  # a configuration outside its search space: Kernel Tuner does not count it either
            key = tuple(inv[r[n]] for inv, n in zip(inverse, names, strict=True))
            if key in seen:
                continue  # a repeat is served from its cache, free
            seen.add(key)
            times.append(_time(ls.entries.get(key)))
            steps.append(float(r.get("strategy_time") or 0.0))
            if len(times) >= budget:
                break
        return Run(np.array(times, dtype=float), np.array(steps, dtype=float))


def _kt_value(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str)) else json.dumps(v)


def kt_cache_document(ls: Landscape) -> tuple[dict[str, Any], list[dict[Any, Any]]]:
    """The landscape as a Kernel Tuner cache file (failed entries included), and the value maps back."""
    names = ls.names
    inverse = [{_kt_value(c): c for c in p.choices} for p in ls.params]
    cache = {}
    for key, res in ls.entries.items():
        values = [_kt_value(v) for v in key]
        entry: dict[str, Any] = dict(zip(names, values, strict=True))
        if res.status is Status.OK:
            entry["time"] = res.time_ms
            entry["times"] = list(res.samples_ms)
        else:
            entry["time"] = "CompilationFailedConfig" if res.status is Status.COMPILE_ERROR else "RuntimeFailedConfig"
        entry.update(compile_time=res.compile_s * 1e3, verification_time=0.0, benchmark_time=res.bench_s * 1e3)
        cache[",".join(str(v) for v in values)] = entry
    size = ls.meta.get("problem_size")
    if not (isinstance(size, int) or (isinstance(size, list) and all(isinstance(x, int) for x in size))):
        size = 1
    doc = {"device_name": str(ls.meta.get("device") or "unknown"), "kernel_name": ls.problem.kind or "kernel",
           "problem_size": size, "tune_params_keys": names,
           "tune_params": {p.name: [_kt_value(c) for c in p.choices] for p in ls.params},
           "objective": "time", "cache": cache}
    return doc, inverse


@contextlib.contextmanager
def _kt_seeded(seed: int) -> Iterator[None]:
    """Seed Python's and NumPy's global generators, and scipy's Latin hypercube from them; restore after."""
    import scipy.stats.qmc as qmc

    py_state, np_state = random.getstate(), np.random.get_state()
    original = qmc.LatinHypercube
    seed_kw = "rng" if "rng" in inspect.signature(original).parameters else "seed"

    def seeded_latin_hypercube(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rng") is None and kwargs.get("seed") is None:
            kwargs[seed_kw] = int(np.random.randint(2**31 - 1))
        return original(*args, **kwargs)

    random.seed(seed)
    np.random.seed(seed)
    qmc.LatinHypercube = seeded_latin_hypercube
    try:
        yield
    finally:
        qmc.LatinHypercube = original
        random.setstate(py_state)
        np.random.set_state(np_state)


# -- the comparison -----------------------------------------------------------
@dataclass
class Result:
    summary: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    files: list[Path]


def measure(run: Run, target: Target, budget: int) -> dict[str, Any]:
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


def budget_dependent(strategy: str) -> bool:
    return strategy.startswith(KT_PREFIX) and strategy.removeprefix(KT_PREFIX) in KT_BUDGET_DEPENDENT


def compare(plan: Plan, progress: Callable[[str], None] | None = None) -> Result:
    """Run every (landscape, strategy, seed), write the CSVs, plots and README; return the rows."""
    max_budget = plan.budgets[-1]
    targets = [Target.load(p, max_budget) for p in plan.landscapes]
    plan.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    files: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="evotune-compare-") as tmp:
        kt = KernelTunerSim(Path(tmp))
        for target in targets:
            curves: dict[str, list[np.ndarray]] = {}
            for strategy in plan.strategies:
                started = time.perf_counter()
                per_budget: dict[int, list[dict[str, Any]]] = {b: [] for b in plan.budgets}
                for seed in plan.seeds:
                    if strategy.startswith(KT_PREFIX):
                        name = strategy.removeprefix(KT_PREFIX)
                        if budget_dependent(strategy):
                            made = {b: kt.run(target, name, seed, b) for b in plan.budgets}
                        else:
                            one = kt.run(target, name, seed, max_budget)
                            made = dict.fromkeys(plan.budgets, one)
                    else:
                        one = run_evotune(target, strategy, seed, max_budget)
                        made = dict.fromkeys(plan.budgets, one)
                    for b in plan.budgets:
                        m = measure(made[b], target, b)
                        per_budget[b].append(m)
                        runs.append({"landscape": target.name, "strategy": strategy, "budget": b, "seed": seed,
                                     **{k: v for k, v in m.items() if k in RUN_COLUMNS}})
                    curves.setdefault(strategy, []).append(per_budget[max_budget][-1]["curve"])
                for b in plan.budgets:
                    summary.append(_summarise(target.name, strategy, b, per_budget[b]))
                if progress:
                    progress(f"{target.name}: {strategy}: {plan.repeats} run{'s' if plan.repeats > 1 else ''} "
                             f"in {time.perf_counter() - started:.1f} s")
            files.append(plot_landscape(target, curves, plan.out / f"{target.name}.png"))
    files[:0] = [write_csv(plan.out / "summary.csv", SUMMARY_COLUMNS, summary),
                 write_csv(plan.out / "runs.csv", RUN_COLUMNS, runs),
                 write_readme(plan, plan.out / "README.md")]
    return Result(summary, runs, files)


def _summarise(landscape: str, strategy: str, budget: int, ms: list[dict[str, Any]]) -> dict[str, Any]:
    fr = np.array([m["fraction"] for m in ms])
    return {
        "landscape": landscape, "strategy": strategy, "budget": budget, "repeats": len(ms),
        "median_fraction": float(np.median(fr)), "p25_fraction": float(np.percentile(fr, 25)),
        "p75_fraction": float(np.percentile(fr, 75)),
        "median_evals_to_95": float(np.median([m["evals_to_95"] for m in ms])),
        "median_evals_to_99": float(np.median([m["evals_to_99"] for m in ms])),
        "score": float(np.mean([m["score"] for m in ms])),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.6g}"
    return str(v)


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow([_fmt(row[c]) for c in columns])
    return path


def geometric_mean(xs: Sequence[float]) -> float:
    """Of fractions or ratios: nan for none, 0 when any is 0 or below."""
    if not xs:
        return math.nan
    if min(xs) <= 0:
        return 0.0
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# -- outputs ------------------------------------------------------------------
def plot_landscape(target: Target, curves: dict[str, list[np.ndarray]], path: Path) -> Path:
    """Fraction of the optimum against evaluations: median and IQR over the repeats, per strategy."""
    from evotune.plots import _band, _save, plt  # matplotlib (Agg) only when plotting

    fig, ax = plt.subplots(figsize=(8, 4.8))
    n = max((len(c) for cs in curves.values() for c in cs), default=0)
    x = np.arange(1, n + 1)
    for i, (strategy, cs) in enumerate(curves.items()):
        lo, med, hi = _band(cs)
        color = f"C{i}"
        ax.plot(x, med, color=color, label=f"{strategy} ({len(cs)} seed{'s' if len(cs) > 1 else ''})")
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
    if n:
        ax.plot(x, target.optimum / target.random_best[:n], color="k", linestyle=":", linewidth=1.2,
                label="uniform random: optimum / expected best")
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_xlabel("evaluations (distinct recorded points; failed ones count, except for kt: strategies)")
    ax.set_ylabel("fraction of optimum reached (1 = best in landscape)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{target.name}: {target.n_points} points, optimum {target.optimum:.4g} ms "
                 "(median and inter-quartile band over seeds)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def write_readme(plan: Plan, path: Path) -> Path:
    kt_version = ""
    if any(s.startswith(KT_PREFIX) for s in plan.strategies):
        from importlib.metadata import version

        kt_version = f" Kernel Tuner {version('kernel_tuner')}."
    args = " ".join([*(f"--landscape {p}" for p in plan.landscapes), *(f"--strategy {s}" for s in plan.strategies),
                     *(f"--budget {b}" for b in plan.budgets), f"--repeats {plan.repeats}", f"--seed {plan.seed}",
                     f"--out {plan.out}"])
    text = f"""# evotune compare

Made by `python -m evotune compare {args}`.{kt_version}

* `summary.csv`: one row per (landscape, strategy, budget): the median and quartiles of the
  fraction over the {plan.repeats} repeats (seeds {plan.seeds[0]}..{plan.seeds[-1]}), the median evaluations
  to 95% and 99% of the optimum, and the mean score.
* `runs.csv`: one row per run and budget.
* `<landscape>.png`: fraction of the optimum against evaluations, median and inter-quartile band per strategy.

Definitions:

* An evaluation is one distinct point the landscape holds, failed entries included; points
  the landscape lacks are infeasible and cost nothing.
* fraction = optimum time / best time found within the budget (0 if nothing valid was found).
* evals_to_95 / evals_to_99: evaluations until optimum / best >= 0.95 / 0.99; budget + 1 when
  never reached within the budget.
* score: Willemsen et al. (2024), the mean over n = 1..budget of
  (best(n) - random(n)) / (optimum - random(n)) on time: 1 = optimum, 0 = as good as uniform
  random sampling without replacement (random(n) is its exact expected best time), negative =
  worse than random. Until a run holds a valid point, its best counts as the slowest valid time.
* ask_ms: the strategy's own time per evaluation (ask plus tell), milliseconds; for kt:
  strategies Kernel Tuner's strategy_time. The only columns that differ between two runs
  with the same seed.
* Every budget is read off one run per (landscape, strategy, seed) up to the largest budget,
  which equals a run with the smaller budget for every strategy whose proposals do not
  depend on its budget; kt:simulated_annealing and kt:dual_annealing do, and get one run per budget.

{KT_CAVEAT}
"""
    path.write_text(text)
    return path


def summary_table(rows: list[dict[str, Any]]) -> Any:
    """summary.csv as a compact rich table."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape("Strategy comparison (fraction of optimum: median [p25, p75] over repeats)"))
    for col, justify in (("landscape", "left"), ("strategy", "left"), ("budget", "right"), ("fraction", "right"),
                         ("evals to 95%", "right"), ("evals to 99%", "right"), ("score", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(r["landscape"], r["strategy"], str(r["budget"]),
                      escape(f"{r['median_fraction']:.3f} [{r['p25_fraction']:.3f}, {r['p75_fraction']:.3f}]"),
                      _fmt(r["median_evals_to_95"]), _fmt(r["median_evals_to_99"]), f"{r['score']:.3f}")
    return table

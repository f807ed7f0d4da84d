"""The run plan of a comparison and the runner: every (landscape, strategy, seed), in memory.

:func:`make_compare_plan` checks the command line's arguments (one-line :class:`CompareError`
for the first bad one); :func:`compare` loads each landscape once (:class:`Case`),
drives evotune's strategies by ``ask(1)`` / ``tell`` against it and Kernel Tuner's
through :mod:`evotune.reporting.compare.kernel_tuner_sim`, reads every budget off one run
per seed (one run per budget for the strategies whose proposals depend on it),
and writes the outputs of :mod:`evotune.reporting.compare.outputs`.
"""

from __future__ import annotations

import importlib.util
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evotune.core.landscape import landscape_stem
from evotune.core.space import Context
from evotune.reporting.compare.kernel_tuner_sim import (
    KT_PREFIX,
    KT_STRATEGIES,
    KernelTunerFailed,
    KernelTunerSim,
    budget_dependent,
)
from evotune.reporting.compare.metrics import Case, Floats, Run, run_metrics, summarise
from evotune.reporting.compare.outputs import RUN_COLUMNS, SUMMARY_COLUMNS, plot_landscape, write_csv, write_readme
from evotune.reporting.compare.plan import CompareError, ComparePlan
from evotune.search.strategies import STRATEGIES, Source, make_strategy

#: evotune strategies that need a package evotune does not install
NEEDS = {"optuna-gp": "torch"}
MAX_SEED = 2**32 - 1  # NumPy's global generator (seeded for kt: strategies) takes 32-bit seeds


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
        missing.update({n: "needs kernel_tuner: pip install '.[bench]' in the evotune clone" for n in kt})
    else:
        ok.extend(kt)
    return ok, missing


def _positive_int(flag: str, text: str | int, low: int = 1) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < low:
        raise CompareError(f"{flag}: expected an integer >= {low}, got {text!r}")
    return value


def make_compare_plan(landscapes: Sequence[str], strategies: Sequence[str], budgets: Sequence[str | int],
                      repeats: str | int | None, seed: str | int | None, out: str | None) -> ComparePlan:
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
    return ComparePlan(list(landscapes), list(strategies), parsed_budgets, n_repeats, first_seed, out_dir)


# -- running ------------------------------------------------------------------
def run_evotune(target: Case, name: str, seed: int, budget: int, sources: Sequence[Source] = (),
                until_fraction: float | None = None, **options: Any) -> Run:
    """Drive an evotune strategy (with ``options``, and ``sources`` to transfer from) by ask(1) / tell against
    the landscape, up to ``budget``.

    With ``until_fraction``, the run stops at the first evaluation whose time reaches that fraction of the optimum
    (1.0: the optimum itself). A stopped run keeps that best at every later budget (:func:`best_so_far`), so its
    evaluations to the fraction are the whole run's, and with 1.0 every fraction of the optimum is too."""
    space, fs, row_times = target.replay()
    ctx = Context(problem=target.landscape.problem)
    strategy = make_strategy(name, space, fs, seed=seed, ctx=ctx, sources=sources, **options)
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
        if until_fraction is not None and target.optimum / t >= until_fraction:  # as fraction_curve divides
            break
    return Run(np.array(times, dtype=float), np.array(steps, dtype=float))


@dataclass
class Result:
    summary: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    files: list[Path]


def _kt_run(kt: KernelTunerSim, target: Case, name: str, seed: int, budget: int) -> Run:
    try:
        return kt.run(target.name, target.landscape, name, seed, budget)
    except KernelTunerFailed as exc:
        raise CompareError(f"{target.name}: {exc}") from None


def compare(plan: ComparePlan, progress: Callable[[str], None] | None = None) -> Result:
    """Run every (landscape, strategy, seed), write the CSVs, plots and README; return the rows."""
    max_budget = plan.budgets[-1]
    targets = [Case.load(p, max_budget) for p in plan.landscapes]
    plan.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    files: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="evotune-compare-") as tmp:
        kt = KernelTunerSim(Path(tmp))
        for target in targets:
            curves: dict[str, list[Floats]] = {}
            for strategy in plan.strategies:
                started = time.perf_counter()
                per_budget: dict[int, list[dict[str, Any]]] = {b: [] for b in plan.budgets}
                for seed in plan.seeds:
                    if strategy.startswith(KT_PREFIX):
                        name = strategy.removeprefix(KT_PREFIX)
                        if budget_dependent(strategy):
                            made = {b: _kt_run(kt, target, name, seed, b) for b in plan.budgets}
                        else:
                            one = _kt_run(kt, target, name, seed, max_budget)
                            made = dict.fromkeys(plan.budgets, one)
                    else:
                        one = run_evotune(target, strategy, seed, max_budget)
                        made = dict.fromkeys(plan.budgets, one)
                    for b in plan.budgets:
                        m = run_metrics(made[b], target, b)
                        per_budget[b].append(m)
                        runs.append({"landscape": target.name, "strategy": strategy, "budget": b, "seed": seed,
                                     **{k: v for k, v in m.items() if k in RUN_COLUMNS}})
                    curves.setdefault(strategy, []).append(per_budget[max_budget][-1]["curve"])
                for b in plan.budgets:
                    summary.append(summarise(target.name, strategy, b, per_budget[b]))
                if progress:
                    progress(f"{target.name}: {strategy}: {plan.repeats} run{'s' if plan.repeats > 1 else ''} "
                             f"in {time.perf_counter() - started:.1f} s")
            files.append(plot_landscape(target, curves, plan.out / f"{target.name}.png"))
    files[:0] = [write_csv(plan.out / "summary.csv", SUMMARY_COLUMNS, summary),
                 write_csv(plan.out / "runs.csv", RUN_COLUMNS, runs),
                 write_readme(plan, plan.out / "README.md")]
    return Result(summary, runs, files)

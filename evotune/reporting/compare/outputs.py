"""What a comparison writes: ``summary.csv``, ``runs.csv``, ``README.md`` and a PNG per landscape; the printed table."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from evotune.reporting.compare.kernel_tuner_sim import KT_CAVEAT, KT_PREFIX

if TYPE_CHECKING:
    from evotune.reporting.compare.metrics import Case, Floats
    from evotune.reporting.compare.plan import ComparePlan

SUMMARY_COLUMNS = ["landscape", "strategy", "budget", "repeats", "median_fraction", "p25_fraction", "p75_fraction",
                   "median_evals_to_95", "median_evals_to_99", "score"]
RUN_COLUMNS = ["landscape", "strategy", "budget", "seed", "fraction", "evals_to_95", "evals_to_99", "best_ms",
               "optimum_ms", "ask_ms_mean", "ask_ms_max"]


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


def plot_landscape(target: Case, curves: dict[str, list[Floats]], path: Path) -> Path:
    """Fraction of the optimum against evaluations: median and IQR over the repeats, per strategy."""
    import matplotlib.pyplot as plt  # matplotlib only when plotting (plots selects its Agg backend on import)

    from evotune.reporting.plots import _band, _save

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


def write_readme(plan: ComparePlan, path: Path) -> Path:
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
    from rich.console import JustifyMethod
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape("Strategy comparison (fraction of optimum: median [p25, p75] over repeats)"))
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("landscape", "left"), ("strategy", "left"), ("budget", "right"), ("fraction", "right"),
        ("evals to 95%", "right"), ("evals to 99%", "right"), ("score", "right"))
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for r in rows:
        table.add_row(r["landscape"], r["strategy"], str(r["budget"]),
                      escape(f"{r['median_fraction']:.3f} [{r['p25_fraction']:.3f}, {r['p75_fraction']:.3f}]"),
                      _fmt(r["median_evals_to_95"]), _fmt(r["median_evals_to_99"]), f"{r['score']:.3f}")
    return table

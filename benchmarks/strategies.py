"""Sample efficiency of evotune's strategies against Kernel Tuner's, on the twelve shipped Kernel Tuner landscapes.

Runs :func:`evotune.reporting.compare.compare` once per strategy (each into its own
sub-folder of ``--out``, so a strategy that already has results for the same
landscapes, budgets, repeats and seed is reused with ``--reuse``), then writes
and prints, per budget, a markdown table of the fraction of the optimum per
strategy, the checks below and ``default``'s ask() overhead, and draws
``strategies.png`` (the geometric means against the budget, all / tuning / held-out).

The landscapes are ``evotune/landscapes/kerneltuner/*.json.gz`` unless
``--landscape`` names others (the H100 ones under ``evotune/landscapes/h100/``
are left out by default: the halves below are those of the twelve).

Aggregation: for each (landscape, strategy, budget) the **median over repeats**
of the fraction of the optimum (``compare``'s ``median_fraction``); across
landscapes, the **geometric mean** of those medians (``gmean``) and their
median (``median``). Both are given for all landscapes, for the *tuning half*
(landscapes sorted by file name, even positions: 0, 2, 4, ...; default's
hyper-parameters were chosen on these) and for the *held-out half* (odd positions).

Checks:

* ``default at B >= best KT at 2B``: the geometric mean of default's medians at
  budget B against the largest geometric mean of any ``kt:`` strategy at 2B
  (for every B whose 2B was run), per landscape set;
* ``default >= random / ga``: on every landscape and budget, default's median
  fraction is at least random's and ga's (ties at 1.0 count as held; the count
  of strict wins is shown too);
* ``ask() overhead``: default's mean ask+tell time per evaluation in runs of
  the largest budget (compare's ``ask_ms_mean``), mean and max over runs.

Usage::

    nice -n 10 python benchmarks/strategies.py                         # the full run, into runs/bench_strategies
    nice -n 10 python benchmarks/strategies.py --out /tmp/b --repeats 5 --budget 25 --budget 50 \\
        --strategy default --strategy random --reuse                                   # a reduced one
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.reporting.compare import (  # noqa: E402
    KT_PREFIX,
    KT_STRATEGIES,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    compare,
    make_compare_plan,
    write_csv,
)
from evotune.reporting.compare import geometric_mean as gmean  # noqa: E402

KT_DIR = ROOT / "evotune" / "landscapes" / "kerneltuner"
BUDGETS = (25, 50, 100, 200, 400)
STRATEGIES = ("default", "ga", "random", "tpe", *(KT_PREFIX + n for n in KT_STRATEGIES))


def landscapes() -> list[Path]:
    """The Kernel Tuner landscapes shipped under evotune/landscapes/kerneltuner/, by name."""
    found = sorted(KT_DIR.glob("*.json.gz"))
    if not found:
        raise SystemExit(f"no landscapes under {KT_DIR}: a checkout without them? name some with --landscape")
    return found


def halves(names: list[str]) -> tuple[list[str], list[str]]:
    """(tuning half, held-out half): names sorted, alternately."""
    ordered = sorted(names)
    return ordered[0::2], ordered[1::2]


def run_strategy(strategy: str, paths: list[Path], budgets: list[int], repeats: int, seed: int, out: Path,
                 reuse: bool) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """compare() for one strategy into out/<strategy>/; the rows of its summary.csv and of its runs.csv."""
    folder = out / strategy.replace(":", "_")
    stamp = {"landscapes": [str(p) for p in paths], "budgets": budgets, "repeats": repeats, "seed": seed}
    stamp_file = folder / "plan.json"
    if not (reuse and stamp_file.exists() and json.loads(stamp_file.read_text()) == stamp):
        started = time.perf_counter()
        plan = make_compare_plan([str(p) for p in paths], [strategy], budgets, repeats, seed, str(folder))
        compare(plan)
        stamp_file.write_text(json.dumps(stamp))
        print(f"# {strategy}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    with (folder / "summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    with (folder / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    return summary, runs


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return math.nan if not n else (s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2]))


def report(summary: list[dict[str, str]], runs: list[dict[str, str]], strategies: list[str],
           budgets: list[int]) -> str:
    med: dict[tuple[str, str, int], float] = {
        (r["landscape"], r["strategy"], int(r["budget"])): float(r["median_fraction"]) for r in summary}
    names = sorted({r["landscape"] for r in summary})
    tune, held = halves(names)
    sets = {"all": names, "tuning half": tune, "held-out half": held}
    kt = [s for s in strategies if s.startswith(KT_PREFIX)]
    lines = [f"Landscapes ({len(names)}). Tuning half: {', '.join(tune)}. Held-out half: {', '.join(held)}.", "",
             "Median fraction of the optimum over repeats, per landscape; aggregated over landscapes as "
             "gmean = geometric mean, median = median.", ""]

    def agg(strategy: str, b: int, which: list[str], fn: Any = gmean) -> float:
        xs = [med[(n, strategy, b)] for n in which if (n, strategy, b) in med]
        return fn(xs) if len(xs) == len(which) else math.nan

    for b in budgets:
        lines += [f"### budget {b}", "", "| strategy | gmean all | median all | gmean tuning | gmean held-out |",
                  "|---|---|---|---|---|"]
        for s in strategies:
            lines.append(f"| {s} | {agg(s, b, names):.4f} | {agg(s, b, names, median):.4f} | "
                         f"{agg(s, b, tune):.4f} | {agg(s, b, held):.4f} |")
        lines.append("")
    if "default" in strategies and kt:
        lines += ["### default at B against the best Kernel Tuner strategy at 2B (gmean of median fractions)", "",
                  "| B | set | default at B | best KT at 2B | which | holds |", "|---|---|---|---|---|---|"]
        for b in budgets:
            if 2 * b not in budgets:
                continue
            for label, which in sets.items():
                d = agg("default", b, which)
                best = max(kt, key=lambda s, w=which: agg(s, 2 * b, w))
                k = agg(best, 2 * b, which)
                lines.append(f"| {b} | {label} | {d:.4f} | {k:.4f} | {best} | {'yes' if d >= k else 'NO'} |")
        lines.append("")
    if "default" in strategies:
        for rival in ("random", "ga"):
            if rival not in strategies:
                continue
            losses = [(n, b, med[(n, 'default', b)], med[(n, rival, b)]) for n in names for b in budgets
                      if med[(n, "default", b)] < med[(n, rival, b)]]
            strict = sum(med[(n, "default", b)] > med[(n, rival, b)] for n in names for b in budgets)
            total = len(names) * len(budgets)
            lines.append(f"default >= {rival} (median fraction) on {total - len(losses)}/{total} "
                         f"(landscape, budget) pairs, strictly better on {strict}"
                         + ("" if not losses else "; below on: " + ", ".join(
                             f"{n}@{b} ({d:.4f} < {r:.4f})" for n, b, d, r in losses)))
        top = max(budgets)
        ask = [float(r["ask_ms_mean"]) for r in runs if r["strategy"] == "default" and int(r["budget"]) == top]
        if ask:
            lines += ["", f"default ask()+tell() per evaluation over runs of {top} evaluations: mean "
                          f"{sum(ask) / len(ask):.2f} ms, worst run's mean {max(ask):.2f} ms ({len(ask)} runs)"]
    return "\n".join(lines) + "\n"


def figure(summary: list[dict[str, str]], strategies: list[str], budgets: list[int], path: Path) -> None:
    """Geometric mean over landscapes of the median fraction against the budget: all, tuning and held-out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = {(r["landscape"], r["strategy"], int(r["budget"])): float(r["median_fraction"]) for r in summary}
    names = sorted({r["landscape"] for r in summary})
    tune, held = halves(names)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), sharey=True)
    for ax, (label, which) in zip(axes, [("all", names), ("tuning half", tune), ("held-out half", held)],
                                  strict=True):
        for s in strategies:
            ys = [gmean([med[(n, s, b)] for n in which]) for b in budgets]
            style = {"color": "black", "lw": 2.6, "zorder": 3} if s == "default" else (
                {"ls": "--", "lw": 1.2} if s.startswith(KT_PREFIX) else {"lw": 1.6})
            ax.plot(budgets, ys, marker="o", ms=3, label=s, **style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_title(f"{label} ({len(which)} landscapes)")
        ax.set_xlabel("evaluations (budget)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of the optimum\n(gmean over landscapes of the median over repeats)")
    axes[-1].legend(fontsize=8, loc="lower right")
    fig.suptitle("Strategies on the Kernel Tuner landscapes (higher is better; dashed: Kernel Tuner)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_strategies",
                    help="folder for the per-strategy results and RESULTS.md (default runs/bench_strategies)")
    ap.add_argument("--strategy", action="append", help=f"default: {', '.join(STRATEGIES)}")
    ap.add_argument("--budget", action="append", type=int, help=f"default: {', '.join(map(str, BUDGETS))}")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--landscape", action="append",
                    help="default: the twelve under evotune/landscapes/kerneltuner/")
    ap.add_argument("--reuse", action="store_true", help="keep a strategy's results made with the same plan")
    args = ap.parse_args(argv)
    strategies = args.strategy or list(STRATEGIES)
    budgets = sorted(set(args.budget or BUDGETS))
    paths = [Path(p) for p in args.landscape] if args.landscape else landscapes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: list[dict[str, str]] = []
    runs: list[dict[str, str]] = []
    for s in strategies:
        s_rows, r_rows = run_strategy(s, paths, budgets, args.repeats, args.seed, out, args.reuse)
        summary += s_rows
        runs += r_rows
    text = report(summary, runs, strategies, budgets)
    (out / "RESULTS.md").write_text(f"# benchmarks/strategies.py\n\n`{' '.join(sys.argv)}` "
                                    f"({args.repeats} repeats, seed {args.seed})\n\n{text}")
    figure(summary, strategies, budgets, out / "strategies.png")
    write_csv(out / "summary.csv", SUMMARY_COLUMNS, summary)
    write_csv(out / "runs.csv", RUN_COLUMNS, runs)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

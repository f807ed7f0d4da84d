"""Leave one out: does ``default`` tune a landscape faster when it learns from the related ones?

Two families of recorded landscapes:

* **h100**: for each landscape of ``experiments/landscapes/h100/``, the other
  landscapes of the same space (other shapes and dtypes, the same GPU) are its sources;
* **kerneltuner**: for each kernel shipped for several GPUs in
  ``experiments/landscapes/kerneltuner/``, each GPU's file in turn is the target and the
  other GPUs' files are its sources.

Each target is replayed with ``default`` with transfer (``default+transfer``), without
(``default``), ``random`` and ``tpe``, seeds ``--seed`` onwards, and (kerneltuner, with
``--kt``) Kernel Tuner's strategies at up to twice the largest budget, in its simulation
mode. **Kernel Tuner's ``tune_cache`` simulation searches only the error-free entries of a
file, while evotune's strategies pay an evaluation for every failing one**, so the kt: rows
are favoured wherever a landscape holds failures.

Printed (and written to ``--out``/RESULTS.md, with ``runs.csv``): per landscape, the median
over seeds of the evaluations to 0.95 and 0.99 of the optimum (budget + 1 when never
reached) and of the fraction of the optimum at each budget; then the acceptance checks.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/transfer.py --family h100 --repeats 10 --out runs/transfer_h100
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/transfer.py --family kerneltuner --kt --repeats 10 \\
        --out runs/transfer_kt
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.compare import KT_PREFIX, KT_STRATEGIES, KernelTunerSim, Target, budget_dependent  # noqa: E402
from evotune.compare import geometric_mean as gmean  # noqa: E402
from evotune.compare.metrics import measure  # noqa: E402
from evotune.compare.runner import run_evotune  # noqa: E402
from evotune.evaluation.landscape import load_landscape  # noqa: E402
from evotune.strategies import Source  # noqa: E402
from evotune.transfer import from_landscape  # noqa: E402

FOLDERS = {"h100": ROOT / "experiments/landscapes/h100", "kerneltuner": ROOT / "experiments/landscapes/kerneltuner"}
BUDGETS = {"h100": (10, 25, 50), "kerneltuner": (25, 50, 100, 200)}
EVOTUNE = ("default+transfer", "default", "random", "tpe")


def groups(family: str) -> dict[str, list[Path]]:
    """Landscapes that transfer to each other: by space (h100) or by kernel (kerneltuner); two at least."""
    out: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(FOLDERS[family].glob("*.json.gz")):
        ls = load_landscape(path)
        out[ls.space_name if family == "h100" else ls.problem.kind].append(path)
    return {k: v for k, v in out.items() if len(v) > 1}


def sources_for(target: Target, others: list[Target]) -> list[Source]:
    device = target.landscape.meta.get("device")
    return [from_landscape(o.landscape, target.landscape.problem, device) for o in others]


def run_target(target: Target, others: list[Target], strategies: list[str], budgets: list[int], seeds: list[int],
               kt: KernelTunerSim | None) -> list[dict[str, Any]]:
    """One row per (strategy, seed, budget) on ``target``."""
    rows = []
    top = max(budgets)
    sources = sources_for(target, others)
    for strategy in strategies:
        started = time.perf_counter()
        for seed in seeds:
            if strategy.startswith(KT_PREFIX):
                name = strategy.removeprefix(KT_PREFIX)
                kt_budgets = sorted({b for b in budgets} | {2 * b for b in budgets})
                if budget_dependent(strategy):
                    made = {b: kt.run(target.name, target.landscape, name, seed, b) for b in kt_budgets}
                else:
                    one = kt.run(target.name, target.landscape, name, seed, max(kt_budgets))
                    made = dict.fromkeys(kt_budgets, one)
            else:
                transfer = strategy == "default+transfer"
                one = run_evotune(target, strategy.removesuffix("+transfer"), seed, top,
                                  sources=sources if transfer else ())
                made = dict.fromkeys(budgets, one)
            for b, run in made.items():
                m = measure(run, target, b)
                rows.append({"landscape": target.name, "strategy": strategy, "seed": seed, "budget": b,
                             "fraction": m["fraction"], "evals_to_95": m["evals_to_95"],
                             "evals_to_99": m["evals_to_99"]})
        print(f"# {target.name}: {strategy}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return rows


def med(rows: list[dict[str, Any]], column: str) -> float:
    return float(statistics.median(float(r[column]) for r in rows))


def report(rows: list[dict[str, Any]], family: str, budgets: list[int]) -> str:
    by: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["landscape"], r["strategy"], int(r["budget"]))].append(r)
    names = sorted({r["landscape"] for r in rows})
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    evo = [s for s in strategies if not s.startswith(KT_PREFIX)]
    top = max(budgets)
    lines = [f"Median over seeds; evaluations to a fraction are budget + 1 ({top + 1}) when never reached "
             f"within {top}.", "",
             "| landscape | " + " | ".join(f"{s}: to 0.95 / 0.99" for s in evo) + " | "
             + " | ".join(f"{s} at {'/'.join(map(str, budgets))}" for s in evo[:2]) + " |",
             "|---" * (1 + 2 * len(evo[:2]) + len(evo) - len(evo[:2])) + "|"]
    for n in names:
        cells = [f"{med(by[(n, s, top)], 'evals_to_95'):g} / {med(by[(n, s, top)], 'evals_to_99'):g}" for s in evo]
        cells += [" / ".join(f"{med(by[(n, s, b)], 'fraction'):.3f}" for b in budgets) for s in evo[:2]]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += ["Geometric mean over landscapes of the median fraction of the optimum:", "",
              "| strategy | " + " | ".join(str(b) for b in budgets) + " |", "|---" * (1 + len(budgets)) + "|"]
    kt_budgets = sorted({b for b in budgets} | {2 * b for b in budgets})
    for s in strategies:
        bs = kt_budgets if s.startswith(KT_PREFIX) else budgets
        cells = {b: gmean([med(by[(n, s, b)], "fraction") for n in names]) for b in bs}
        lines.append(f"| {s} | " + " | ".join(f"{cells[b]:.4f}" if b in cells else "-" for b in budgets) + " |"
                     + (" 2B: " + " / ".join(f"{cells[2 * b]:.4f}" for b in budgets) if s.startswith(KT_PREFIX)
                        else ""))
    lines.append("")
    if "default+transfer" in strategies and "default" in strategies:
        e99 = {n: (med(by[(n, "default+transfer", top)], "evals_to_99"), med(by[(n, "default", top)], "evals_to_99"))
               for n in names}
        within10 = [n for n in names if e99[n][0] <= 10]
        worse = [f"{n} ({a:g} > {b:g})" for n, (a, b) in e99.items() if a > b]
        lines += [f"- default+transfer reaches 0.99 within 10 evaluations (median) on {len(within10)} of "
                  f"{len(names)} landscapes ({100 * len(within10) / len(names):.0f}%)",
                  f"- median evaluations to 0.99 worse than without transfer on {len(worse)} of {len(names)}"
                  + (": " + ", ".join(worse) if worse else "")]
    kts = [s for s in strategies if s.startswith(KT_PREFIX)]
    if kts and "default+transfer" in strategies:
        kernels: dict[str, list[str]] = defaultdict(list)
        for n in names:
            kernels[n.rsplit("_", 1)[0].split("_RTX")[0]].append(n)
        lines += ["", "default+transfer at B against the best Kernel Tuner strategy at 2B, per landscape and per "
                  "kernel (gmean over its GPUs) of the median fraction:", "",
                  "| landscape or kernel | " + " | ".join(f"B={b}" for b in budgets) + " |",
                  "|---" * (1 + len(budgets)) + "|"]
        fails = 0
        for label, which in [*[(n, [n]) for n in names], *[(f"**{k}**", v) for k, v in sorted(kernels.items())]]:
            cells = []
            for b in budgets:
                d = gmean([med(by[(n, "default+transfer", b)], "fraction") for n in which])
                k = max(gmean([med(by[(n, s, 2 * b)], "fraction") for n in which]) for s in kts)
                fails += d < k
                cells.append(f"{d:.3f} vs {k:.3f} {'yes' if d >= k else 'NO'}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append(f"\nCells where default+transfer at B is below the best Kernel Tuner strategy at 2B: {fails}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=sorted(FOLDERS), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategy", action="append", help=f"default: {', '.join(EVOTUNE)}")
    ap.add_argument("--kt", action="store_true", help="also Kernel Tuner's strategies, at up to twice the budget")
    ap.add_argument("--only", action="append", help="only the landscapes whose name contains this")
    args = ap.parse_args(argv)
    budgets = list(BUDGETS[args.family])
    strategies = list(args.strategy or EVOTUNE) + ([KT_PREFIX + n for n in KT_STRATEGIES] if args.kt else [])
    seeds = [args.seed + r for r in range(args.repeats)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="evotune-transfer-") as tmp:
        kt = KernelTunerSim(Path(tmp)) if args.kt else None
        for paths in groups(args.family).values():
            targets = [Target.load(str(p), 2 * max(budgets)) for p in paths]
            for i, target in enumerate(targets):
                if args.only and not any(o in target.name for o in args.only):
                    continue
                rows += run_target(target, targets[:i] + targets[i + 1:], strategies, budgets, seeds, kt)
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    text = report(rows, args.family, budgets)
    (out / "RESULTS.md").write_text(f"# benchmarks/transfer.py\n\n`{' '.join(sys.argv)}`\n\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The sweep that chose ``default``'s options: one setting of its options on the tuning half.

Runs ``default`` (or another evotune strategy) with the options given by ``--set``
on the tuning half of the shipped Kernel Tuner landscapes (``--half held-out`` or ``all`` for the
others; halves as in ``benchmarks/strategies.py``), seeds ``--seed`` onwards (0 by default), and prints
per landscape the median fraction of the optimum at each budget, then the
geometric mean over the landscapes. Compare two settings by running it twice.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/tune_default.py                       # the shipped options
    OMP_NUM_THREADS=1 python benchmarks/tune_default.py --set relevance=false --set cross=0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from strategies import KT_DIR, halves  # noqa: E402

from evotune.reporting.compare import Case, geometric_mean, measure, run_evotune  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="default")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=JSON", help="an option, e.g. pool=500")
    ap.add_argument("--half", choices=("tuning", "held-out", "all"), default="tuning")
    ap.add_argument("--budget", action="append", type=int, help="default: 25, 50, 100, 200")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="the first seed (fresh seeds check a choice made on others)")
    ap.add_argument("--landscapes", type=Path, default=KT_DIR, help="folder of Kernel Tuner landscapes")
    args = ap.parse_args(argv)
    options = {}
    for item in args.set:
        name, _, value = item.partition("=")
        try:
            options[name] = json.loads(value)
        except ValueError:
            ap.error(f"--set {item}: the value must be JSON (true, 0.5, 1000)")
    budgets = sorted(set(args.budget or (25, 50, 100, 200)))
    paths = {p.name.removesuffix(".json.gz"): p for p in sorted(args.landscapes.glob("*.json.gz"))}
    tune, held = halves(list(paths))
    names = {"tuning": tune, "held-out": held, "all": sorted(paths)}[args.half]
    print(f"# {args.strategy} {json.dumps(options)} on the {args.half} landscapes, seeds {args.seed}.."
          f"{args.seed + args.repeats - 1}; "
          f"median fraction at {' / '.join(map(str, budgets))}")
    medians: dict[int, list[float]] = {b: [] for b in budgets}
    for name in names:
        target = Case.load(str(paths[name]), max(budgets))
        try:
            runs = [run_evotune(target, args.strategy, seed, max(budgets), **options)
                    for seed in range(args.seed, args.seed + args.repeats)]
        except (KeyError, ValueError) as exc:  # an unknown strategy or a bad option: one line, exit 2
            ap.error(f"--strategy/--set: {exc}")
        row = [statistics.median(measure(r, target, b)["fraction"] for r in runs) for b in budgets]
        for b, m in zip(budgets, row, strict=True):
            medians[b].append(m)
        print(f"{name:24s} " + " / ".join(f"{m:.3f}" for m in row), flush=True)
    print(f"{'gmean':24s} " + " / ".join(f"{geometric_mean(medians[b]):.4f}" for b in budgets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

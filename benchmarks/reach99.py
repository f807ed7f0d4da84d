"""Does the median run reach 0.99 of the optimum within 10% of a landscape's points?

Reads the ``runs.csv`` that ``python -m evotune compare`` wrote and the landscapes it ran on,
and prints, per strategy, on how many landscapes the median (over seeds) of ``evals_to_99`` in
the runs of the largest budget is at most 10% of the landscape's points, and which landscapes
miss. A run that never got there has ``evals_to_99 = budget + 1``; where 10% of the points is
more than the budget, such a run counts as a miss (it is not known to get there in time).

Usage::

    python benchmarks/reach99.py runs/h100 evotune/landscapes/h100/*.json.gz
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.landscape import landscape_stem, load_landscape  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the --out folder of a compare run")
    ap.add_argument("landscapes", nargs="+", help="the landscapes it ran on")
    ap.add_argument("--share", type=float, default=0.10, help="share of the points (default 0.10)")
    args = ap.parse_args(argv)
    points = {landscape_stem(p): len(load_landscape(p)) for p in args.landscapes}
    with (Path(args.out) / "runs.csv").open() as f:
        runs = list(csv.DictReader(f))
    top = max(int(r["budget"]) for r in runs)
    evals: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in runs:
        if int(r["budget"]) == top and r["landscape"] in points:
            evals[(r["strategy"], r["landscape"])].append(int(r["evals_to_99"]))
    for strategy in sorted({s for s, _ in evals}):
        misses = []
        for name, n in sorted(points.items()):
            med = statistics.median(evals[(strategy, name)])
            limit = math.floor(args.share * n)
            if med > limit or med > top:
                never = ", never within the budget" if med > top else ""
                misses.append(f"{name} ({med:g} evaluations, limit {limit}{never})")
        print(f"{strategy}: 0.99 of the optimum within {args.share:.0%} of the points, at the median, on "
              f"{len(points) - len(misses)} of {len(points)} landscapes" + ("" if not misses else "; misses: "
                                                                            + "; ".join(misses)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``default`` strategy's own time per evaluation (ask plus tell) at 400 evaluations.

Tells the strategy 390 points of the shipped GEMM landscape directly (a full
run to 400 evaluations would measure the same thing, only slower), then times
``--evaluations - 390`` more rounds of ``ask(1)`` + ``tell`` and prints the
mean and the worst in ms. The target is a mean under 50 ms; time it on an
otherwise idle machine with one BLAS thread.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/ask_overhead.py [--seed 0] [--strategy default]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.space import Context  # noqa: E402
from evotune.reporting.compare import Case  # noqa: E402
from evotune.search.strategies import make_strategy  # noqa: E402

GEMM = ROOT / "evotune" / "landscapes" / "kerneltuner" / "gemm_RTX_2080_Ti.json.gz"
TOLD = 390  # points told before timing starts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategy", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--evaluations", type=int, default=400, help=f"timed rounds run from {TOLD + 1} up to this")
    args = ap.parse_args(argv)
    if args.evaluations <= TOLD + 1:
        ap.error(f"--evaluations: must be above {TOLD + 1}, got {args.evaluations}")
    target = Case.load(str(GEMM), args.evaluations)
    space, fs, row_times = target.replay()
    s = make_strategy(args.strategy, space, fs, seed=args.seed, ctx=Context(problem=target.landscape.problem))

    def tell(point: dict) -> None:
        t = float(row_times[fs.row(point)])
        s.tell([(point, None if math.isnan(t) else t)])

    for row in np.random.default_rng(args.seed).choice(len(fs), size=TOLD - 1, replace=False):
        tell(fs.point(int(row)))
    (p,) = s.ask(1)  # untimed: the first ask imports scipy (about 0.5 s, once per process)
    tell(p)
    spent = []
    for _ in range(args.evaluations - TOLD):
        t0 = time.perf_counter()
        (p,) = s.ask(1)
        tell(p)
        spent.append(1e3 * (time.perf_counter() - t0))
    print(f"{args.strategy}: ask+tell at {TOLD + 1}..{args.evaluations} evaluations: "
          f"mean {sum(spent) / len(spent):.1f} ms, worst {max(spent):.1f} ms ({len(spent)} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The spaces' pruning against the compiler: a table from the compile-only files. CPU only.

For each file (``evotune record --compile-only``) it prunes the space for the
file's GPU and dtype on a 4096^3 problem in the file's layout and prints: the
feasible points and how many were compiled, the false-feasible ones (kept, but
no binary that can launch), the pruned points compiled and how many of those
build (false-infeasible) per constraint, those pruned for the problem's shape
(which a shape-free compile cannot judge), and the compile seconds of the
points that built (median, 90th percentile, largest, total).

Usage::

    python benchmarks/compile_check.py [evotune/landscapes/compile/*.json.gz]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.compile_results import agreement, load_compiled  # noqa: E402
from evotune.core.hardware import get_hardware  # noqa: E402
from evotune.core.plugins import load_space  # noqa: E402
from evotune.core.problem import Problem  # noqa: E402
from evotune.core.space import Context  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="compile-only files (default: evotune/landscapes/compile/*)")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.files] or sorted((ROOT / "evotune/landscapes/compile").glob("*.json.gz"))
    print("| space | GPU (arch) | dtype | feasible | compiled | false-feasible | pruned compiled | "
          "false-infeasible (builds) | pruned for the shape | compile s of built points: median / p90 / max / "
          "total | date |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in files:
        first = load_compiled(path)
        space = load_space(first.meta["space"])
        table = load_compiled(path, space)
        meta = table.meta
        hw = get_hardware(meta["hardware"])
        ctx = Context(hw, Problem.gemm(4096, 4096, 4096, meta["dtype"], meta["layout"]))
        a = agreement(space, ctx, table)
        built = np.array([c.compile_s for p in space.points() if (c := table.get(space, p)) and c.builds(hw)])
        fi = ", ".join(f"{k} {v}" for k, v in sorted(a.false_infeasible.items())) or "0"
        agreed = sum(a.agreed_pruned.values())
        shape = ", ".join(f"{k} {v}" for k, v in sorted(a.unjudged.items())) or "0"
        times = (f"{np.median(built):.2f} / {np.percentile(built, 90):.2f} / {built.max():.2f} / {built.sum():.0f}"
                 if len(built) else "-")
        print(f"| {space.name} | {hw.name} ({meta['arch']}) | {meta['dtype']} | {a.feasible_total} | "
              f"{a.checked_feasible} | {len(a.false_feasible)} | {a.checked_pruned} ({agreed} do not build) | "
              f"{fi} | {shape} | {times} | {meta['date']} |")
        for key, why in a.false_feasible[:5]:
            print(f"|  false-feasible: {key} | {why} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

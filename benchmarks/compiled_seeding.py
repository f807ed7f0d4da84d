"""Does seeding rank a measured landscape better with the compiler's resource use than with the analytic model?

For each recorded landscape of a space that has a compile-only file for the
same GPU, dtype and layout, the space's estimate ranks every correctly measured
point twice: from the analytic hardware model alone, and with the registers,
shared memory and stages read from each point's binary (``Context.compiled``).
It prints, per landscape, the Spearman rank correlation of each ranking with
the measured times, and the best measured time among the top 10 of each
ranking as a fraction of the landscape's optimum (what the hardware-seeded half
of a first population would find). CPU only.

Usage::

    python benchmarks/compiled_seeding.py [--landscapes evotune/landscapes/h100]
        [--compiled evotune/landscapes/compile] [--hardware H100]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.compile_results import find_compiled, load_compiled  # noqa: E402
from evotune.core.hardware import get_hardware  # noqa: E402
from evotune.core.landscape import load_landscape  # noqa: E402
from evotune.core.plugins import builtin_names, load_space  # noqa: E402
from evotune.core.result import Status  # noqa: E402
from evotune.core.space import Context  # noqa: E402
from evotune.search.prior import spearman  # noqa: E402

TOP = 10


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--landscapes", default=str(ROOT / "evotune/landscapes/h100"))
    ap.add_argument("--compiled", default=str(ROOT / "evotune/landscapes/compile"))
    ap.add_argument("--hardware", default="H100")
    args = ap.parse_args(argv)
    hw = get_hardware(args.hardware)
    print("| landscape | points | Spearman analytic | Spearman compiled | top-10 best analytic "
          "| top-10 best compiled |")
    print("|---|---|---|---|---|---|")
    rows = []
    for path in sorted(Path(args.landscapes).glob("*.json.gz")):
        ls = load_landscape(path)
        name = ls.space_name
        if name not in builtin_names():
            continue
        space = load_space(name)
        if space.names != ls.names:
            continue
        found = find_compiled(args.compiled, space.name, hw.name, ls.problem.dtype, ls.problem.layout)
        if found is None:
            continue
        table = load_compiled(found, space)
        ok = [(dict(zip(ls.names, k, strict=True)), r.time_ms) for k, r in ls.entries.items()
              if r.status is Status.OK and r.time_ms is not None]
        times = np.array([t for _, t in ok])
        result = []
        for ctx in (Context(hw, ls.problem), Context(hw, ls.problem, compiled=table)):
            est = np.array([space.estimate(p, ctx) for p, _ in ok])
            top = np.argsort(est, kind="stable")[:TOP]
            result += [spearman(est, times), times.min() / times[top].min()]
        rows.append(result)
        print(f"| {path.name} | {len(ok)} | {result[0]:.3f} | {result[2]:.3f} | {result[1]:.3f} | {result[3]:.3f} |")
    if rows:
        m = np.median(np.array(rows), axis=0)
        print(f"| median of {len(rows)} | | {m[0]:.3f} | {m[2]:.3f} | {m[1]:.3f} | {m[3]:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

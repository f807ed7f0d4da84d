"""Re-measure the recorded optima of H100 landscapes, beside their baselines, in one run.

A landscape's optimum is one point measured once; a lucky or unlucky sample
run would make the whole landscape lie about its best. This times the ``--top``
fastest recorded points of each landscape again, with the same oracle as
``evotune record`` and the baselines (cuBLAS through torch) in the same run, and
reports recorded / re-measured for each, so a suspicious optimum is confirmed
or refuted. Needs the gpu extra and the GPU the landscapes were recorded on.

Usage (on the GPU machine)::

    python benchmarks/recheck_optima.py --top 3 --out runs/recheck.json \\
        evotune/landscapes/h100/cute_hopper_gemm_gemm_int8_tn_64x65536x4096.json.gz
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.core.landscape import Landscape, load_landscape  # noqa: E402
from evotune.core.plugins import load_space  # noqa: E402
from evotune.core.result import Status  # noqa: E402
from evotune.measurement.options import OracleOptions, TimingOptions  # noqa: E402


def top_points(ls: Landscape, top: int) -> list[dict]:
    ok = sorted((r.time_ms, values) for values, r in ls.entries.items() if r.status is Status.OK)
    return [dict(zip(ls.names, values, strict=True)) for _, values in ok[:top]]


def recheck(paths: list[Path], top: int, options: OracleOptions) -> list[dict]:
    from evotune.measurement.gpu import GpuEvaluator  # the gpu extra

    rows: list[dict] = []
    evaluators: dict[str, GpuEvaluator] = {}
    work = []
    try:
        for path in paths:  # start every compile first: the pool works while the GPU times
            ls = load_landscape(path)
            space = load_space(ls.space_name)
            if space.name not in evaluators:
                evaluators[space.name] = GpuEvaluator(space, options)
            ev, points = evaluators[space.name], top_points(ls, top)
            ev.prefetch(points, ls.problem)
            work.append((path, ls, ev, points))
        for path, ls, ev, points in work:
            base = {k: v.get("time_ms") for k, v in ev.baselines(ls.problem).items()}
            recorded_base = {k: v.get("time_ms") for k, v in ls.baselines.items()}
            for rank, point in enumerate(points, 1):
                res = ev.evaluate(point, ls.problem)
                was = ls.lookup(point)
                rows.append({"landscape": path.name, "rank": rank, "point": point,
                             "recorded_ms": was.time_ms if was else None, "status": res.status.value,
                             "remeasured_ms": res.time_ms, "samples": len(res.samples_ms),
                             "baselines_ms": base, "recorded_baselines_ms": recorded_base})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for ev in evaluators.values():
            ev.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("landscapes", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=3, help="fastest recorded points to re-measure per landscape")
    ap.add_argument("--min-samples", type=int, default=100)
    ap.add_argument("--max-samples", type=int, default=300)
    ap.add_argument("--out", type=Path, required=True, help="JSON file with one row per re-measured point")
    args = ap.parse_args(argv)
    timing = TimingOptions(min_samples=args.min_samples, max_samples=args.max_samples, ci_target=0.005)
    rows = recheck(args.landscapes, args.top, OracleOptions(timeout_s=120, timing=timing))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

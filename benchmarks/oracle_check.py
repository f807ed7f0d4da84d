"""Check evotune's timing oracle against an independent timer: Triton's ``do_bench``.

Takes one recorded landscape, its ``--top`` fastest points and ``--random`` others
drawn uniformly from the rest (failed points left out), builds each kernel once and
verifies it, then times every point with both timers in ``--rounds`` interleaved
rounds (each round visits every point; the timers alternate which goes first):
evotune's oracle (CUDA graph, cold L2; ``--samples`` per round, pooled) and
``triton.testing.do_bench`` (eager launches, its own cache flush; the median of its
per-round medians). Interleaving gives both timers, and every point, the same mix of
preceding GPU load, which moves a power-bound kernel's time by several per cent. It
prints the Spearman rank correlation between the two timers, the median of
do_bench / oracle, and the same against the times in the landscape.

Usage (on the GPU machine, with the gpu extra)::

    python benchmarks/oracle_check.py --top 50 --random 50 --out runs/oracle_check.json \\
        evotune/landscapes/h100/cute_hopper_gemm_gemm_bf16_tn_4096x4096x4096.json.gz
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from evotune.core.landscape import Landscape, load_landscape  # noqa: E402
from evotune.core.result import Status  # noqa: E402
from evotune.measurement.oracle import summarize  # noqa: E402


def choose_points(ls: Landscape, top: int, random: int, seed: int) -> list[tuple[str, dict]]:
    """(``top`` or ``random``, point) for the fastest ``top`` ok points and ``random`` of the other ok ones."""
    ok = sorted((r.time_ms, values) for values, r in ls.entries.items() if r.status is Status.OK)
    rng = np.random.default_rng(seed)
    rest = ok[top:]
    picked = [rest[i] for i in sorted(rng.choice(len(rest), size=min(random, len(rest)), replace=False))]
    return ([("top", dict(zip(ls.names, v, strict=True))) for _, v in ok[:top]]
            + [("random", dict(zip(ls.names, v, strict=True))) for _, v in picked])


def _precompile(space_source: str, point: dict, problem: dict) -> float:
    from evotune.core.plugins import load_space
    from evotune.core.problem import Problem

    started = time.perf_counter()
    load_space(space_source).precompile(point, Problem.from_dict(problem))
    return time.perf_counter() - started


def spearman(x: list[float], y: list[float]) -> float:
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def check(path: Path, top: int, random: int, seed: int, workers: int, rounds: int, samples: int) -> list[dict]:
    import torch
    from triton.testing import do_bench

    from evotune.core.plugins import load_space
    from evotune.measurement.oracle import Oracle
    from evotune.measurement.workloads.gemm import make_inputs, poison, verify

    ls = load_landscape(path)
    space, problem = load_space(ls.space_name), ls.problem
    chosen = choose_points(ls, top, random, seed)
    if space.precompile is not None and workers > 0:  # fill the kernel cache in parallel first
        import multiprocessing as mp

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            list(pool.map(_precompile, [space.source] * len(chosen), [p for _, p in chosen],
                          [problem.to_dict()] * len(chosen)))
    oracle = Oracle()
    a, b, c = make_inputs(problem, seed=100)
    rows, timed = [], []  # timed: (row, the oracle's prepared launch, the eager launch)
    for group, point in chosen:
        kernel = space.build(point, problem)
        poison(c)
        kernel(a, b, c)
        torch.cuda.synchronize()
        ok, _, why = verify(problem, a, b, c)
        if not ok:
            rows.append({"group": group, "point": point, "error": why})
            continue
        row = {"group": group, "point": point, "recorded_ms": ls.lookup(point).time_ms, "oracle": [], "do_bench": []}
        rows.append(row)
        eager = lambda kernel=kernel: kernel(a, b, c)  # noqa: E731
        timed.append((row, oracle.prepare(eager), eager))
    # A power-bound kernel runs a few per cent slower on a GPU that has just run a heavy one for a while: timed
    # one point after another, each point's figure would carry the previous point's load. In rounds, every
    # point, with both timers, sees the same mix of what ran before; the two timers alternate which goes first.
    warm_until = time.perf_counter() + 1.0
    while time.perf_counter() < warm_until:
        oracle.sample(timed[0][1], 20)
    for r in range(rounds):
        for row, launch, eager in timed:
            for timer in (("oracle", "do_bench") if r % 2 == 0 else ("do_bench", "oracle")):
                if timer == "oracle":
                    row["oracle"] += oracle.sample(launch, samples)
                else:
                    row["do_bench"].append(float(do_bench(eager, warmup=1, rep=5, return_mode="median")))
    for row, _, _ in timed:
        row["oracle_ms"] = summarize(row.pop("oracle"))[0]
        row["do_bench_ms"] = statistics.median(row.pop("do_bench"))
        print(json.dumps(row), flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    good = [r for r in rows if "oracle_ms" in r]
    ours, theirs = [r["oracle_ms"] for r in good], [r["do_bench_ms"] for r in good]
    recorded = [r["recorded_ms"] for r in good]
    return {"points": len(good), "failed_verification": len(rows) - len(good),
            "spearman_oracle_do_bench": spearman(ours, theirs),
            "median_ratio_do_bench_over_oracle": statistics.median(t / o for t, o in zip(theirs, ours, strict=True)),
            "spearman_oracle_recorded": spearman(ours, recorded),
            "median_ratio_oracle_over_recorded": statistics.median(o / r for o, r in zip(ours, recorded, strict=True))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("landscape", type=Path)
    ap.add_argument("--top", type=int, default=50)
    ap.add_argument("--random", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=14, help="processes that compile the kernels first")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds over all points")
    ap.add_argument("--samples", type=int, default=20, help="oracle samples per point per round")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    rows = check(args.landscape, args.top, args.random, args.seed, args.workers, args.rounds, args.samples)
    result = {"landscape": args.landscape.name, "summary": summary(rows), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the timing oracle's samples of a few-microsecond kernel change with what else runs on the host.

Two workers on one host measure their points while both compile pools run; on two GPUs, the samples of
6 µs kernels took longer and spread wider than alone (benchmarks/RESULTS.md, "Two GPUs against one"). This
separates the causes. The measuring process runs on CPU 0, as a placed worker does
(``evotune/measurement/host.py``), and times ``torch._int_mm`` (int8, ``--shape`` M x N x K, by default
512 x 16 x 512) with evotune's :class:`~evotune.measurement.oracle.Oracle` (its default options: clean L2
flush, at least 20 samples, until the median's 95% interval is within 1%), ``--points`` times under each
condition:

* ``idle``: nothing else;
* ``cpuN``: N processes on CPUs 2, 3, ..., each sorting a 64 MB array over and over (memory- and
  cache-bound, as compiles are), the way N compile processes load the host;
* ``gpu``: a second process, on CPU 1 and the GPU ``--other``, timing the same kernel the same way, as the
  other worker's GPU worker does;
* loads joined by ``+`` run together (``gpu+cpu30``: both workers' GPU workers and compile pools).

Per condition it prints the time a sample takes (the oracle's seconds over its samples), the samples a point
took, the spread (interquartile range over the median), the 1st and 99th percentiles over the median and the
median kernel time, each beside its ratio to ``idle`` (the first condition given).

Usage (on a host of two GPUs)::

    python benchmarks/timing_under_load.py --conditions idle,cpu15,cpu30,gpu,gpu+cpu30 --out runs/timing_under_load.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

RAMP_S = 2.0  # seconds a load runs before the first point is timed


def burn(cpu: int, stop: Any) -> None:
    """Sort a 64 MB array on ``cpu`` until ``stop`` is set."""
    os.sched_setaffinity(0, {cpu})
    data = np.random.default_rng(cpu).random(8 * 2**20)
    while not stop.is_set():
        np.sort(data)


def kernel(shape: tuple[int, int, int]) -> tuple[Any, Any]:
    """(the oracle, the launch to time): ``torch._int_mm`` at ``shape`` on this process's GPU."""
    import torch

    from evotune.measurement.oracle import Oracle

    m, n, k = shape
    a = torch.randint(-8, 8, (m, k), dtype=torch.int8, device="cuda")
    b = torch.randint(-8, 8, (n, k), dtype=torch.int8, device="cuda").t()
    return Oracle(), lambda: torch._int_mm(a, b)


def time_points(shape: tuple[int, int, int], points: int) -> list[tuple[float, int, float, list[float]]]:
    """``points`` timings of the kernel at ``shape``: (seconds per sample, samples, median ms, samples ms) each."""
    oracle, launch = kernel(shape)
    out = []
    for _ in range(points):
        t = oracle.time(launch)
        out.append((t.bench_s / len(t.samples_ms), len(t.samples_ms), t.median_ms, t.samples_ms))
    return out


def other_gpu(gpu: str, shape: tuple[int, int, int], stop: Any, ready: Any) -> None:
    """The other worker's GPU worker: on CPU 1 and ``gpu``, time the same kernel until ``stop`` is set."""
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    os.sched_setaffinity(0, {1})
    oracle, launch = kernel(shape)
    oracle.time(launch)  # CUDA started and the kernel warm before the measured process begins
    ready.set()
    while not stop.is_set():
        oracle.time(launch)


def measure(condition: str, shape: tuple[int, int, int], points: int, other: str) -> dict[str, Any]:
    """Time ``points`` points under ``condition`` (``idle``, ``cpuN``, ``gpu``, or loads joined by ``+``) and
    summarize them."""
    ctx = mp.get_context("spawn")  # the loads start clean: this process has CUDA running
    stop, ready = ctx.Event(), ctx.Event()
    loads: list[Any] = []
    for part in condition.split("+"):
        if (burners := re.fullmatch(r"cpu(\d+)", part)) is not None:
            cpus = list(range(2, os.cpu_count() or 2))[:int(burners.group(1))]
            loads += [ctx.Process(target=burn, args=(cpu, stop)) for cpu in cpus]
        elif part == "gpu":
            loads.append(ctx.Process(target=other_gpu, args=(other, shape, stop, ready)))
    if "gpu" not in condition.split("+"):
        ready.set()
    for p in loads:
        p.start()
    try:
        while not ready.wait(1.0):  # the other GPU's process: started and warm, or gone
            if not all(p.is_alive() for p in loads):
                raise SystemExit(f"timing_under_load.py: {condition}: a load process ended before it was ready")
        time.sleep(RAMP_S)
        timed = time_points(shape, points)
    finally:
        stop.set()
        for p in loads:
            p.join()
    return summary(condition, len(loads), timed)


def summary(condition: str, loads: int, timed: list[tuple[float, int, float, list[float]]]) -> dict[str, Any]:
    """One condition's row from its points' timings (:func:`time_points`)."""
    pooled = np.concatenate([np.asarray(s) / med for _, _, med, s in timed])
    return {
        "condition": condition, "loads": loads,
        "sample_ms": statistics.median(x[0] for x in timed) * 1e3,
        "samples": statistics.mean(x[1] for x in timed),
        "spread": statistics.median(float(np.subtract(*np.percentile(s, [75, 25]))) / med
                                    for _, _, med, s in timed),
        "p01": float(np.percentile(pooled, 1)), "p99": float(np.percentile(pooled, 99)),
        "median_ms": statistics.median(x[2] for x in timed),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conditions", default="idle,cpu15,cpu30,gpu,gpu+cpu30",
                    help="comma-separated: idle, cpuN (N memory-bound processes), gpu (the other GPU timing), "
                    "or loads joined by + (gpu+cpu30)")
    ap.add_argument("--shape", default="512x16x512", help="M x N x K of the int8 GEMM timed")
    ap.add_argument("--points", type=int, default=30, help="timings per condition")
    ap.add_argument("--gpu", default="0", help="the measuring process's GPU (CUDA_VISIBLE_DEVICES)")
    ap.add_argument("--other", default="1", help="the GPU the gpu condition times on")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    args = ap.parse_args(argv)
    try:
        shape = tuple(int(x) for x in args.shape.lower().split("x"))
        if len(shape) != 3:
            raise ValueError
    except ValueError:
        print(f"timing_under_load.py: --shape: expected M x N x K, got {args.shape!r}", file=sys.stderr)
        return 2
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    unknown = [c for c in conditions
               if c != "idle" and not all(p == "gpu" or re.fullmatch(r"cpu\d+", p) for p in c.split("+"))]
    if unknown or not conditions:
        print("timing_under_load.py: --conditions: expected idle, cpuN, gpu or loads joined by +, "
              f"got {args.conditions!r}", file=sys.stderr)
        return 2
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu
    os.sched_setaffinity(0, {0})
    rows = [measure(c, shape, args.points, args.other) for c in conditions]
    base = rows[0]
    print(f"torch._int_mm int8 {args.shape}, GPU {args.gpu}, measuring on CPU 0; ratios against {base['condition']}")
    print("| condition | ms a sample | samples a point | spread | p01 / median | p99 / median | median (ms) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['condition']} | {r['sample_ms']:.3f} ({r['sample_ms'] / base['sample_ms']:.2f}x) "
              f"| {r['samples']:.0f} ({r['samples'] / base['samples']:.2f}x) "
              f"| {r['spread']:.3f} ({r['spread'] / base['spread']:.2f}x) | {r['p01']:.3f} | {r['p99']:.3f} "
              f"| {r['median_ms']:.5f} ({r['median_ms'] / base['median_ms']:.3f}x) |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shape": args.shape, "gpu": args.gpu, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

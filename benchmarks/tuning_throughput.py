"""Tuning throughput on a compiled GEMM space (CuTe DSL or CUTLASS C++ sm90): configurations evaluated per minute.

Four ways through the same configurations, on one GPU:

* ``serial``: the CuTe DSL autotuning guide's loop (``autotune_gemm``): for each
  configuration compile it, then time it with CUDA events (3 warm-ups, 10
  launches); no verification, no cold L2, no isolation (for the CUTLASS space:
  nvcc, load the library, time it the same way);
* ``evotune cold``: evotune's GPU evaluator with an empty kernel cache: a pool of
  compile processes works ahead while one GPU worker verifies each kernel
  against the reference and times it with the full oracle;
* ``evotune warm``: the same again: every kernel comes from the on-disk cache, and
  the GPU worker and compile processes fork from the process server the cold loop
  started (as every process a tuner starts after its first does: a GPU worker
  replacing a crashed one, another space's compile pool);
* ``warm, fresh process``: the warm loop in a new tuner process, from starting its
  interpreter to its exit (as a second ``evotune run`` would be): imports and the
  process server's start included.

Usage (on the GPU machine)::

    python3 benchmarks/tuning_throughput.py --configs 120 --problem 4096x4096x4096 --dtype bf16
    python3 benchmarks/tuning_throughput.py --space cutlass_sm90_gemm --configs 8

It prints the seconds and configurations per minute of each, in all and after the first
configuration (each loop's start-up: processes, imports, CUDA, the first compile, paid
once per run), and what a point cost on average in each evotune loop (waiting for its
evaluation; compiling, verifying and timing it inside that wait).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _compile_cute(p, problem, a, b, c):
    """Compile one CuTe DSL configuration; returns a launcher."""
    import cutlass.torch as cutlass_torch

    from search_spaces._cute_sm90 import operator

    op, args = operator(p, problem, a, b, c)
    fn = op.compile(args, target_sm="90a").compiled_obj
    stream = cutlass_torch.current_stream()
    return lambda: fn(a, b, c, stream)


def _compile_cutlass(p, problem, a, b, c):
    """nvcc one CUTLASS configuration (into a cache of the serial loop's own, so each is compiled), load it."""
    from search_spaces import _cutlass_sm90 as cpp

    fn = cpp.build(p, problem)
    return lambda: fn(a, b, c)


COMPILE = {"cute_hopper_gemm": _compile_cute, "cutlass_sm90_gemm": _compile_cutlass}


def serial_loop(points, problem, space_name) -> tuple[float, float]:
    """The guide's shape of loop: compile, then time, one configuration after another; (seconds in all,
    seconds until the first configuration was timed)."""
    import torch

    from evotune.measurement.workloads.gemm import make_inputs

    a, b, c = make_inputs(problem, seed=0)
    started = time.perf_counter()
    first = None
    for p in points:
        launch = COMPILE[space_name](p, problem, a, b, c)
        for _ in range(3):
            launch()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            launch()
        end.record()
        torch.cuda.synchronize()
        first = first or time.perf_counter() - started
    return time.perf_counter() - started, first


def evotune_loop(points, problem, space, workers) -> tuple[float, float, dict, dict]:
    from evotune.measurement.gpu import GpuEvaluator
    from evotune.measurement.options import OracleOptions

    started = time.perf_counter()
    first = None
    parts = {"wait_s": 0.0, "compile_s": 0.0, "build_s": 0.0, "verify_s": 0.0, "bench_s": 0.0}
    with GpuEvaluator(space, OracleOptions(workers=workers)) as ev:
        handed = 0  # as the tuner does: points handed to the pool ahead, as many as the evaluator asks for
        for i, p in enumerate(points):
            more = ev.to_ask(max(0, handed - i))
            if more:
                ev.prefetch(points[handed:handed + more], problem)
                handed = min(len(points), handed + more)
            asked = time.perf_counter()
            r = ev.evaluate(p, problem)
            assert r.status.value == "ok", r.message
            parts["wait_s"] += time.perf_counter() - asked
            parts["compile_s"] += r.compile_s  # in the pool (overlapped) or in the GPU worker
            parts["build_s"] += r.extra.get("build_s", 0.0)  # the GPU worker loading (or compiling) it
            parts["verify_s"] += r.extra.get("verify_s", 0.0)
            parts["bench_s"] += r.bench_s
            first = first or time.perf_counter() - started
        stats = dict(ev.cache_stats)
    total = time.perf_counter() - started
    # per point: the wall time the loop waited for each evaluation, and what the GPU worker spent on it
    per_point = {k: v / len(points) for k, v in parts.items()}
    per_point["outside_s"] = total - parts["wait_s"]  # in all, outside the waits: start-up and prefetching
    return total, first, stats, per_point


def _setup(args):
    """(problem, space, ctx, points): the run's configurations, the same in every process that asks."""
    from evotune.core.hardware import detect
    from evotune.core.plugins import load_space
    from evotune.core.problem import Problem
    from evotune.core.space import Context

    m, n, k = (int(x) for x in args.problem.split("x"))
    problem = Problem.gemm(m, n, k, args.dtype)
    space = load_space(args.space)
    ctx = Context(detect(), problem)
    fs = space.feasible(ctx)
    rows = random.Random(0).sample(range(len(fs)), args.configs)
    return problem, space, ctx, [fs.point(r) for r in rows]


def fresh_process_loop(argv: list[str]) -> tuple[float, dict]:
    """The evotune loop in a new tuner process, as a second ``evotune run`` would be: (seconds from starting the
    interpreter to its exit, what the loop reported)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, *argv, "--loop-only"], capture_output=True, text=True,
                          check=True)
    return time.perf_counter() - started, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--space", default="cute_hopper_gemm", choices=sorted(COMPILE))
    ap.add_argument("--configs", type=int, default=120)
    ap.add_argument("--problem", default="4096x4096x4096")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)  # fresh_process_loop's child
    args = ap.parse_args()

    from evotune.measurement.host import default_workers

    problem, space, ctx, points = _setup(args)
    workers = default_workers() if args.workers is None else args.workers
    if args.loop_only:
        total, first, stats, _ = evotune_loop(points, problem, space, workers)
        print(json.dumps({"seconds": total, "first_config_s": first, "cache": stats}))
        return
    os.environ["EVOTUNE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="evotune-kernels-")
    cold, cold_first, cold_stats, cold_parts = evotune_loop(points, problem, space, workers)
    warm, warm_first, warm_stats, warm_parts = evotune_loop(points, problem, space, workers)
    argv = ["--space", args.space, "--configs", str(args.configs), "--problem", args.problem, "--dtype", args.dtype,
            "--workers", str(workers)]
    fresh, fresh_loop = fresh_process_loop(argv)
    os.environ["EVOTUNE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix="evotune-serial-")  # the serial loop compiles all
    serial, serial_first = serial_loop(points, problem, args.space)
    runs = {"serial": (serial, serial_first), "cold": (cold, cold_first), "warm": (warm, warm_first)}
    # Start-up (processes, imports, CUDA, the first compile) is paid once per run, however many problems and
    # configurations follow: the figures after the first configuration are each loop's pace once running.
    rest = len(points) - 1
    out = {"device": ctx.hardware.name, "space": args.space, "problem": problem.key, "configs": len(points),
           "workers": workers,
           "seconds": {name: total for name, (total, _) in runs.items()},
           "first_config_s": {name: first for name, (_, first) in runs.items()},
           "configs_per_minute": {name: 60.0 * len(points) / total for name, (total, _) in runs.items()},
           "configs_per_minute_after_first": {name: 60.0 * rest / (total - first)
                                              for name, (total, first) in runs.items()},
           "cache": {"cold": cold_stats, "warm": warm_stats, "warm_fresh_process": fresh_loop["cache"]},
           "per_point": {"cold": cold_parts, "warm": warm_parts},
           "speedup_vs_serial": {"cold": serial / cold, "warm": serial / warm},
           "speedup_vs_serial_after_first": {name: (serial - serial_first) / (runs[name][0] - runs[name][1])
                                             for name in ("cold", "warm")},
           # a second tuner process on the warm cache: its interpreter, imports and process server included
           "warm_fresh_process": {"seconds": fresh, "loop_seconds": fresh_loop["seconds"],
                                  "first_config_s": fresh_loop["first_config_s"],
                                  "speedup_vs_serial": serial / fresh}}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""Landscapes of the Triton matmul example over its large space (examples/triton_autotune/matmul_space.py).

One uniform random sample of the space's feasible configurations (``--sample``, drawn with ``--seed``), the
same for every shape (the space's constraints do not read the shape), is compiled once in a process pool
(``--jobs`` workers, each compiling configurations into one shared Triton cache, ``--triton-cache``, a fresh
folder by default so that each compile time is a cold one) while the main process takes each compiled
configuration in turn and, on every shape: checks the compiled kernel against the device's limits, runs it
once against the fp32 product of torch (a failing or wrong configuration is recorded failed, not timed),
then times it with evotune's oracle (CUDA graph, clean L2 flush, at least 10 and at most 50 samples, until
the 95% CI of the median is within 2%). torch.matmul is timed once per shape as a baseline, at the end (the
compile workers gone).

Each shape's results are an evotune landscape (``docs/LANDSCAPE_FORMAT.md``) named by the space and the
problem, ``OUT/matmul_example_gemm_fp16_tt_MxNxK.json.gz``; a sampled file (``complete`` false, ``coverage``
says what it holds), rewritten every ``--checkpoint`` configurations and at the end. ``--max-seconds``
stops taking configurations once that much time has passed (at least one is measured) and writes what it
has. Default shapes (fp16, M x N x K): 512^3, 1024^3, 2048^3, 4096^3, 16 x 4096 x 4096, 64 x 11008 x 4096::

    python benchmarks/autotune_landscapes.py --sample 400 --out evotune/landscapes/autotune_matmul

Then every shape's near-optimal points (``--confirm-within``: within that fraction of the shape's recorded
optimum, and at least its ``--confirm-top`` fastest) are timed again side by side: ``--confirm-rounds`` rounds,
each timing every such point ``--confirm-samples`` times in a shuffled order (evotune.autotune's oracle timer: a
CUDA graph per point, clean L2), and each takes the median of all its samples. One noisy median among 2,478
makes a lucky optimum that no search can match (the optimum of a recording is the minimum of its noise); the
confirmed medians make near-ties ties. The file's ``confirmed`` field says which points, how, and when.
``--confirm-only`` runs this pass alone on the files ``--out`` holds for ``--shapes``::

    python benchmarks/autotune_landscapes.py --confirm-only --out evotune/landscapes/autotune_matmul

On the CPU (``TRITON_INTERPRET=1``) it runs the same steps on fp32 tensors, the wall clock as its timer.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "triton_autotune")]

import matmul_space as ms  # noqa: E402
import torch  # noqa: E402

from evotune.core.hardware import Hardware, detect, get_hardware  # noqa: E402
from evotune.core.landscape import landscape_document, load_landscape, write_landscape  # noqa: E402
from evotune.core.problem import Problem  # noqa: E402
from evotune.core.result import EvalResult, Status  # noqa: E402
from evotune.core.space import FeasibleSet, Point  # noqa: E402
from evotune.measurement.options import TimingOptions  # noqa: E402
from evotune.measurement.workloads.gemm import TOLERANCE  # noqa: E402
from evotune.triton_tuning.configs import Candidates, LaunchContext  # noqa: E402
from evotune.triton_tuning.resources import compile_config, over_limits  # noqa: E402
from evotune.triton_tuning.timers import OracleTimer, Timer, WallClockTimer  # noqa: E402

SHAPES = "512x512x512,1024x1024x1024,2048x2048x2048,4096x4096x4096,16x4096x4096,64x11008x4096"
TIMING = TimingOptions(min_samples=10, max_samples=50, ci_target=0.02)
MAX_SAMPLES = 4  # timing samples kept per point in the files
TINY = 64  # the compile launch's M = N = K: the same specialization (multiples of 16, unit strides) as every shape
CANDIDATES = Candidates.from_space(ms.SPACE)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Shape:
    m: int
    n: int
    k: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``MxNxK``; ValueError naming what is wrong."""
        try:
            m, n, k = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"{text!r} is not MxNxK") from None
        if min(m, n, k) <= 0:
            raise ValueError(f"{text!r} has a size below 1")
        return cls(m, n, k)

    def problem(self, dtype: str) -> Problem:
        # A (M, K) and B (K, N) both row-major: K is contiguous in A only, which is the BLAS layout "tt"
        return Problem.gemm(self.m, self.n, self.k, dtype=dtype, layout="tt")


@dataclass(frozen=True)
class Compiled:
    """What a compile worker reports for one sampled configuration."""

    index: int
    compile_s: float
    error: str | None = None


class CpuTimer(WallClockTimer):
    """The interpreter's wall clock, two samples a launch: it orders nothing a GPU would, and is slow."""

    search_samples = 2


# -- the sample and its compilation -----------------------------------------------------------------
def device() -> str:
    return "cuda" if torch.cuda.is_available() and not interpreted() else "cpu"


def dtype_name() -> str:
    return "fp16" if device() == "cuda" else "fp32"  # the interpreter's tl.dot is numpy's: fp32 on the CPU


def tensors(shape: Shape, seed: int = 0) -> tuple[Any, Any, Any]:
    dt = torch.float16 if dtype_name() == "fp16" else torch.float32
    gen = torch.Generator(device=device()).manual_seed(seed)
    a = torch.randn(shape.m, shape.k, device=device(), dtype=dt, generator=gen)
    b = torch.randn(shape.k, shape.n, device=device(), dtype=dt, generator=gen)
    return a, b, torch.empty(shape.m, shape.n, device=device(), dtype=dt)


def sample(hardware: Hardware, size: int, seed: int) -> tuple[list[Point], int]:
    """(``size`` feasible points drawn uniformly without replacement, how many are feasible)."""
    a, b, c = tensors(Shape(TINY, TINY, TINY))
    ctx = LaunchContext(hardware=hardware, args=dict(zip(ms.matmul_space_kernel.arg_names, ms.launch_args(a, b, c),
                                                         strict=False)))
    fs = FeasibleSet.build(ms.SPACE, ctx)
    rows = np.random.default_rng(seed).choice(len(fs), size=min(size, len(fs)), replace=False)
    return [fs.point(int(r)) for r in rows], len(fs)


def compile_one(index: int, point: Point) -> Compiled:
    """Compile one configuration for the shapes' specialization (on the CPU: one tiny interpreted launch)."""
    a, b, c = tensors(Shape(TINY, TINY, TINY))
    config = CANDIDATES.config(point)
    fn = ms.matmul_space_kernel.fn
    started = time.perf_counter()
    try:
        if interpreted():
            fn[ms.grid(TINY, TINY)](*ms.launch_args(a, b, c), **config.all_kwargs())
        else:
            compile_config(fn, ms.launch_args(a, b, c), {"grid": (1,)}, config)
    except Exception as exc:  # a configuration that does not compile fails alone
        return Compiled(index, time.perf_counter() - started, f"{type(exc).__name__}: {exc}".splitlines()[0])
    return Compiled(index, time.perf_counter() - started)


def compiling(points: Sequence[Point], jobs: int) -> tuple[Any, list[Future[Compiled]]]:
    """Start compiling every point in ``jobs`` spawned workers: (the pool, one future per point)."""
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
    return pool, [pool.submit(compile_one, i, p) for i, p in enumerate(points)]


# -- measuring --------------------------------------------------------------------------------------
Launch = Callable[[Any, tuple[Any, ...], dict[str, Any]], object]


def triton_launch(grid: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    return ms.matmul_space_kernel.fn[grid](*args, **kwargs)


@dataclass
class Bench:
    """One shape's inputs, reference and recorded rows."""

    shape: Shape
    a: Any
    b: Any
    c: Any
    ref: Any
    rows: list[tuple[Point, EvalResult]]

    @classmethod
    def make(cls, shape: Shape) -> Bench:
        a, b, c = tensors(shape)
        return cls(shape, a, b, c, a.float() @ b.float(), [])

    def error(self) -> float:
        out = self.c.float()
        if not bool(torch.isfinite(out).all()):
            return math.inf
        return float(torch.linalg.vector_norm(out - self.ref) / torch.linalg.vector_norm(self.ref).clamp_min(1e-30))


def measure(bench: Bench, point: Point, compiled: Compiled, timer: Any, launch: Launch = triton_launch) -> EvalResult:
    """One configuration on one shape: failed (with why) or verified and timed."""
    if compiled.error is not None:
        return EvalResult(Status.COMPILE_ERROR, message=compiled.error, compile_s=compiled.compile_s)
    config = CANDIDATES.config(point)
    kwargs = config.all_kwargs()
    s = bench.shape
    args = ms.launch_args(bench.a, bench.b, bench.c)
    grid = ms.grid(s.m, s.n)
    started = time.perf_counter()
    try:
        reason = over_limits(ms.matmul_space_kernel.fn, args, {"grid": grid}, config) if launch is triton_launch \
            else None
        if reason is not None:
            return EvalResult(Status.COMPILE_ERROR, message=f"over the device's limits: {reason}",
                              compile_s=compiled.compile_s)
        bench.c.fill_(math.nan)
        launch(grid, args, kwargs)
        if device() == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # a launch that fails fails this configuration only
        return EvalResult(Status.RUNTIME_ERROR, message=f"{type(exc).__name__}: {exc}".splitlines()[0],
                          compile_s=compiled.compile_s, bench_s=time.perf_counter() - started)
    err = bench.error()
    tol = TOLERANCE[dtype_name()]
    if not err <= tol:
        return EvalResult(Status.WRONG_RESULT, error=err, message=f"relative error {err:.3g} exceeds {tol:g}",
                          compile_s=compiled.compile_s, bench_s=time.perf_counter() - started)
    ms_, samples = timer.measure(lambda: launch(grid, args, kwargs))
    return EvalResult(Status.OK, ms_, samples, compile_s=compiled.compile_s,
                      bench_s=time.perf_counter() - started, error=err)


def baseline(bench: Bench, timer: Any) -> dict[str, Any]:
    out = torch.empty_like(bench.c)
    median, samples = timer.measure(lambda: torch.matmul(bench.a, bench.b, out=out))
    kept = sorted(samples)[:: max(1, len(samples) // MAX_SAMPLES)][:MAX_SAMPLES]
    return {"time_ms": round(median, 6), "samples_ms": [round(x, 6) for x in kept]}


# -- writing ----------------------------------------------------------------------------------------
def file_name(shape: Shape) -> str:
    return f"{ms.SPACE.name}_{shape.problem(dtype_name()).key}.json.gz"


def write(out: Path, bench: Bench, meta: dict[str, Any]) -> Path:
    problem = bench.shape.problem(dtype_name())
    doc = landscape_document(ms.SPACE.params, bench.rows, problem, {**meta, "recorded": len(bench.rows)},
                             ms.SPACE.name, MAX_SAMPLES)
    return write_landscape(out / file_name(bench.shape), doc)


def device_meta(hardware: Hardware) -> dict[str, Any]:
    if device() != "cuda":
        return {"device": "cpu (Triton interpreter)", "hardware": hardware.name}
    from evotune.measurement.gpu_worker import device_info

    info = device_info()
    return {"device": info["device"], "device_info": info, "hardware": hardware.name, "flush": TIMING.flush}


# -- the run ----------------------------------------------------------------------------------------
def run(opts: argparse.Namespace) -> list[Path]:
    started = time.perf_counter()
    fresh = None if opts.triton_cache else tempfile.mkdtemp(prefix="triton_cache_")  # removed at the end
    os.environ["TRITON_CACHE_DIR"] = fresh or str(Path(opts.triton_cache).resolve())
    hardware = detect() if device() == "cuda" else get_hardware("H100")
    points, feasible = sample(hardware, opts.sample, opts.seed)
    shapes = opts.shapes
    print(f"{feasible} feasible configurations on {hardware.name} ({dtype_name()}); timing {len(points)} of them on "
          f"{len(shapes)} shapes; compiling with {opts.jobs} workers into {os.environ['TRITON_CACHE_DIR']}",
          flush=True)
    pool, futures = compiling(points, opts.jobs)  # first: the workers start while the inputs are made
    try:
        timer: Timer = OracleTimer(rep_ms=opts.point_seconds * 1e3, timing=TIMING) if device() == "cuda" \
            else CpuTimer()
        benches = [Bench.make(s) for s in shapes]
        meta: dict[str, Any] = {
            **device_meta(hardware), "feasible": feasible, "complete": False,
            "coverage": {"kind": "sample", "searched": 0, "studies": [], "random": len(points), "seed": opts.seed,
                         "feasible": feasible},
            "timing": ({"min_samples": TIMING.min_samples, "max_samples": TIMING.max_samples,
                        "ci_target": TIMING.ci_target, "flush": TIMING.flush, "max_seconds": opts.point_seconds}
                       if device() == "cuda" else {"wall_clock_samples": CpuTimer.search_samples}),
            "command": "python benchmarks/autotune_landscapes.py " + " ".join(sys.argv[1:]),
        }
        baselines: dict[Shape, dict[str, Any]] = {b.shape: {} for b in benches}  # timed at the end, on a quiet GPU
        index = {fut: i for i, fut in enumerate(futures)}
        out = Path(opts.out)
        done = failed = 0
        for fut in as_completed(futures):
            try:
                compiled = fut.result()
            except Exception as exc:  # the worker died (a crash in the compiler): this configuration fails
                compiled = Compiled(index[fut], 0.0, f"compile worker failed: {type(exc).__name__}: {exc}")
            point = points[compiled.index]
            for bench in benches:
                result = measure(bench, point, compiled, timer)
                failed += result.status is not Status.OK
                bench.rows.append((point, result))
            done += 1
            elapsed = time.perf_counter() - started
            if done % opts.checkpoint == 0 or done == len(points):
                for bench in benches:
                    write(out, bench, {**meta, "baselines": baselines[bench.shape]})
                print(f"[{elapsed:5.0f} s] {done}/{len(points)} configurations on {len(shapes)} shapes, "
                      f"{failed} failed points", flush=True)
            if elapsed > opts.max_seconds and done < len(points):
                print(f"--max-seconds {opts.max_seconds:g} reached after {done} configurations", flush=True)
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # the compiles under way finish; the others never start
        if fresh:
            shutil.rmtree(fresh, ignore_errors=True)
    baselines = {b.shape: {"torch.matmul": baseline(b, timer)} for b in benches}
    paths = [write(out, bench, {**meta, "baselines": baselines[bench.shape]}) for bench in benches]
    if opts.confirm_rounds > 0:
        paths = confirm(opts, benches, [{**meta, "baselines": baselines[b.shape]} for b in benches])
    for bench, path in zip(benches, paths, strict=True):
        ok = [r.time_ms for _, r in bench.rows if r.status is Status.OK and r.time_ms is not None]
        best = f"best {min(ok):.4g} ms" if ok else "no config ran"
        print(f"{path}: {len(bench.rows)} points, {len(ok)} ok, {best}, torch.matmul "
              f"{baselines[bench.shape]['torch.matmul']['time_ms']:.4g} ms")
    print(f"total {time.perf_counter() - started:.0f} s")
    return paths


# -- confirming the near-optimal points -------------------------------------------------------------
def near_optimal(rows: list[tuple[Point, EvalResult]], within: float, top: int) -> list[int]:
    """Indices of the rows within ``within`` of the fastest time, and at least the ``top`` fastest."""
    ok = sorted((r.time_ms, i) for i, (_, r) in enumerate(rows) if r.status is Status.OK and r.time_ms is not None)
    if not ok:
        return []
    limit = ok[0][0] * (1.0 + within)
    return [i for n, (t, i) in enumerate(ok) if t <= limit or n < top]


def confirm(opts: argparse.Namespace, benches: Sequence[Bench], metas: Sequence[dict[str, Any]]) -> list[Path]:
    """Re-time each shape's near-optimal points side by side and rewrite its file with their confirmed medians."""
    timer: Timer = OracleTimer() if device() == "cuda" else CpuTimer()
    rng = np.random.default_rng(opts.seed)
    paths = []
    for bench, meta in zip(benches, metas, strict=True):
        chosen = near_optimal(bench.rows, opts.confirm_within, opts.confirm_top)
        calls: dict[int, Callable[[], object]] = {}
        s = bench.shape
        args, grid = ms.launch_args(bench.a, bench.b, bench.c), ms.grid(s.m, s.n)
        for i in chosen:
            calls[i] = functools.partial(triton_launch, grid, args, CANDIDATES.config(bench.rows[i][0]).all_kwargs())
        samples: dict[int, list[float]] = {i: [] for i in chosen}
        started = time.perf_counter()
        for _ in range(opts.confirm_rounds):
            for i in rng.permutation(chosen):
                samples[int(i)] += timer.samples(calls[int(i)], opts.confirm_samples)
        seconds = time.perf_counter() - started
        for i in chosen:
            point, r = bench.rows[i]
            bench.rows[i] = (point, EvalResult(Status.OK, float(np.median(samples[i])), samples[i],
                                               compile_s=r.compile_s, bench_s=r.bench_s, error=r.error))
        record = {"within": opts.confirm_within, "top": opts.confirm_top, "points": len(chosen),
                  "rounds": opts.confirm_rounds, "samples_per_round": opts.confirm_samples,
                  "seconds": round(seconds, 1),
                  "timer": "evotune.autotune oracle (CUDA graph, clean L2)" if device() == "cuda" else "wall clock",
                  "date": time.strftime("%Y-%m-%d"), "command": "python benchmarks/autotune_landscapes.py " +
                  " ".join(sys.argv[1:])}
        paths.append(write(Path(opts.out), bench, {**meta, "confirmed": record}))
        ok = sorted(r.time_ms for _, r in bench.rows if r.status is Status.OK and r.time_ms is not None)
        print(f"{paths[-1]}: {len(chosen)} near-optimal points confirmed in {seconds:.1f} s; optimum {ok[0]:.4g} ms, "
              f"{sum(t <= ok[0] / 0.99 for t in ok)} within 1%", flush=True)
    return paths


def confirm_only(opts: argparse.Namespace) -> list[Path]:
    """The confirmation pass on the files already recorded for ``--shapes``."""
    hardware = detect() if device() == "cuda" else get_hardware("H100")
    benches, metas = [], []
    for shape in opts.shapes:
        path = Path(opts.out) / file_name(shape)
        ls = load_landscape(path)
        bench = Bench.make(shape)
        bench.rows = [(dict(zip(ls.names, key, strict=True)), r) for key, r in ls.entries.items()]
        benches.append(bench)
        metas.append({k: v for k, v in ls.meta.items() if k not in ("version", "space", "confirmed")})
    print(f"confirming on {hardware.name}: {', '.join(f'{b.shape.m}x{b.shape.n}x{b.shape.k}' for b in benches)}",
          flush=True)
    # a point's first launch compiles it (Triton's cache makes that once per configuration)
    return confirm(opts, benches, metas)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", type=int, default=400, help="configurations drawn from the feasible ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shapes", default=SHAPES, help="comma-separated MxNxK")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 4) - 2), help="compile workers")
    p.add_argument("--out", default="runs/autotune_matmul",
                   help="default runs/autotune_matmul: the shipped files (evotune/landscapes/autotune_matmul) are "
                        "rewritten only when --out names their folder")
    p.add_argument("--max-seconds", type=float, default=420.0, help="stop taking configurations after this")
    p.add_argument("--point-seconds", type=float, default=2.0, help="at most this much sampling per point")
    p.add_argument("--checkpoint", type=int, default=50, help="rewrite the files every N configurations")
    p.add_argument("--triton-cache", default="", help="Triton's cache folder (default: a fresh temporary one)")
    p.add_argument("--confirm-within", type=float, default=0.10, help="confirm points within this of the optimum")
    p.add_argument("--confirm-top", type=int, default=30, help="... and at least this many of the fastest")
    p.add_argument("--confirm-rounds", type=int, default=10)
    p.add_argument("--confirm-samples", type=int, default=10, help="samples of each point per round")
    p.add_argument("--confirm-only", action="store_true", help="only confirm the files --out holds for --shapes")
    opts = p.parse_args(argv)
    try:
        opts.shapes = [Shape.parse(s) for s in opts.shapes.split(",")]
    except ValueError as exc:
        p.error(f"--shapes: {exc}")
    for name in ("sample", "jobs", "checkpoint", "confirm_samples"):
        if getattr(opts, name) < 1:
            p.error(f"--{name}: expected an integer >= 1, got {getattr(opts, name)}")
    missing = [Path(opts.out) / file_name(s) for s in opts.shapes if not (Path(opts.out) / file_name(s)).is_file()]
    if opts.confirm_only and missing:
        p.error(f"--confirm-only: {missing[0]}: no such file")
    return opts


if __name__ == "__main__":
    options = parse_args()
    confirm_only(options) if options.confirm_only else run(options)

"""evotune.autotune on the fused-MoE example against vLLM's config grid: each batch size's pick, and the GPU time.

Two phases, each resumable (run the command again to go on where ``--max-seconds`` stopped it):

1. **tune**: ``evotune.autotune`` tunes every key of ``--keys`` in order, exactly as ``python -m evotune
   tune-kernel`` does (online mode, the decorator's budget, transfer from the keys tuned before, confirmation
   of the top three), into the cache ``--cache`` (a Triton cache of its own, fresh, so compiles are cold).
   Per key: the wall time, and of it the time spent timing (the trials' ``bench_s``) and compiling.
2. **grid**: vLLM's grid (``benchmark_moe.py``'s 1,920 configurations, the example's space without its
   constraints) is timed on the keys' batch sizes: every configuration for ``--exhaustive`` batch sizes, and
   for the others a uniform sample (``--sample``) plus the ``--nearest`` fastest of the nearest exhaustive batch
   size, so that the reference is a strong one. Configurations are compiled beforehand in a process pool (one
   compile per Triton specialization of M: 1, not a multiple of 16, a multiple of 16; one for all where the kernel
   is not specialised on M, as the package's is); each is launched once and
   checked against a float32 torch product of its slots (a key of dtype ``float8_e4m3fn``: e4m3 activations and
   weights scaled per tensor, vLLM's ``fp8_w8a8``, against the product of the values they stand for, their scales
   applied, within evotune's scaled-fp8 tolerance of 1e-2; a wrong one is failed, not timed), then timed by
   evotune's oracle (CUDA graph, clean L2 flush, 10 to 50 samples until the 95% CI of the median is within 2%:
   a cheaper timing than the search's, so the grid's GPU time below is, if anything, understated). The
   exhaustive batch sizes are written as landscapes (``--landscapes``).
3. **report** (after both): per key, the decided configuration and the reference's three fastest re-timed
   side by side (:func:`evotune.measurement.retiming.confirm_rounds` with the search's own timer); the
   fraction is the fastest's median over the decided one's. GPU time: the search's timing seconds over the
   grid's (measured for an exhaustive batch size, the sample's mean per configuration x 1,920 for the others).
   The export: ``export-configs --format vllm-moe`` is written and read back as vLLM reads it
   (``{int(batch): config}``, the six config fields).

::

    python benchmarks/autotune_moe.py --out runs/autotune_moe --max-seconds 540

Everything lands under ``--out``: ``cache.db`` (the study per key), ``tune.json``, ``grid.json``,
``report.json``, the vLLM JSON, and the landscapes unless ``--landscapes`` says elsewhere. On the CPU
(``TRITON_INTERPRET=1``) ``--keys`` should name tiny keys and ``--grid-limit`` cut the grid; the timer is then
the wall clock.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "triton_autotune"
sys.path[:0] = [str(ROOT), str(EXAMPLES)]

import torch  # noqa: E402

from benchmarks.triton_device import device, interpreted, sync  # noqa: E402
from evotune.core.landscape import landscape_document, write_landscape  # noqa: E402
from evotune.core.problem import Problem  # noqa: E402
from evotune.core.result import EvalResult, Status  # noqa: E402
from evotune.core.space import Point  # noqa: E402
from evotune.measurement.options import TimingOptions  # noqa: E402
from evotune.measurement.workloads.gemm_fp8 import SCALED_TOLERANCE  # noqa: E402
from evotune.triton_tuning.ahead import load_keys  # noqa: E402
from evotune.triton_tuning.builds import not_specialised_on, specialisation  # noqa: E402
from evotune.triton_tuning.configs import Candidates  # noqa: E402
from evotune.triton_tuning.references import load_kernel  # noqa: E402
from evotune.triton_tuning.resources import compile_config, over_limits  # noqa: E402
from evotune.triton_tuning.timers import OracleTimer, Timer, WallClockTimer  # noqa: E402
from search_spaces._triton_fused_moe import dequantized  # noqa: E402

KERNEL = f"{EXAMPLES / 'fused_moe.py'}:moe_gemm_tuned"
KEYS = EXAMPLES / "moe_mixtral_tp2.toml"
GRID_TIMING = TimingOptions(min_samples=10, max_samples=50, ci_target=0.02)
# relative norm error of the output; fp8 (e4m3 scaled per tensor, bf16 out) against the fp32 product of the values
# its inputs stand for, within the tolerance evotune's scaled-fp8 GEMMs are verified with
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4, "float8_e4m3fn": SCALED_TOLERANCE}
MAX_SAMPLES = 4  # timing samples kept per point in the landscapes


def specialization(m: int, unspecialised: frozenset[str] = frozenset()) -> str:
    """The kernel Triton compiles for M (:func:`evotune.triton_tuning.builds.specialisation`), by this benchmark's
    label: one for M = 1, one for a multiple of 16, one for anything else; one for every M where the kernel is not
    specialised on it (``unspecialised``, the package's fused MoE on a GPU)."""
    return SPECIALIZATIONS[specialisation({"M": m}, unspecialised)[0]]


#: builds.specialisation's class of M -> its label here
SPECIALIZATIONS = {"M=1": "1", "M=16": "16n", "M=-": "other", "M=*": "any"}


def grid_points(space: Any) -> list[Point]:
    """Every configuration of vLLM's grid: the product of the space's choices, its constraints not applied."""
    names = [p.name for p in space.params]
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(p.choices for p in space.params))]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def key_name(key: dict[str, Any]) -> str:
    return f"M{key['M']}"


# -- phase 1: tune ------------------------------------------------------------------------------------
def tune(opts: argparse.Namespace, deadline: float) -> dict[str, Any]:
    out = Path(opts.out)
    doc = read_json(out / "tune.json") or {"command": command(), "keys": {}}
    kernel, module = load_kernel(KERNEL)
    keys = load_keys(Path(opts.keys), module)
    kernel.use_cache(str(out / "cache.db"))
    kernel.mode = "online"
    if opts.budget:
        kernel.budget = opts.budget
    for key in keys.keys:
        name = key_name(key)
        if name in doc["keys"]:
            continue
        if time.perf_counter() > deadline:
            print(f"tune: --max-seconds reached before {name}", flush=True)
            break
        grid, args, kwargs = keys.launch(**key)
        started = time.perf_counter()
        kernel[grid](*args, **kwargs)
        sync()
        wall = time.perf_counter() - started
        fields = kernel.key_fields(dict(zip(kernel.arg_names, args, strict=False)), kwargs)
        store = kernel.decision_store.existing(fields, kernel.candidates.space)
        assert store is not None
        trials = store.history()
        decision = kernel.last_decision
        confirm_s = float((decision.confirmation or {}).get("seconds", 0.0)) if decision is not None else 0.0
        doc["keys"][name] = {
            "key": key, "config": kernel.candidates.describe(kernel.candidates.space.from_storage(decision.config)),
            "decided_ms": decision.time_ms, "how": decision.how, "evaluations": len(trials),
            "wall_s": wall, "bench_s": sum(float(t.attrs.get("bench_s") or 0.0) for t in trials),
            "compile_s": sum(float(t.attrs.get("compile_s") or 0.0) for t in trials), "confirm_s": confirm_s,
        }
        write_json(out / "tune.json", doc)
        k = doc["keys"][name]
        print(f"tune {name}: {k['evaluations']} evaluations, {wall:.1f} s wall ({k['bench_s']:.1f} s timing, "
              f"{k['compile_s']:.1f} s compiling, {confirm_s:.1f} s confirming), {decision.how} "
              f"{decision.time_ms} ms, {k['config']}", flush=True)
    return doc


# -- phase 2: the grid --------------------------------------------------------------------------------
@dataclass
class Inputs:
    """One batch size's launch and the float32 reference of every slot's row."""

    grid: Callable[[dict[str, Any]], tuple[int]]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    ref: Any

    @classmethod
    def make(cls, launch: Callable[..., Any], key: dict[str, Any], bm: int) -> Inputs:
        """``bm``: the first BLOCK_SIZE_M of the example, whose alignment the launch carries first."""
        grid, args, kwargs = launch(**key)
        x, w, c, weights, top_k = args[0], args[1], args[2], args[6], kwargs["top_k"]
        slots = torch.arange(c.shape[0], device=c.device)
        # the experts of each slot: the routing the launch carries, read back from its first alignment
        slot_ids, block_expert, offsets = args[3], args[4], args[5]
        s0, b0, padded = (int(v) for v in offsets[:3].tolist())
        expert_of = torch.empty(c.shape[0], dtype=torch.long, device=c.device)
        sorted_slots = slot_ids[s0:s0 + padded].long()
        owners = block_expert[b0:b0 + padded // bm].long().repeat_interleave(bm)
        live = sorted_slots < c.shape[0]
        expert_of[sorted_slots[live]] = owners[live]
        ref = torch.empty(c.shape, dtype=torch.float32, device=c.device)
        xf, wf = x.float(), w.float()
        if kwargs.get("FP8"):  # what the e4m3 inputs stand for: the scales the kernel is given, applied
            xf, wf = dequantized(x, args[7], w, args[8], kwargs["SCALE_BLOCK"])
        for e in range(w.shape[0]):
            rows = slots[expert_of == e]
            ref[rows] = weights[rows, None] * (xf[rows // top_k] @ wf[e].T)
        return cls(grid, args, kwargs, ref)

    def error(self) -> float:
        out = self.args[2].float()
        if not bool(torch.isfinite(out).all()):
            return math.inf
        return float(torch.linalg.vector_norm(out - self.ref) / torch.linalg.vector_norm(self.ref).clamp_min(1e-30))


#: a representative M of each specialization: Triton's compiled kernel depends on the class, not the value
REPRESENTATIVE_M = {"1": 1, "16n": 16, "other": 8, "any": 16}


@functools.cache
def _compile_launch(keys_path: str, key: tuple[tuple[str, Any], ...]) -> tuple[Any, Any, tuple[Any, ...], Any]:
    kernel, module = load_kernel(KERNEL)
    _, args, kwargs = load_keys(Path(keys_path), module).launch(**dict(key))
    return kernel, module, args, kwargs


def compile_one(index: int, point: Point, spec: str, key: dict[str, Any], keys_path: str) -> tuple[float, str | None]:
    """Compile one configuration for a specialization of M in a worker: (seconds, error or None).

    The launch is a tiny one (N = K = 64: multiples of 16, as the keys' N and K are, so the same kernel), made
    once per worker."""
    tiny = {**key, "M": REPRESENTATIVE_M[spec], "N": 64, "K": 64}
    kernel, module, args, kwargs = _compile_launch(keys_path, tuple(sorted(tiny.items())))
    config = Candidates.from_space(module.SPACE).config(point)
    started = time.perf_counter()
    try:
        if not interpreted():  # the interpreter compiles nothing: each launch interprets the source
            compile_config(kernel.fn, args, {"grid": (1,), **kwargs}, config)
    except Exception as exc:  # a configuration that does not compile fails alone
        return time.perf_counter() - started, f"{type(exc).__name__}: {exc}".splitlines()[0]
    return time.perf_counter() - started, None


class InPlace(Executor):
    """Runs each submitted call at once, in this process: the compile "pool" under the interpreter, where
    :func:`compile_one` compiles nothing and a worker process would spend seconds importing torch and the kernel."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # as a worker's: the configuration fails, the grid goes on
            done.set_exception(exc)
        return done


def time_point(kernel: Any, inputs: Inputs, config: Any, timer: Timer, compile_s: float,
               compile_error: str | None, tolerance: float) -> EvalResult:
    if compile_error is not None:
        return EvalResult(Status.COMPILE_ERROR, message=compile_error, compile_s=compile_s)
    kwargs = {**inputs.kwargs, **config.all_kwargs()}
    started = time.perf_counter()
    try:
        reason = None if interpreted() else over_limits(kernel.fn, inputs.args,
                                                        {"grid": inputs.grid, **inputs.kwargs}, config)
        if reason is not None:
            return EvalResult(Status.COMPILE_ERROR, message=f"over the device's limits: {reason}",
                              compile_s=compile_s)
        inputs.args[2].fill_(math.nan)
        kernel.fn[inputs.grid](*inputs.args, **kwargs)
        sync()
    except Exception as exc:  # a launch that fails fails this configuration only
        return EvalResult(Status.RUNTIME_ERROR, message=f"{type(exc).__name__}: {exc}".splitlines()[0],
                          compile_s=compile_s, bench_s=time.perf_counter() - started)
    err = inputs.error()
    if not err <= tolerance:
        return EvalResult(Status.WRONG_RESULT, error=err, message=f"relative error {err:.3g} exceeds {tolerance:g}",
                          compile_s=compile_s, bench_s=time.perf_counter() - started)
    median, samples = timer.measure(lambda: kernel.fn[inputs.grid](*inputs.args, **kwargs))
    return EvalResult(Status.OK, median, samples, compile_s=compile_s, bench_s=time.perf_counter() - started,
                      error=err)


def plan(opts: argparse.Namespace, keys: list[dict[str, Any]], points: list[Point],
         done: dict[str, Any]) -> dict[str, list[int]]:
    """The grid indices each batch size is timed on: all for an exhaustive one; else the sample and the
    ``--nearest`` fastest of the nearest exhaustive batch size (which must be timed first)."""
    rng = np.random.default_rng(opts.seed)
    sample = sorted(int(i) for i in rng.choice(len(points), size=min(opts.sample, len(points)), replace=False))
    out: dict[str, list[int]] = {}
    exhaustive = [k for k in keys if k["M"] in opts.exhaustive]
    for key in keys:
        name = key_name(key)
        if key["M"] in opts.exhaustive:
            out[name] = list(range(len(points)))
            continue
        nearest = min(exhaustive, key=lambda k: (abs(math.log2(k["M"] / key["M"])), k["M"]), default=None)
        extra: list[int] = []
        if nearest is not None and done.get(key_name(nearest), {}).get("complete"):
            rows = done[key_name(nearest)]["rows"]
            ok = sorted((r["time_ms"], i) for i, r in rows.items() if r["status"] == "ok")
            extra = [int(i) for _, i in ok[:opts.nearest]]
        out[name] = sorted(set(sample) | set(extra))
    return out


def grid(opts: argparse.Namespace, deadline: float) -> dict[str, Any]:
    out = Path(opts.out)
    doc = read_json(out / "grid.json") or {"command": command(), "timing": GRID_TIMING.__dict__, "sizes": {}}
    kernel, module = load_kernel(KERNEL)
    keys_file = load_keys(Path(opts.keys), module)
    points = grid_points(module.SPACE)[: opts.grid_limit or None]
    candidates = Candidates.from_space(module.SPACE)
    order = sorted(keys_file.keys, key=lambda k: k["M"] not in opts.exhaustive)  # exhaustive first: the nearest
    # the grid's timing: fewer samples than the search's (a 2% CI), at most 2 s a configuration
    timer: Timer = OracleTimer(rep_ms=2000.0, timing=GRID_TIMING) if device() == "cuda" else WallClockTimer()
    pool: Executor = InPlace() if interpreted() else ProcessPoolExecutor(max_workers=opts.jobs,
                                                                          mp_context=get_context("spawn"))
    sizes = doc["sizes"]
    try:
        # every (specialization, configuration) the sizes left need, submitted in the order they are timed: the
        # timing of one configuration overlaps the compiling of the next ones
        todo = plan(opts, order, points, sizes)
        free = not_specialised_on(kernel.fn)
        futures: dict[tuple[str, int], Any] = {}
        for key in order:
            if not sizes.get(key_name(key), {}).get("complete"):
                for i in todo[key_name(key)]:
                    spec = specialization(key["M"], free)
                    if (spec, i) not in futures:
                        futures[spec, i] = pool.submit(compile_one, i, points[i], spec, key, str(opts.keys))
        for key in order:
            name = key_name(key)
            size = sizes.setdefault(name, {"key": key, "exhaustive": key["M"] in opts.exhaustive, "rows": {},
                                           "complete": False, "seconds": 0.0})
            if size["complete"]:
                continue
            if time.perf_counter() > deadline:
                print(f"grid: --max-seconds reached before {name}", flush=True)
                break
            indices = plan(opts, order, points, sizes)[name]
            inputs = Inputs.make(keys_file.launch, key, module.BLOCK_M_CHOICES[0])
            tolerance = TOLERANCE[str(inputs.args[0].dtype).removeprefix("torch.")]
            rows = size["rows"]
            began = time.perf_counter()
            for n, i in enumerate(indices):
                if str(i) in rows:
                    continue
                if time.perf_counter() > deadline:
                    break
                fut = futures.get((specialization(key["M"], free), i))
                try:
                    seconds, error = fut.result() if fut is not None else (0.0, None)
                except Exception as exc:  # the worker died (a crash in the compiler): this configuration fails
                    seconds, error = 0.0, f"compile worker failed: {type(exc).__name__}: {exc}"
                result = time_point(kernel, inputs, candidates.config(points[i]), timer, seconds, error, tolerance)
                rows[str(i)] = {"status": result.status.value, "time_ms": result.time_ms, "bench_s": result.bench_s,
                                "compile_s": result.compile_s, "message": result.message,
                                "samples_ms": result.samples_ms[:MAX_SAMPLES] if result.samples_ms else None}
                if n % 200 == 199:
                    write_json(out / "grid.json", doc)
            size["seconds"] += time.perf_counter() - began
            size["complete"] = all(str(i) in rows for i in indices)
            ok = [r["time_ms"] for r in rows.values() if r["status"] == "ok"]
            size.update(timed=len(rows), ok=len(ok), best_ms=min(ok) if ok else None,
                        bench_s=sum(float(r["bench_s"] or 0.0) for r in rows.values()))
            write_json(out / "grid.json", doc)
            if size["complete"] and size["exhaustive"]:
                write_moe_landscape(Path(opts.landscapes or out), module.SPACE, key,
                                    [(points[int(i)], row_result(r)) for i, r in rows.items()])
            print(f"grid {name}: {len(rows)}/{len(indices)} configurations, {size['seconds']:.0f} s, {len(ok)} ok, "
                  f"best {min(ok) if ok else float('nan'):.4g} ms", flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return doc


def row_result(row: dict[str, Any]) -> EvalResult:
    """A grid row as the result a landscape records."""
    return EvalResult(Status(row["status"]), row["time_ms"], row["samples_ms"] or [], message=row["message"],
                      compile_s=row["compile_s"], bench_s=row["bench_s"])


def write_moe_landscape(folder: Path, space: Any, key: dict[str, Any], results: list[tuple[Point, EvalResult]]) -> Path:
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}[
        key.get("dtype", "float16")]
    # the GEMM of the slots routed to each expert: M x top_k rows through N x K weights (fp8: e4m3 scaled per tensor)
    problem = Problem.gemm(key["M"] * 2, key["N"], key["K"], dtype=dtype, layout="tn",
                           scaling="tensor" if dtype == "fp8" else "")
    meta = {"device": torch.cuda.get_device_name() if device() == "cuda" else "cpu (Triton interpreter)",
            "key": key, "complete": True, "feasible": len(results), "flush": GRID_TIMING.flush,
            "command": command()}
    doc = landscape_document(space.params, results, problem, meta, space.name, MAX_SAMPLES)
    folder.mkdir(parents=True, exist_ok=True)
    return write_landscape(folder / f"{space.name}_E{key['E']}_N{key['N']}_K{key['K']}_M{key['M']}_{dtype}.json.gz",
                           doc)


# -- phase 3: the report ------------------------------------------------------------------------------
def report(opts: argparse.Namespace, tuned: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    out = Path(opts.out)
    kernel, module = load_kernel(KERNEL)
    keys_file = load_keys(Path(opts.keys), module)
    candidates = Candidates.from_space(module.SPACE)
    points = grid_points(module.SPACE)[: opts.grid_limit or None]
    timer: Timer = OracleTimer() if device() == "cuda" else WallClockTimer()
    full = len(points)
    rows_out = []
    for key in keys_file.keys:
        name = key_name(key)
        t, g = tuned["keys"].get(name), timed["sizes"].get(name)
        if t is None or g is None:
            continue
        ok = sorted((r["time_ms"], int(i)) for i, r in g["rows"].items() if r["status"] == "ok")
        configs = {"decided": candidates.config(candidates.space.from_storage(t["config"]))}
        for rank, (_, i) in enumerate(ok[:3]):
            configs[f"grid#{rank + 1}"] = candidates.config(points[i])
        grid_, args, kwargs = keys_file.launch(**key)

        def call_of(config: Any, grid_: Any = grid_, args: Any = args, kwargs: Any = kwargs) -> Callable[[], object]:
            options = {**kwargs, **config.all_kwargs()}
            return lambda: kernel.fn[grid_](*args, **options)

        calls = {n: call_of(c) for n, c in configs.items()}
        for call in calls.values():
            call()
        sync()
        conf = timer.confirm(calls)
        medians = {n: conf.items[n].median_ms for n in calls}
        fraction = min(medians.values()) / medians["decided"]
        grid_s = g["bench_s"] if g["exhaustive"] else g["bench_s"] / max(1, g["timed"]) * full
        rows_out.append({"key": name, "M": key["M"], "exhaustive": g["exhaustive"], "fraction": fraction,
                         "medians_ms": medians, "evaluations": t["evaluations"],
                         "search_gpu_s": t["bench_s"] + t["confirm_s"], "search_wall_s": t["wall_s"],
                         "grid_gpu_s": grid_s, "grid_timed": g["timed"]})
        grid_best = min((v for n, v in medians.items() if n != "decided"), default=math.nan)
        print(f"{name:6s} {'all' if g['exhaustive'] else g['timed']:>5} fraction {fraction:.4f} decided "
              f"{medians['decided']:.4g} ms, grid best {grid_best:.4g} ms; "
              f"search {t['bench_s'] + t['confirm_s']:.1f} s timing / grid {grid_s:.0f} s", flush=True)
    search_s = sum(r["search_gpu_s"] for r in rows_out)
    grid_s = sum(r["grid_gpu_s"] for r in rows_out)
    files = write_configs_and_check(opts, out)
    summary = {"keys": len(rows_out), "min_fraction": min((r["fraction"] for r in rows_out), default=None),
               "search_gpu_s": search_s, "grid_gpu_s": grid_s, "gpu_share": search_s / grid_s if grid_s else None,
               "search_wall_s": sum(r["search_wall_s"] for r in rows_out), "vllm_files": files}
    doc = {"command": command(), "device": torch.cuda.get_device_name() if device() == "cuda" else "cpu",
           "date": time.strftime("%Y-%m-%d"), "rows": rows_out, "summary": summary}
    write_json(out / "report.json", doc)
    lowest = summary["min_fraction"]
    print(f"every batch size >= 0.99 of the grid's best: {lowest is not None and lowest >= 0.99} (lowest {lowest}); "
          f"search GPU time {search_s:.0f} s = {100 * (summary['gpu_share'] or 0):.2f}% of the grid's {grid_s:.0f} s; "
          f"wall {summary['search_wall_s']:.0f} s")
    return doc


def write_configs_and_check(opts: argparse.Namespace, out: Path) -> dict[str, int]:
    """``export-configs --format vllm-moe`` on the cache, each file read back the way vLLM reads it."""
    out = out.resolve()  # the command runs from the repository root: a relative --out is the caller's
    folder = out / "vllm"
    subprocess.run([sys.executable, "-m", "evotune", "export-configs", "--cache", str(out / "cache.db"), "--kernel",
                    "moe_gemm_kernel", "--format", "vllm-moe", "--n-divisor", str(opts.n_divisor), "--out",
                    str(folder)], check=True, cwd=ROOT)
    fields = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    counts = {}
    for path in sorted(folder.glob("E=*.json")):
        with open(path) as f:  # vllm/model_executor/layers/fused_moe: get_moe_configs
            configs = {int(k): v for k, v in json.load(f).items() if k != "triton_version"}
        missing = [k for k, v in configs.items() if not fields <= set(v)]
        if missing:
            raise SystemExit(f"{path}: batch size {missing[0]} lacks one of {sorted(fields)}")
        counts[path.name] = len(configs)
    return counts


def command() -> str:
    return "python benchmarks/autotune_moe.py " + " ".join(sys.argv[1:])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", default=str(KEYS), help="the keys file (tune-kernel's format)")
    p.add_argument("--out", required=True)
    p.add_argument("--landscapes", default="", help="where the exhaustive batch sizes' landscapes go (default --out)")
    p.add_argument("--exhaustive", default="16,256,2048", help="batch sizes M timed over the whole grid")
    p.add_argument("--sample", type=int, default=128, help="grid configurations timed for the other batch sizes")
    p.add_argument("--nearest", type=int, default=16, help="... plus this many fastest of the nearest exhaustive M")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=0, help="evaluations a key (default the kernel's own, 48)")
    p.add_argument("--grid-limit", type=int, default=0, help="only the first N grid configurations (CPU tests)")
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 4) - 2), help="compile workers")
    p.add_argument("--n-divisor", type=int, default=2, help="vLLM's file N = the key's N / this")
    p.add_argument("--max-seconds", type=float, default=540.0, help="stop starting keys or batch sizes after this")
    p.add_argument("--phase", choices=("all", "tune", "grid", "report"), default="all")
    opts = p.parse_args(argv)
    try:
        opts.exhaustive = {int(x) for x in opts.exhaustive.split(",") if x}
    except ValueError:
        p.error(f"--exhaustive: expected comma-separated integers, got {opts.exhaustive!r}")
    return opts


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    deadline = time.perf_counter() + opts.max_seconds
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TRITON_CACHE_DIR", str((out / "triton_cache").resolve()))
    tuned = tune(opts, deadline) if opts.phase in ("all", "tune") else read_json(out / "tune.json")
    timed = grid(opts, deadline) if opts.phase in ("all", "grid") else read_json(out / "grid.json")
    n_keys = len(load_keys(Path(opts.keys), load_kernel(KERNEL)[1]).keys)
    complete = [s for s in timed.get("sizes", {}).values() if s.get("complete")]
    finished = len(tuned.get("keys", {})) == n_keys and len(complete) == n_keys
    if opts.phase in ("all", "report") and finished:
        report(opts, tuned, timed)
    elif opts.phase == "report":
        print("report: the tune and grid phases have not finished every key; run them first")


if __name__ == "__main__":
    main()

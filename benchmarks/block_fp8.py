"""Block-scaled fp8 GEMMs of DeepSeek-V3: evotune.autotune on the triton_block_fp8 kernel against vLLM's tuning.

The shapes are those vLLM's block-fp8 tuning script tunes for DeepSeek-V3 (``get_weight_shapes`` of
``benchmarks/kernels/benchmark_w8a8_block_fp8.py``: the (N, K) weights that tensor parallelism leaves whole, those
it splits along N and those it splits along K), at ``--tp`` 8 by default, and its 18 batch sizes. Three phases,
each resumable (run the command again to go on where ``--max-seconds`` stopped it):

1. **tune**: ``evotune.autotune(space=triton_block_fp8.SPACE, key=["M", "N", "K"])`` applied to the kernel of
   ``search_spaces/_triton_block_fp8.py`` (the one tuning loop of ``tune-kernel``: online mode, ``--budget``
   evaluations a key, transfer from the keys tuned before, the top three confirmed side by side), shape by shape
   and batch size by batch size, into the cache ``--out/cache.db``, with one Triton cache (``--out/triton_cache``)
   so that a configuration compiled for one batch size is found built for the next of the same specialization.
   Each pick is checked against the dequantized product and re-timed side by side with vLLM's default
   configuration (what vLLM launches without a tuned file). Then ``export-configs --format vllm-block-fp8`` writes
   the vLLM files and ``export-configs --check`` reads them back.
2. **grid**: for ``--grid-shapes`` x ``--grid-batches`` (2 x 3 by default), vLLM's whole grid (the 1,280
   configurations of ``get_configs_compute_bound``, constraints not applied) is compiled by the same compile pool
   (``compile_ahead``: Triton's asynchronous compiles, every core) into the same Triton cache, and each
   configuration checked against the dequantized product and timed by the same oracle (CUDA graph, clean L2
   flush) with fewer samples (10 to 50, CI of the median within 2%): the grid's GPU time is, if anything,
   understated.
3. **report**: the geometric mean over every tuned key of vLLM default / pick (target 1.3x); for each grid key,
   the pick re-timed beside the grid's three fastest (pick / grid best as the grid's fastest median over the
   pick's), the search's GPU time (its trials' timing seconds and its confirmation) over the grid's (target 5%),
   and its wall time (compiles included) over the grid's (target 15%).

::

    python benchmarks/block_fp8.py --out runs/block_fp8 --max-seconds 540                     # all, in steps
    python benchmarks/block_fp8.py --out runs/block_fp8 --shapes 7168x2304,4608x7168 --batches 16,256,2048

Everything lands under ``--out``: ``cache.db``, ``tune.json``, ``grid.json``, ``report.json``, ``vllm/``. On the
CPU (``TRITON_INTERPRET=1``) ``--shapes``, ``--batches`` and ``--grid-limit`` should name tiny work; the timer is
then the wall clock.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.triton_device import device, interpreted, sync  # noqa: E402

SCALE_GROUP = 128  # the 1x128 activation groups and 128x128 weight blocks
E4M3_MAX = 448.0
SCALE_FACTOR = 1e-2  # vLLM's tuning script draws its scales uniformly from [0, 1e-2)
TOLERANCE = 1e-2  # relative Frobenius-norm error against the dequantized product
# DeepSeek-V3's block-fp8 weights (N, K), as vLLM's tuning script lists them: left whole by tensor parallelism
# (kv_a_proj_with_mqa 512 + 64, q_b_proj and kv_b_proj unsplit, ...), split along N, split along K
WHOLE = ((576, 7168), (24576, 7168), (32768, 512), (7168, 16384), (7168, 18432))
SPLIT_N = ((36864, 7168), (24576, 7168), (32768, 512), (24576, 1536), (12288, 7168), (4096, 7168))
SPLIT_K = ((7168, 18432), (7168, 16384), (7168, 2048))
BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
GRID_SHAPES = ((7168, 2304), (4608, 7168))  # at TP 8: o_proj-like (K split) and gate-up (N split)
GRID_BATCHES = (16, 256, 2048)
KEY = ["M", "N", "K"]


class InputError(ValueError):
    """A bad option; ``str()`` is the one line printed, exit code 2."""


def weight_shapes(tp: int) -> list[tuple[int, int]]:
    """DeepSeek-V3's (N, K) at tensor parallelism ``tp``, in vLLM's order."""
    return [*WHOLE, *((n // tp, k) for n, k in SPLIT_N), *((n, k // tp) for n, k in SPLIT_K)]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def key_name(m: int, n: int, k: int) -> str:
    return f"N{n}_K{k}_M{m}"


# -- one key's launch ---------------------------------------------------------------------------------
@dataclass
class Launch:
    """A key's inputs as vLLM's tuning script makes them (uniform e4m3 over the whole range, uniform scales; N
    need not be a multiple of 128: the last weight block row is partial), its dequantized fp32 product, and the
    kernel's arguments."""

    m: int
    n: int
    k: int
    args: tuple[Any, ...]
    ref: Any

    @classmethod
    def make(cls, m: int, n: int, k: int, seed: int = 0) -> Launch:
        import torch

        dev = device()
        gen = torch.Generator(device=dev).manual_seed(seed)
        groups, blocks = -(-k // SCALE_GROUP), -(-n // SCALE_GROUP)

        def uniform(*shape: int) -> Any:
            return torch.rand(shape, generator=gen, device=dev, dtype=torch.float32)

        a = ((uniform(m, k) - 0.5) * 2 * E4M3_MAX).to(torch.float8_e4m3fn)
        w = ((uniform(n, k) - 0.5) * 2 * E4M3_MAX).to(torch.float8_e4m3fn)
        sa, sw = uniform(m, groups) * SCALE_FACTOR, uniform(blocks, groups) * SCALE_FACTOR
        c = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
        a_deq = a.float() * sa.repeat_interleave(SCALE_GROUP, 1)[:, :k]
        w_deq = w.float() * sw.repeat_interleave(SCALE_GROUP, 0)[:n].repeat_interleave(SCALE_GROUP, 1)[:, :k]
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            ref = a_deq @ w_deq.T
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        del a_deq, w_deq
        args = (a, w, sa, sw, c, m, n, k, a.stride(0), w.stride(0), sa.stride(0), sa.stride(1), sw.stride(0),
                sw.stride(1), c.stride(0))
        return cls(m, n, k, args, ref)

    @property
    def out(self) -> Any:
        return self.args[4]

    def grid(self, meta: dict[str, Any]) -> tuple[int]:
        return (-(-self.m // meta["BLOCK_SIZE_M"]) * -(-self.n // meta["BLOCK_SIZE_N"]),)

    def error(self) -> float:
        import torch

        out = self.out.float()
        if not bool(torch.isfinite(out).all()):
            return math.inf
        return float(torch.linalg.vector_norm(out - self.ref) / torch.linalg.vector_norm(self.ref).clamp_min(1e-30))

    def call(self, fn: Any, config: dict[str, Any]) -> Callable[[], object]:
        """``fn`` (the plain kernel) launched with ``config`` (the six fields)."""
        return lambda: fn[self.grid](*self.args, SCALE_GROUP=SCALE_GROUP, **config)


def kernel_module() -> Any:
    from search_spaces import _triton_block_fp8

    return _triton_block_fp8


def tuned_kernel(cache: str, budget: int) -> Any:
    import evotune
    from search_spaces.triton_block_fp8 import SPACE

    return evotune.autotune(space=SPACE, key=KEY, budget=budget, cache=cache)(kernel_module()._block_scaled_gemm)


def timer_of(grid: bool = False) -> Any:
    from evotune.measurement.options import TimingOptions
    from evotune.triton_tuning.timers import OracleTimer, WallClockTimer

    if device() != "cuda":
        return WallClockTimer()
    if grid:  # fewer samples than the search's (a 2% CI), at most 2 s a configuration
        return OracleTimer(rep_ms=2000.0, timing=TimingOptions(min_samples=10, max_samples=50, ci_target=0.02))
    return OracleTimer()


# -- phase 1: tune ------------------------------------------------------------------------------------
def tune(opts: argparse.Namespace, deadline: float) -> dict[str, Any]:
    from search_spaces.triton_block_fp8 import VLLM_DEFAULT

    out = Path(opts.out)
    doc = read_json(out / "tune.json") or {"command": command(), "budget": opts.budget, "keys": {}}
    kernel = tuned_kernel(f"sqlite:///{(out / 'cache.db').resolve()}", opts.budget)
    plain = kernel_module()._block_scaled_gemm
    timer = timer_of()
    for n, k in opts.shapes:
        for m in opts.batches:
            name = key_name(m, n, k)
            if name in doc["keys"]:
                continue
            if time.perf_counter() > deadline:
                print(f"tune: --max-seconds reached before {name}", flush=True)
                return doc
            launch = Launch.make(m, n, k)
            started = time.perf_counter()
            kernel[launch.grid](*launch.args, SCALE_GROUP=SCALE_GROUP)
            sync()
            wall = time.perf_counter() - started
            fields = kernel.key_fields(dict(zip(kernel.arg_names, launch.args, strict=False)), {})
            store = kernel.decision_store.existing(fields, kernel.candidates.space)
            trials = store.history() if store is not None else []
            decision = kernel.last_decision
            config = kernel.candidates.describe(kernel.candidates.space.from_storage(decision.config))
            # the pick checked, then re-timed beside vLLM's default configuration
            launch.out.fill_(math.nan)
            launch.call(plain, config)()
            sync()
            error = launch.error()
            calls = {"pick": launch.call(plain, config), "vllm default": launch.call(plain, VLLM_DEFAULT)}
            for call in calls.values():
                call()
            sync()
            conf = timer.confirm(calls)
            medians = {c: conf.items[c].median_ms for c in calls}
            doc["keys"][name] = {
                "m": m, "n": n, "k": k, "config": config, "decided_ms": decision.time_ms, "how": decision.how,
                "evaluations": len(trials), "wall_s": wall,
                "bench_s": sum(float(t.attrs.get("bench_s") or 0.0) for t in trials),
                "compile_s": sum(float(t.attrs.get("compile_s") or 0.0) for t in trials),
                "confirm_s": float((decision.confirmation or {}).get("seconds", 0.0)),
                "error": error, "pick_ms": medians["pick"], "vllm_default_ms": medians["vllm default"],
                "speedup": medians["vllm default"] / medians["pick"]}
            write_json(out / "tune.json", doc)
            row = doc["keys"][name]
            print(f"tune {name}: {row['evaluations']} evaluations, {wall:.1f} s ({row['bench_s']:.1f} s timing), "
                  f"error {error:.2g}, pick {medians['pick']:.4g} ms, vLLM default {medians['vllm default']:.4g} ms "
                  f"({row['speedup']:.3f}x), {config}", flush=True)
    return doc


# -- phase 2: vLLM's grid -----------------------------------------------------------------------------
def grid_configs() -> list[dict[str, Any]]:
    """vLLM's grid: every combination of the space's choices (1,280), its constraints not applied."""
    from search_spaces.triton_block_fp8 import SPACE

    names = [p.name for p in SPACE.params]
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(p.choices for p in SPACE.params))]


def triton_config(config: dict[str, Any]) -> Any:
    import triton

    meta = {f: v for f, v in config.items() if f not in ("num_warps", "num_stages")}
    return triton.Config(meta, num_warps=config["num_warps"], num_stages=config["num_stages"])


def time_config(plain: Any, launch: Launch, config: dict[str, Any], timer: Any) -> dict[str, Any]:
    from evotune.triton_tuning.resources import over_limits

    started = time.perf_counter()
    row: dict[str, Any] = {"status": "ok", "time_ms": None, "message": ""}
    try:
        reason = None if interpreted() else over_limits(plain, launch.args, {"grid": launch.grid,
                                                                             "SCALE_GROUP": SCALE_GROUP},
                                                        triton_config(config))
        if reason is not None:
            row.update(status="compile_error", message=f"over the device's limits: {reason}")
        else:
            launch.out.fill_(math.nan)
            launch.call(plain, config)()
            sync()
            err = launch.error()
            if not err <= TOLERANCE:
                row.update(status="wrong_result", message=f"relative error {err:.3g} exceeds {TOLERANCE:g}")
            else:
                row["time_ms"] = timer.measure(launch.call(plain, config))[0]
    except Exception as exc:  # a configuration that fails to compile or launch fails alone
        row.update(status="error", message=f"{type(exc).__name__}: {exc}".splitlines()[0])
    row["bench_s"] = time.perf_counter() - started
    return row


def grid(opts: argparse.Namespace, deadline: float) -> dict[str, Any]:
    from evotune.triton_tuning.compile_ahead import compile_ahead

    out = Path(opts.out)
    doc = read_json(out / "grid.json") or {"command": command(), "keys": {}}
    plain = kernel_module()._block_scaled_gemm
    configs = grid_configs()[: opts.grid_limit or None]
    timer = timer_of(grid=True)
    for (n, k), m in itertools.product(opts.grid_shapes, opts.grid_batches):
        name = key_name(m, n, k)
        entry = doc["keys"].setdefault(name, {"m": m, "n": n, "k": k, "rows": {}, "compile_s": 0.0,
                                              "time_s": 0.0, "complete": False})
        if entry["complete"]:
            continue
        if time.perf_counter() > deadline:
            print(f"grid: --max-seconds reached before {name}", flush=True)
            break
        launch = Launch.make(m, n, k)
        rows = entry["rows"]
        left = [i for i in range(len(configs)) if str(i) not in rows]
        chunk = max(1, opts.compile_chunk)
        for start in range(0, len(left), chunk):
            if time.perf_counter() > deadline:
                break
            batch = left[start:start + chunk]
            began = time.perf_counter()
            compile_ahead(plain, launch.args, {"grid": launch.grid, "SCALE_GROUP": SCALE_GROUP},
                          [triton_config(configs[i]) for i in batch])
            entry["compile_s"] += time.perf_counter() - began
            began = time.perf_counter()
            for i in batch:
                rows[str(i)] = time_config(plain, launch, configs[i], timer)
            entry["time_s"] += time.perf_counter() - began
            write_json(out / "grid.json", doc)
        entry["complete"] = len(rows) == len(configs)
        ok = sorted((r["time_ms"], int(i)) for i, r in rows.items() if r["status"] == "ok")
        entry.update(timed=len(rows), ok=len(ok), best_ms=ok[0][0] if ok else None,
                     bench_s=sum(float(r["bench_s"]) for r in rows.values()))
        write_json(out / "grid.json", doc)
        print(f"grid {name}: {len(rows)}/{len(configs)} configurations, {entry['compile_s']:.0f} s compiling, "
              f"{entry['time_s']:.0f} s timing, {len(ok)} ok, best {ok[0][0] if ok else math.nan:.4g} ms", flush=True)
    return doc


# -- phase 3: the report ------------------------------------------------------------------------------
def geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def report(opts: argparse.Namespace, tuned: dict[str, Any], timed: dict[str, Any]) -> dict[str, Any]:
    out = Path(opts.out)
    plain = kernel_module()._block_scaled_gemm
    configs = grid_configs()[: opts.grid_limit or None]
    timer = timer_of()
    keys = [r for r in tuned.get("keys", {}).values()]
    speedups = [r["speedup"] for r in keys]
    wrong = [key_name(r["m"], r["n"], r["k"]) for r in keys if not r["error"] <= TOLERANCE]
    rows = []
    for name, g in timed.get("keys", {}).items():
        t = tuned.get("keys", {}).get(name)
        if t is None or not g.get("complete"):
            continue
        ok = sorted((r["time_ms"], int(i)) for i, r in g["rows"].items() if r["status"] == "ok")
        launch = Launch.make(g["m"], g["n"], g["k"])
        calls = {"pick": launch.call(plain, t["config"])}
        calls.update({f"grid#{rank + 1}": launch.call(plain, configs[i]) for rank, (_, i) in enumerate(ok[:3])})
        for call in calls.values():
            call()
        sync()
        conf = timer.confirm(calls)
        medians = {c: conf.items[c].median_ms for c in calls}
        grid_best = min((v for c, v in medians.items() if c != "pick"), default=math.nan)
        search_gpu = t["bench_s"] + t["confirm_s"]
        grid_wall = g["compile_s"] + g["time_s"]
        rows.append({"key": name, "fraction": grid_best / medians["pick"], "medians_ms": medians,
                     "search_gpu_s": search_gpu, "grid_gpu_s": g["bench_s"], "search_wall_s": t["wall_s"],
                     "grid_wall_s": grid_wall, "evaluations": t["evaluations"], "grid_ok": len(ok)})
        print(f"{name}: pick / grid best {grid_best / medians['pick']:.4f} ({medians['pick']:.4g} ms vs "
              f"{grid_best:.4g} ms); GPU {search_gpu:.1f} s / {g['bench_s']:.0f} s; wall {t['wall_s']:.1f} s / "
              f"{grid_wall:.0f} s", flush=True)
    files = export(out)
    search_gpu = sum(r["search_gpu_s"] for r in rows)
    search_wall = sum(r["search_wall_s"] for r in rows)
    grid_gpu, grid_wall = sum(r["grid_gpu_s"] for r in rows), sum(r["grid_wall_s"] for r in rows)
    summary = {
        "keys": len(keys), "geomean_speedup_vs_vllm_default": geomean(speedups),
        "min_speedup_vs_vllm_default": min(speedups, default=None), "wrong_picks": wrong,
        "grid_keys": len(rows), "min_fraction_of_grid_best": min((r["fraction"] for r in rows), default=None),
        "gpu_fraction": search_gpu / grid_gpu if grid_gpu else None,
        "wall_fraction": search_wall / grid_wall if grid_wall else None, "vllm_files": files}
    doc = {"command": command(), "device": device_name(), "date": time.strftime("%Y-%m-%d"), "rows": rows,
           "summary": summary}
    write_json(out / "report.json", doc)
    gm_ = summary["geomean_speedup_vs_vllm_default"]
    print(f"{len(keys)} keys: vLLM default / pick geometric mean {gm_ or math.nan:.3f}x (target 1.3x), min "
          f"{summary['min_speedup_vs_vllm_default'] or math.nan:.3f}x; {len(wrong)} picks off the reference")
    if rows:
        print(f"grid: lowest pick / grid best {summary['min_fraction_of_grid_best']:.4f}; search GPU time "
              f"{100 * (summary['gpu_fraction'] or 0):.2f}% of the grid's (target 5%), wall "
              f"{100 * (summary['wall_fraction'] or 0):.2f}% (target 15%)")
    print(f"vLLM files: {len(files)} in {out / 'vllm'}, checked")
    return doc


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if device() == "cuda" else "cpu"


def export(out: Path) -> dict[str, int]:
    """``export-configs --format vllm-block-fp8`` on the cache, then ``export-configs --check`` on what it wrote;
    each file's batch sizes."""
    folder = out / "vllm"
    for args in (["--cache", str(out / "cache.db"), "--kernel", "_block_scaled_gemm", "--format", "vllm-block-fp8",
                  "--out", str(folder)], ["--check", str(folder)]):
        done = subprocess.run([sys.executable, "-m", "evotune", "export-configs", *args], cwd=ROOT,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"export-configs {' '.join(args)}: {done.stderr.strip()}")
    return {p.name: len(json.loads(p.read_text())) for p in sorted(folder.glob("N=*.json"))}


def command() -> str:
    return "python benchmarks/block_fp8.py " + " ".join(sys.argv[1:])


# -- options ------------------------------------------------------------------------------------------
def parse_shapes(text: str, tp: int, option: str) -> list[tuple[int, int]]:
    """``all`` (DeepSeek-V3's at ``tp``) or ``NxK,NxK``."""
    if text == "all":
        return weight_shapes(tp)
    out = []
    for item in text.split(","):
        n, sep, k = item.strip().partition("x")
        if not sep or not n.isdigit() or not k.isdigit() or int(n) < 1 or int(k) < 1 or int(k) % SCALE_GROUP:
            raise InputError(f"{option}: expected NxK pairs with K a multiple of {SCALE_GROUP} (e.g. 7168x2304), "
                             f"got {item.strip()!r}")
        out.append((int(n), int(k)))
    return out


def parse_batches(text: str, option: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise InputError(f"{option}: expected positive batch sizes, comma-separated, got {text!r}")
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the folder of the run (resumed when it exists)")
    p.add_argument("--tp", type=int, default=8, help="tensor parallelism of the shapes (default 8)")
    p.add_argument("--shapes", default="all", help="NxK,NxK to tune (default all: DeepSeek-V3's at --tp)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="batch sizes M to tune (vLLM's 18)")
    p.add_argument("--budget", type=int, default=32, help="evaluations a key (evotune.autotune's budget)")
    p.add_argument("--grid-shapes", default=",".join(f"{n}x{k}" for n, k in GRID_SHAPES),
                   help="NxK,NxK timed over vLLM's whole grid")
    p.add_argument("--grid-batches", default=",".join(map(str, GRID_BATCHES)), help="... at these batch sizes")
    p.add_argument("--grid-limit", type=int, default=0, help="only the first N grid configurations (CPU tests)")
    p.add_argument("--compile-chunk", type=int, default=128, help="grid configurations compiled together")
    p.add_argument("--max-seconds", type=float, default=540.0, help="stop starting keys or chunks after this")
    p.add_argument("--phase", choices=("all", "tune", "grid", "report"), default="all")
    opts = p.parse_args(argv)
    if opts.tp < 1 or opts.budget < 1 or opts.max_seconds <= 0 or opts.grid_limit < 0:
        raise InputError("--tp, --budget and --max-seconds must be positive, --grid-limit at least 0")
    opts.shapes = parse_shapes(opts.shapes, opts.tp, "--shapes")
    opts.grid_shapes = parse_shapes(opts.grid_shapes, opts.tp, "--grid-shapes")
    opts.batches = parse_batches(opts.batches, "--batches")
    opts.grid_batches = parse_batches(opts.grid_batches, "--grid-batches")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts = parse_args(argv)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    deadline = time.perf_counter() + opts.max_seconds
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out: {out} is a file, not a folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    # one Triton cache for the search and the grid: a configuration compiled once serves both
    os.environ.setdefault("TRITON_CACHE_DIR", str((out / "triton_cache").resolve()))
    tuned = tune(opts, deadline) if opts.phase in ("all", "tune") else read_json(out / "tune.json")
    timed = grid(opts, deadline) if opts.phase in ("all", "grid") else read_json(out / "grid.json")
    wanted = len(opts.shapes) * len(opts.batches)
    if opts.phase in ("all", "report"):
        done = len(tuned.get("keys", {}))
        if done < wanted:
            print(f"report: {done} of {wanted} keys tuned; run again to go on")
        if done:
            report(opts, tuned, timed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``tune-model`` on a GPU host: its fused-MoE picks against vLLM's grid, its scaling over GPUs, and a decode step.

Three subcommands, one measurement each; each writes ``OUT/<name>.json``, prints a short table, and takes a time
cap and options that make its job smaller, so that each fits in minutes:

``grid``: the plan's fused-MoE keys (Mixtral-8x7B at tp 2: E = 8, N = 14336, K = 4096, vLLM's 18 batch sizes) at
  ``--dtype`` (bf16; or fp8: e4m3 activations and weights with per-tensor scales, the activations' one and each
  expert's, as vLLM's ``fp8_w8a8`` fused MoE runs them, the output bf16; each of the three steps on those keys)
  1. timed the grid's way (``benchmarks/autotune_moe.py --phase grid``: vLLM's ``benchmark_moe.py`` grid of 1,920
     configurations, each compiled once per Triton specialisation of M in a compile pool of ``--jobs`` processes
     a GPU, checked, then timed by evotune's oracle): every configuration for the ``--exhaustive`` batch sizes
     (one process a GPU, side by side), and for the others a seeded sample (``--sample``, ``--seed``) plus the
     ``--nearest`` fastest of the nearest exhaustive size, spread over the GPUs; one Triton cache for the grid's
     processes (``OUT/grid/triton_cache``, cold). Each configuration is checked before it is timed against the
     float32 product (fp8: of the dequantized inputs, within evotune's scaled-fp8 tolerance, 1e-2); a wrong one is
     not timed. Measured: its wall clock, its GPU time (the configurations' timing), its compiles and their
     seconds; estimated from those per-configuration costs: the whole grid's GPU time, compile time and wall clock
     on these GPUs (every configuration at every batch size);
  2. ``python -m evotune tune-model MODEL --kernels fused_moe --dtype DTYPE`` on the same GPUs (``--gpus``), cold
     (its own Triton cache, ``OUT/tune/triton_cache``), the same compile pool per worker: its wall clock (summed
     over the calls that resumed it), evaluations, GPU time and compiles per key; its vLLM file
     (``OUT/tune/vllm/E=8,N=7168,device_name=NVIDIA_H200[,dtype=fp8_w8a8].json``: N is the intermediate size per
     shard) read back as vLLM reads it (a run cut by the cap has its file written from its record first);
  3. per batch size, tune-model's pick as vLLM launches it from that file and the grid's three fastest re-timed side
     by side on one GPU (the confirmation's interleaved rounds, evotune's oracle; one of the grid's that is the pick
     itself is timed once, as the pick, and named in ``same_as_tuned``); ``fraction``: the fastest's median over the
     pick's (1: the pick is the fastest).
  Caps: ``--grid-seconds`` (each of the grid's two phases, 140 s), ``--tune-seconds`` (150 s; tune-model is
  interrupted then: its decided keys are kept and compared), ``--retime-seconds`` (75 s, ``--retime-each`` 3 s a
  batch size): the defaults fit one 10-minute call with the start-ups. The same command again goes on where the caps
  stopped it (the grid's finished sizes and tune-model's decided keys are kept; the re-timing is redone); an
  ``OUT`` of another dtype is refused. Smaller: ``--batch-sizes``, ``--exhaustive``, ``--sample``. ``grid.json``
  (with its ``dtype``).

``scaling``: the same tune-model job on each GPU count of ``--gpus`` (1,2,4), each in a fresh folder ``OUT/gpusG``
  (cold: its own storage, autotune cache and Triton cache): per count the wall clock of the whole command, keys,
  evaluations, GPU-seconds, the points timed twice (trials of one configuration in one key's study: 0 expected),
  the speed-up over the first count; and the cost model's prediction of the largest count's wall clock from the
  first two (:class:`evotune.running.cost_model.CostModel`: the start-up, and the per-evaluation cost of the two
  runs pooled; no contention: each worker has its GPU and its share of the host's cores for its builds, and one
  run of two cannot tell contention from one run's spread). Caps: ``--max-seconds`` per run (interrupted; what it
  decided is counted). Smaller: ``--batch-sizes``, ``--kernels``. ``scaling.json``.

``decode-step``: one decoder layer's GEMMs back to back in one CUDA graph at each batch of ``--ms`` (1,16,64),
  tuned against untuned (``benchmarks/layer_step.py``): the dense linear layers (QKV, O, and a dense MLP's gate-up
  and down per shard) with the decode family's decision from the run's ``tuned.json`` (``--run``; the GEMM kernel's
  above M = 64) against cuBLAS (``torch.matmul``); for a MoE model also the experts' gate-up and down GEMMs through
  the package's fused-MoE kernel with the configuration of the run's vLLM file (``OUT/vllm``) for the batch size
  nearest M, as vLLM picks it, against vLLM's default configuration; the routing drawn once outside the graphs.
  A GEMM without a decision runs untuned in both graphs, and the output says so (``source``). Each tuned launch is
  checked first. Every sample is one replay of the whole layer after the oracle's clean L2 flush (so no replay finds
  the previous one's weights in L2, for a dense model too), tuned and untuned in alternated rounds (``--rounds``,
  ``--replays`` samples each); each GEMM alone is timed the same way: per batch the step's tuned and untuned ms,
  their ratio, and the per-GEMM breakdown. Against the memory, per batch, per GEMM and for the step: ``MB``, the
  bytes it must move (input, output, and the weights it touches: a fused MoE's only those of the experts the
  routing drawn hits, ``experts_hit``); ``read ms``, the fastest plain read of those bytes
  (``benchmarks/read_ceiling.py``'s ``torch.sum`` and Triton reads) timed the same way (the oracle, the clean flush,
  the rounds); ``tuned % of read`` (100: as fast as only reading the bytes); ``untuned / read``, the most any
  tuning can gain on the untuned kernel, the bound of ``untuned / tuned``. Cap: ``--max-seconds`` (no new batch
  after it). ``decode_step.json`` (per record also ``bytes``, ``read_ms``, ``read``: both reads' times and the
  Triton read's configuration, ``tuned_pct_of_read``, ``untuned_over_read``).

``startup``: each worker's seconds from its start to its first evaluation, as the run records them (a worker is
  forked from the run's server, which imported torch, Triton and the tuner once): tune-model on every GPU of
  ``--gpus`` at once, one key a worker (the first of the plan's batch sizes, or ``--batch-sizes``), twice: cold
  (a fresh Triton cache, ``OUT/triton_cache``) and warm (the same cache again, a fresh run folder: the host's
  files and the compiled kernels cached). Per pass and worker: ``startup_s`` (from its fork) and ``from_command_s``
  (from the command's launch: the server's imports included). ``startup.json``.

Run on the GPU host, in this order (the scaling and decode-step runs need no grid)::

    python benchmarks/tune_model.py grid --model Mixtral-8x7B --tp 2 --out runs/tm_grid
    python benchmarks/tune_model.py grid --model Mixtral-8x7B --tp 2 --dtype fp8 --out runs/tm_grid_fp8
    python benchmarks/tune_model.py scaling --model Mixtral-8x7B --tp 2 --kernels fused_moe \\
        --batch-sizes 1,16,64,256,1024,4096 --out runs/tm_scaling
    python benchmarks/tune_model.py decode-step --model Llama-3-8B --tp 1 --ms 1,16,64 --run RUN --out runs/tm_decode

where RUN is the ``--out`` of ``python -m evotune tune-model Llama-3-8B --kernels triton_decode_gemm
--batch-sizes 1,16,64 --out RUN``. On the CPU (``TRITON_INTERPRET=1``) ``--tuner`` names a stand-in and
``--grid-limit`` cuts the grid (the tests).
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.model.models import ModelError, load_model  # noqa: E402
from evotune.model.outcome import WorkerStart  # noqa: E402
from evotune.model.plan import Family, Key, Plan, make_plan, only, parse_batch_sizes  # noqa: E402
from evotune.model.preload import DEFAULT_TUNER  # noqa: E402
from evotune.model.runner import Ledger, visible_gpus  # noqa: E402
from evotune.triton_tuning.builds import not_specialised_on, specialisation  # noqa: E402

#: the grid comparison's dtypes: tune-model's ``--dtype`` -> the keys' torch dtype (fp8: e4m3 activations and
#: weights scaled per tensor, vLLM's ``fp8_w8a8`` fused MoE, the output bf16)
TORCH_DTYPES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}
MOE_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
GRID_CONFIGS = 1920  # vLLM's grid: 5 x 4 x 3 x 4 x 2 x 4
GRID_GRACE_S = 120.0  # a grid process still running this long past its --max-seconds is stopped


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def torch_dtype(plan: Plan) -> str:
    """The keys' inputs: the plan's dtype; bf16 as float32 under the interpreter (numpy has no bfloat16; the
    interpreter does run the e4m3 product, so fp8 stays fp8 there)."""
    return "float32" if interpreted() and plan.dtype == "bf16" else TORCH_DTYPES[plan.dtype]


def dtype_label(plan: Plan) -> str:
    """The plan's dtype as the grid comparison's output says it."""
    if plan.dtype == "fp8":
        return "fp8 (e4m3 activations and weights, per-tensor scales: vLLM's fp8_w8a8)"
    return plan.dtype if torch_dtype(plan) == TORCH_DTYPES[plan.dtype] else f"{plan.dtype} (float32 interpreted)"


def moe_plan(model: str, tp: int, batch_sizes: str, dtype: str = "bf16") -> Plan:
    """The model's fused-MoE keys at ``dtype``; :class:`ModelError` for an fp8 checkpoint quantized in blocks (its
    fused MoE is tuned with block scales, which the grid's run does not launch)."""
    loaded = load_model(model)
    if dtype == "fp8" and loaded.fp8_block is not None:
        raise ModelError(f"{loaded.source}: weight_block_size: {list(loaded.fp8_block)}; the grid comparison's fp8 "
                         "is scaled per tensor (vLLM's fp8_w8a8 without block_shape)")
    return only(make_plan(loaded, tp, dtype, parse_batch_sizes(batch_sizes)), frozenset({Family.FUSED_MOE}))


def moe_keys_toml(plan: Plan, ms: set[int] | None = None) -> str:
    """The plan's fused-MoE keys (those at ``ms``, when given) in tune-kernel's keys format (the kernel's
    ``make_args``)."""
    lines = ['launch = "make_args"', ""]
    for kernel in plan.kernels:
        if kernel.shape.family is not Family.FUSED_MOE:
            continue
        for key in kernel.keys:
            if ms is not None and key.m not in ms:
                continue
            lines += ["[[key]]", f"M = {key.m}", f"N = {key.shape.n}", f"K = {key.shape.k}",
                      f"E = {key.shape.experts}", f"top_k = {key.shape.top_k}",
                      f'dtype = "{torch_dtype(plan)}"', ""]
    return "\n".join(lines)


def dense_layers(plan: Plan, m: int) -> list[tuple[str, int, int]]:
    """(layers, N, K) of the plan's dense GEMMs at batch ``m``, in the plan's order (one decoder layer's)."""
    return [(", ".join(k.layers), k.shape.n, k.shape.k) for k in plan.kernels
            if k.shape.family in (Family.DECODE, Family.GEMM) and any(key.m == m for key in k.keys)]


def run_capped(cmd: list[str], env: dict[str, str], seconds: float | None) -> tuple[float, bool]:
    """Run ``cmd``; past ``seconds``, interrupt it (SIGINT to its process group, as Ctrl-C: tune-model keeps what
    it decided) and wait. (wall seconds, whether it was interrupted)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
    try:
        proc.wait(timeout=seconds)
        cut = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        cut = True
    wall = time.perf_counter() - started
    if not cut and proc.returncode != 0:  # what it decided is in its record all the same: counted
        print(f"{' '.join(cmd[1:4])}...: exit code {proc.returncode}; its decided keys are counted", file=sys.stderr,
              flush=True)
    return wall, cut


def tune_model_cmd(model: str, tp: int, batch_sizes: str, gpus: int, out: Path, tuner: str,
                   kernels: str, dtype: str | None = None, workers_per_gpu: int = 1) -> list[str]:
    return [sys.executable, "-m", "evotune", "tune-model", model, "--tp", str(tp), "--gpus", str(gpus),
            "--batch-sizes", batch_sizes, "--kernels", kernels, "--out", str(out), "--no-progress",
            "--tuner", tuner, *(["--dtype", dtype] if dtype else []),
            *(["--workers-per-gpu", str(workers_per_gpu)] if workers_per_gpu > 1 else [])]


def outcomes_of(run: Path, plan: Plan) -> dict[str, Any]:
    """The run's decided keys (from its record: there even when the run was interrupted)."""
    db = run / "tune_model.db"
    return Ledger(f"sqlite:///{db.resolve()}", plan.ident).outcomes() if db.is_file() else {}


def points_timed_twice(run: Path) -> int | None:
    """Trials of a configuration already measured in the same study (key), over every study of the run's
    autotune cache; None when the run kept none there (a stand-in tuner)."""
    db = run / "autotune.db"
    if not db.is_file():
        return None
    import optuna

    storage = optuna.storages.RDBStorage(f"sqlite:///{db.resolve()}")
    twice = 0
    for summary in optuna.study.get_all_study_summaries(storage):
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
        keys = [json.dumps(t.params, sort_keys=True) for t in trials if t.state.is_finished()]
        twice += len(keys) - len(set(keys))
    return twice


def table(rows: list[list[Any]], head: list[str]) -> str:
    cells = [head] + [["-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in r]
                      for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells)


# -- grid ------------------------------------------------------------------------------------------------------
def _grid_processes(out: Path, plan: Plan, groups: list[set[int]], opts: argparse.Namespace, seed_doc: dict[str, Any],
                    env: dict[str, str], seconds: float) -> list[dict[str, Any]]:
    """One ``autotune_moe.py --phase grid`` process a GPU, on its group of batch sizes (its grid.json first holding
    ``seed_doc``'s sizes, so that its sampled sizes add the nearest exhaustive size's fastest); their grid.json."""
    procs = []
    gpu_ids = opts.gpu_ids
    for i, ms in enumerate(groups):
        folder = out / f"gpu{i}"
        folder.mkdir(parents=True, exist_ok=True)
        keys = folder / "keys.toml"
        keys.write_text(moe_keys_toml(plan, ms | set(seed_doc.get("exhaustive_ms", []))))
        if seed_doc.get("sizes"):
            mine = json.loads((folder / "grid.json").read_text()) if (folder / "grid.json").is_file() else {}
            sizes = {**seed_doc["sizes"], **mine.get("sizes", {})}
            (folder / "grid.json").write_text(json.dumps({**mine, "sizes": sizes, "command": "tune_model.py grid",
                                                          "timing": seed_doc.get("timing", {})}))
        cmd = [sys.executable, str(ROOT / "benchmarks" / "autotune_moe.py"), "--phase", "grid", "--keys", str(keys),
               "--out", str(folder), "--exhaustive", ",".join(map(str, sorted(opts.exhaustive))), "--sample",
               str(opts.sample), "--nearest", str(opts.nearest), "--seed", str(opts.seed), "--jobs", str(opts.jobs),
               "--max-seconds", str(seconds), *(["--grid-limit", str(opts.grid_limit)] if opts.grid_limit else [])]
        penv = {**env, **({"CUDA_VISIBLE_DEVICES": gpu_ids[i % len(gpu_ids)]} if gpu_ids else {})}
        procs.append(subprocess.Popen(cmd, env=penv, cwd=ROOT, start_new_session=True))
    # each stops starting configurations at its --max-seconds; one still running well past it is stopped (its
    # compile pool too), and what it wrote is counted
    deadline = time.monotonic() + seconds + GRID_GRACE_S
    docs = []
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.returncode != 0:
            print(f"grid: process {i} (GPU {i}) ended with exit code {proc.returncode}; its sizes are counted as far "
                  "as it wrote them", file=sys.stderr, flush=True)
        path = out / f"gpu{i}" / "grid.json"
        docs.append(json.loads(path.read_text()) if path.is_file() else {})
    return docs


class GridKind(enum.StrEnum):
    """How the grid timed a batch size."""

    WHOLE = "whole"  # every configuration (an exhaustive size)
    SAMPLED = "sampled"  # a seeded sample and the nearest exhaustive size's fastest
    CUT = "cut"  # an exhaustive size cut by --grid-seconds: the grid's first configurations in its order


def grid_kind(size: dict[str, Any]) -> GridKind:
    """How the grid timed ``size`` (one batch size's entry of a grid.json)."""
    if not size.get("exhaustive"):
        return GridKind.SAMPLED
    return GridKind.WHOLE if size.get("complete") else GridKind.CUT


def _merge_sizes(docs: list[dict[str, Any]], skip: dict[str, Any]) -> dict[str, Any]:
    """The batch sizes the processes timed (each in one process's grid.json), less those of ``skip``."""
    return {name: size for doc in docs for name, size in doc.get("sizes", {}).items() if name not in skip}


class Writer(enum.StrEnum):
    """Who wrote the tune-model phase's vLLM file."""

    TUNE_MODEL = "tune-model"  # at its end
    RECORD = "tune_model.py"  # from tune-model's record, tune-model having been cut first


@dataclass(frozen=True)
class TunedFile:
    """The tune-model phase's vLLM fused-MoE file, read back as vLLM reads it: ``{batch size: configuration}``."""

    path: Path
    configs: dict[int, dict[str, int]]
    written_by: Writer

    def pick(self, m: int) -> tuple[int, dict[str, int]]:
        """(batch size, configuration) vLLM launches M tokens with: the file's nearest batch size."""
        nearest = min(self.configs, key=lambda b: abs(b - m))
        return nearest, {f: int(self.configs[nearest][f]) for f in MOE_FIELDS}


def tuned_file(plan: Plan, outcomes: dict[str, Any], run: Path, since: float) -> TunedFile | None:
    """The vLLM fused-MoE file of the tune-model run ``run`` (named as vLLM looks it up for the plan's dtype:
    ``E=..,N=..,device_name=..[,dtype=fp8_w8a8].json``), read back; None before any key is decided. tune-model
    writes its files when it ends; where it did not end by itself since ``since`` (cut by ``--tune-seconds``),
    they are written here from its record, by the same function, so that what is compared is always the file."""
    from evotune.model import exports

    decided = [o for o in outcomes.values() if o.family == Family.FUSED_MOE.value]
    if not decided:
        return None
    (relative,) = [p for p, (kind, _) in exports.files(decided, plan.dtype).items()
                   if kind is exports.ServerFileKind.VLLM_MOE]
    path = run / relative
    written_by = Writer.TUNE_MODEL
    if not path.is_file() or path.stat().st_mtime < since:
        exports.write_server_files(outcomes.values(), run, plan.dtype)
        written_by = Writer.RECORD
    with open(path) as f:  # as vLLM reads it (fused_moe.get_moe_configs)
        configs = {int(k): v for k, v in json.load(f).items() if k != "triton_version"}
    return TunedFile(path, configs, written_by)


def _read_doc(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: (syntax): cannot read it as JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: (syntax): not a JSON object")
    return doc


def earlier_calls(out: Path, plan: Plan) -> dict[str, Any]:
    """What the calls before this one on ``out`` recorded (``grid.json``; empty for the first): the grid's and
    tune-model's records there are resumed, so ``out`` holding another dtype's is a :class:`ModelError` naming the
    file and the field, before anything is written."""
    doc: dict[str, Any] = {}
    top = out / "grid.json"
    if top.is_file():
        doc = _read_doc(top)
        got = doc.get("dtype", "bf16")  # grid.json of a bf16 comparison may not say its dtype
        if got != plan.dtype:
            raise ModelError(f"{top}: dtype: {got}, not --dtype {plan.dtype}: give each dtype its own --out")
    want = torch_dtype(plan)
    for path in sorted((out / "grid").glob("*/gpu*/grid.json")):
        for name, size in _read_doc(path).get("sizes", {}).items():
            got = size.get("key", {}).get("dtype") if isinstance(size, dict) else None
            if got != want:
                raise ModelError(f"{path}: sizes.{name}.key.dtype: {got}, not {want} (--dtype {plan.dtype}): give "
                                 "each dtype its own --out")
    return doc


def grid(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    plan = moe_plan(args.model, args.tp, args.batch_sizes, args.dtype)
    before = earlier_calls(out, plan)
    ms = [k.m for k in plan.keys]
    args.exhaustive = {m for m in args.exhaustive if m in ms}
    gpus = args.gpus or max(1, visible_gpus())
    env_ids = os.environ.get("CUDA_VISIBLE_DEVICES")
    args.gpu_ids = None if interpreted() else ([d.strip() for d in env_ids.split(",") if d.strip()] if env_ids
                                               else [str(i) for i in range(gpus)])[:gpus]
    args.jobs = args.jobs or max(1, ((os.cpu_count() or 4) - 2 * gpus) // gpus)
    grid_dir = out / "grid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TRITON_CACHE_DIR": str((grid_dir / "triton_cache").resolve())}
    # 1a. the exhaustive sizes side by side, one a GPU; 1b. the others spread over the GPUs
    began = time.perf_counter()
    exhaustive = sorted(args.exhaustive)
    groups_a = [set(exhaustive[i::gpus]) for i in range(min(gpus, len(exhaustive)))]
    docs_a = _grid_processes(grid_dir / "exhaustive", plan, groups_a, args, {}, env, args.grid_seconds) \
        if groups_a else []
    seed = _merge_sizes(docs_a, {})
    rest = [m for m in ms if m not in args.exhaustive]
    groups_b = [set(rest[i::gpus]) for i in range(min(gpus, len(rest)))]
    # a sampled size adds the fastest of its nearest exhaustive size where that one is complete (a size cut by
    # --grid-seconds is not timed again)
    complete = {name: size for name, size in seed.items() if size.get("complete")}
    seed_doc = {"sizes": complete, "exhaustive_ms": [int(s["key"]["M"]) for s in complete.values()],
                "timing": docs_a[0].get("timing", {}) if docs_a else {}}
    docs_b = _grid_processes(grid_dir / "sampled", plan, groups_b, args, seed_doc, env, args.grid_seconds) \
        if groups_b else []
    grid_wall = time.perf_counter() - began
    sizes = {**seed, **_merge_sizes(docs_b, seed)}
    measured, estimate, rows_by_m = _grid_costs(sizes, ms, gpus, args.jobs, grid_wall, args.grid_limit)
    # 2. tune-model, cold, on the same GPUs
    tune_dir = out / "tune"
    tenv = {**env, "TRITON_CACHE_DIR": str((tune_dir / "triton_cache").resolve())}
    cmd = tune_model_cmd(args.model, args.tp, args.batch_sizes, gpus, tune_dir, args.tuner, Family.FUSED_MOE.value,
                         plan.dtype, args.workers_per_gpu)
    tune_began = time.time()
    tune_wall, cut = run_capped(cmd, tenv, args.tune_seconds)
    outcomes = outcomes_of(tune_dir, plan)
    # a run cut by --tune-seconds goes on in the next call: its wall clock is the calls' together
    total_wall = float(before.get("tune", {}).get("wall_s_total", 0.0)) + tune_wall
    tune = {"wall_s": tune_wall, "wall_s_total": total_wall, "calls": int(before.get("tune", {}).get("calls", 0)) + 1,
            "interrupted": cut, "keys": len(plan.keys), "decided": len(outcomes),
            "evaluations": sum(o.evaluations for o in outcomes.values()),
            "gpu_s": sum(o.gpu_s for o in outcomes.values()),
            # the GPU's seconds on timing (evaluations and confirmations), as the grid's GPU time counts its timing
            "timing_s": sum(o.timing_s or 0.0 for o in outcomes.values()),
            "compiles": {str(o.fields["M"]): o.compiles for o in outcomes.values()},
            "command": " ".join(cmd[1:])}
    file = tuned_file(plan, outcomes, tune_dir, tune_began)
    if file is not None:
        tune["vllm_file"] = {"path": str(file.path.relative_to(out)), "name": file.path.name,
                             "batch_sizes": sorted(file.configs), "written_by": file.written_by}
    # 3. side by side: tune-model's pick, as vLLM reads it from that file, against the grid's fastest, per batch size
    retimed = _retime(plan, outcomes, file, rows_by_m, args)
    kinds = {int(size["key"]["M"]): grid_kind(size) for size in sizes.values()}
    for r in retimed:
        r["grid"] = kinds[r["M"]].value  # a re-timed size is one the grid timed
    # an exhaustive size cut by --grid-seconds holds the grid's first configurations in its order, not a sample:
    # its fastest says nothing of the grid's, so it is reported and left out of the fractions
    fractions = [r["fraction"] for r in retimed if r["grid"] != GridKind.CUT]
    missing = not_retimed(ms, {r["M"] for r in retimed}, {m for m, rows in rows_by_m.items() if rows},
                          {int(o.fields["M"]) for o in outcomes.values()})
    summary = {"batch_sizes": len(ms), "compared": len(fractions), "min_fraction": min(fractions, default=None),
               "cut": [r["M"] for r in retimed if r["grid"] == GridKind.CUT],
               "not_retimed": {str(m): why for m, why in missing.items()},
               "geomean_fraction": math.exp(statistics.fmean(math.log(f) for f in fractions)) if fractions else None,
               "tune_wall_s": total_wall, "grid_wall_s_measured": grid_wall,
               "grid_wall_s_estimated": estimate["wall_s"], "tune_gpu_s": tune["gpu_s"],
               "tune_timing_s": tune["timing_s"], "grid_gpu_s_estimated": estimate["gpu_s"],
               "wall_fraction": total_wall / estimate["wall_s"] if estimate["wall_s"] else None,
               "gpu_fraction": tune["timing_s"] / estimate["gpu_s"] if estimate["gpu_s"] else None}
    rows = [[r["M"], f"{r['grid_timed']} {r['grid']}", r["tuned_ms"], r["grid_best_ms"], r["fraction"],
             tune["compiles"].get(str(r["M"]))] for r in retimed]
    print(f"{plan.model.name} tp {plan.tp}, fused MoE {dtype_label(plan)}; tune-model's picks read back from "
          + (f"{tune['vllm_file']['path']} (written by {file.written_by})" if file is not None else "no file: "
             "no key decided"))
    print(table(rows, ["M", "grid timed", "tuned ms", "grid best ms", "fraction", "compiles"]))
    print(f"tune-model: {tune['decided']}/{tune['keys']} keys in {total_wall:.0f} s wall ({tune['calls']} calls) on "
          f"{gpus} GPUs, {tune['gpu_s']:.0f} GPU-s held, {tune['timing_s']:.1f} s of them timing; the grid: "
          f"{grid_wall:.0f} s measured, whole grid estimated {estimate['wall_s']:.0f} s wall, "
          f"{estimate['gpu_s']:.0f} GPU-s timing, {estimate['compile_s']:.0f} compile-s")
    if summary["cut"]:
        print(f"not compared (the grid cut by --grid-seconds before its fastest could be known): M = "
              f"{', '.join(map(str, summary['cut']))}")
    for why in dict.fromkeys(missing.values()):
        print(f"not re-timed ({why}): M = {', '.join(str(m) for m, w in missing.items() if w == why)}")
    if summary["wall_fraction"] is not None and summary["gpu_fraction"] is not None:
        print(f"tune-model / whole grid: wall {100 * summary['wall_fraction']:.1f}%, GPU timing "
              f"{100 * summary['gpu_fraction']:.2f}%")
    return {"model": args.model, "tp": args.tp, "dtype": plan.dtype, "torch_dtype": torch_dtype(plan),
            "scaling": "tensor" if plan.dtype == "fp8" else None, "gpus": gpus, "jobs": args.jobs,
            "exhaustive": exhaustive,
            "sample": args.sample, "seed": args.seed, "grid": {"measured": measured, "estimate": estimate,
                                                                "sizes": {n: {k: v for k, v in s.items() if k != "rows"}
                                                                          for n, s in sizes.items()}},
            "tune": tune, "retime": retimed, "summary": summary}


def not_retimed(ms: list[int], retimed: set[int], grid_timed: set[int], decided: set[int]) -> dict[int, str]:
    """Each batch size of ``ms`` without a re-timed row, and why: a table without it is not to be read as whole."""
    return {m: ("the grid timed none of its configurations" if m not in grid_timed else
                "tune-model did not decide it" if m not in decided else "--retime-seconds reached first")
            for m in ms if m not in retimed}


def _m_class() -> Callable[[int], tuple[str, ...]]:
    """What the fused-MoE kernel is built for at a batch size: Triton's specialisation of M
    (:func:`~evotune.triton_tuning.builds.specialisation`), one for every M where the kernel is not specialised on it
    (the package's, not interpreted)."""
    from search_spaces import _triton_fused_moe as moe

    free = not_specialised_on(moe.moe_gemm_kernel)
    return lambda m: specialisation({"M": m}, free)


def _grid_costs(sizes: dict[str, Any], ms: list[int], gpus: int, jobs: int, wall: float,
                limit: int) -> tuple[dict[str, Any], dict[str, Any], dict[int, list[tuple[float, int]]]]:
    """What the grid's run measured, the whole grid's costs estimated from its per-configuration costs, and each
    batch size's timed configurations (time, grid index), fastest first."""
    configs = limit or GRID_CONFIGS
    m_class = _m_class()
    compiled: dict[tuple[tuple[str, ...], str], float] = {}  # (specialisation, index) -> compile s, counted once
    gpu_s, timed, per_m_timing = 0.0, 0, {}
    rows_by_m: dict[int, list[tuple[float, int]]] = {}
    for size in sizes.values():
        m = int(size["key"]["M"])
        rows = size.get("rows", {})
        bench = [float(r["bench_s"] or 0.0) for r in rows.values()]
        gpu_s += sum(bench)
        timed += len(rows)
        if rows:
            per_m_timing[m] = statistics.fmean(bench)
        for i, r in rows.items():
            compiled.setdefault((m_class(m), i), float(r["compile_s"] or 0.0))
        rows_by_m[m] = sorted((float(r["time_ms"]), int(i)) for i, r in rows.items() if r["status"] == "ok")
    compile_s = sum(compiled.values())
    measured = {"wall_s": wall, "gpu_s": gpu_s, "configs_timed": timed, "compiled": len(compiled),
                "compile_s": compile_s}
    per_compile = compile_s / len(compiled) if compiled else 0.0
    mean_timing = statistics.fmean(per_m_timing.values()) if per_m_timing else 0.0
    est_gpu = sum(per_m_timing.get(m, mean_timing) for m in ms) * configs
    est_compile = per_compile * configs * len({m_class(m) for m in ms})
    # the grid's way overlaps the compiles (a pool of `jobs` a GPU) with the timing (one GPU each)
    estimate = {"gpu_s": est_gpu, "compile_s": est_compile, "per_config_timing_s": mean_timing,
                "per_config_compile_s": per_compile, "configs": configs * len(ms),
                "wall_s": max(est_gpu / gpus, est_compile / (gpus * jobs))}
    return measured, estimate, rows_by_m


def moe_calls(plan: Plan, key: Key, configs: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Each named configuration's launch of the plain fused-MoE kernel at ``key``, as vLLM launches it with a
    configuration from its file, all on one set of the key's inputs."""
    from search_spaces import _triton_fused_moe as moe

    grid, args, kwargs = moe.make_args(key.m, key.shape.n, key.shape.k, key.shape.experts, key.shape.top_k,
                                       torch_dtype(plan))
    return {name: (lambda c=c: moe.moe_gemm_kernel[grid](*args, **kwargs, **c)) for name, c in configs.items()}


def _retime(plan: Plan, outcomes: dict[str, Any], file: TunedFile | None,
            rows_by_m: dict[int, list[tuple[float, int]]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per decided batch size: the configuration vLLM launches from ``file`` and the grid's three fastest, re-timed
    side by side."""
    if not outcomes or file is None:
        return []
    import itertools

    from evotune.measurement.retiming import confirm_rounds
    from evotune.triton_tuning.timers import OracleTimer, Timer, WallClockTimer
    from search_spaces import _triton_fused_moe as moe

    names = [p.name for p in moe.SPACE.params]
    points = [dict(zip(names, v, strict=True)) for v in itertools.product(*(p.choices for p in moe.SPACE.params))]
    timer: Timer = WallClockTimer() if interpreted() else OracleTimer()
    deadline = time.perf_counter() + args.retime_seconds
    out = []
    for key in plan.keys:
        outcome = outcomes.get(key.ident)
        ranked = rows_by_m.get(key.m, [])
        if outcome is None or not ranked:
            continue
        if time.perf_counter() > deadline:
            print(f"retime: --retime-seconds reached before M={key.m}", flush=True)
            break
        file_m, tuned = file.pick(key.m)
        configs = {"tuned": tuned}
        for rank, (_, i) in enumerate(ranked[:3]):
            configs[f"grid#{rank + 1}"] = points[i]
        # one of the grid's fastest that is the pick itself is timed once, as the pick: the same kernel entered
        # twice pits the rounds' noise against itself, and the fraction would take the lower of two draws
        same = [name for name, c in configs.items() if name != "tuned" and c == tuned]
        calls = moe_calls(plan, key, {name: c for name, c in configs.items() if name not in same})
        # the confirmation's interleaved rounds, each batch size within --retime-each seconds
        conf = confirm_rounds(list(calls), lambda name, n, calls=calls: timer.samples(calls[name], n),
                              replace(timer.confirm_options(len(calls)), max_seconds=args.retime_each),
                              warm=getattr(timer, "warm", None))
        medians = {n: conf.items[n].median_ms for n in calls} | {name: conf.items["tuned"].median_ms for name in same}
        best = min(v for n, v in medians.items() if n != "tuned")
        # each re-timed configuration by its name, the grid's fastest included: which one won, not only how fast
        out.append({"M": key.m, "grid_timed": len(ranked), "tuned": configs["tuned"], "configs": configs,
                    "file_batch_size": file_m,
                    "file_is_decision": tuned == {f: int(outcome.config[f]) for f in MOE_FIELDS}, "medians_ms": medians,
                    "same_as_tuned": same,
                    "tuned_ms": medians["tuned"], "grid_best_ms": best,
                    "fraction": min(medians.values()) / medians["tuned"]})
    return out


# -- scaling ---------------------------------------------------------------------------------------------------
def scaling(args: argparse.Namespace) -> dict[str, Any]:
    from evotune.running.cost_model import CostModel

    out = Path(args.out)
    plan = only(make_plan(load_model(args.model), args.tp, None, parse_batch_sizes(args.batch_sizes)),
                None if args.kernels == "all" else frozenset(Family(k) for k in args.kernels.split(",")))
    counts = [int(x) for x in args.gpus.split(",")]
    # runs of an earlier call on the same machine (a device call is at most ten minutes): one table across calls
    rows = [] if args.previous is None else \
        [r for r in json.loads(Path(args.previous).read_text())["runs"] if r["gpus"] not in counts]
    for g in counts:
        folder = out / f"gpus{g}"
        env = {**os.environ, "TRITON_CACHE_DIR": str((folder / "triton_cache").resolve()),
               "EVOTUNE_KERNEL_CACHE": str((folder / "kernels").resolve())}
        cmd = tune_model_cmd(args.model, args.tp, args.batch_sizes, g, folder, args.tuner, args.kernels,
                             workers_per_gpu=args.workers_per_gpu)
        wall, cut = run_capped(cmd, env, args.max_seconds)
        outcomes = outcomes_of(folder, plan)
        rows.append({"gpus": g, "workers_per_gpu": args.workers_per_gpu, "wall_s": wall, "interrupted": cut,
                     "keys": len(outcomes),
                     "evaluations": sum(o.evaluations for o in outcomes.values()),
                     "gpu_s": sum(o.gpu_s for o in outcomes.values()),
                     "points_timed_twice": points_timed_twice(folder), "command": " ".join(cmd[1:]),
                     "worker_startup_s": [w.startup_s for _, w in sorted(worker_starts(folder, plan).items())]})
    rows.sort(key=lambda r: r["gpus"])
    for r in rows:
        r["speedup"] = rows[0]["wall_s"] / r["wall_s"]
    prediction = None
    if len(rows) >= 3 and rows[0]["gpus"] == 1 and all(r["evaluations"] and r["keys"] for r in rows[:2]):
        one, two = rows[0], rows[1]
        # the two runs' GPU-seconds pooled: learning contention from them extrapolated one run's spread (a two-GPU
        # run holding its keys 20% longer than one GPU, and a four-GPU run 8%, on one host)
        per_eval = (one["gpu_s"] + two["gpu_s"]) / (one["evaluations"] + two["evaluations"])
        model = CostModel(startup_s=max(0.0, one["wall_s"] - one["gpu_s"]), per_problem_s=0.0, per_eval_s=per_eval)
        last = rows[-1]
        # a key is one worker's from its start to its decision (tune-model deals whole keys)
        predicted = model.wall_s(one["keys"], max(1, round(one["evaluations"] / one["keys"])), last["gpus"], "whole")
        prediction = {"gpus": last["gpus"], "predicted_wall_s": predicted, "measured_wall_s": last["wall_s"],
                      "error": predicted / last["wall_s"] - 1.0, "model": model.__dict__}
    print(table([[r["gpus"], r["wall_s"], r["keys"], r["evaluations"], r["gpu_s"], r["points_timed_twice"],
                  r["speedup"], max(r["worker_startup_s"], default=None)] for r in rows],
                ["GPUs", "wall s", "keys", "evaluations", "GPU-s", "timed twice", "speed-up", "worker start s"]))
    if prediction is not None:
        print(f"cost model from {rows[0]['gpus']} and {rows[1]['gpus']} GPUs: {prediction['predicted_wall_s']:.0f} s "
              f"on {prediction['gpus']} (measured {prediction['measured_wall_s']:.0f} s)")
    return {"model": args.model, "tp": args.tp, "runs": rows, "prediction": prediction}


# -- startup ---------------------------------------------------------------------------------------------------
def worker_starts(run: Path, plan: Plan) -> dict[int, WorkerStart]:
    """Each worker's start and first evaluation, from the run's record."""
    db = run / "tune_model.db"
    return Ledger(f"sqlite:///{db.resolve()}", plan.ident).workers() if db.is_file() else {}


def startup(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    gpus = args.gpus or max(1, visible_gpus())
    sizes = args.batch_sizes or ",".join(str(m) for m in parse_batch_sizes("vllm")[:gpus])
    plan = only(make_plan(load_model(args.model), args.tp, None, parse_batch_sizes(sizes)),
                None if args.kernels == "all" else frozenset(Family(k) for k in args.kernels.split(",")))
    env = {**os.environ, "TRITON_CACHE_DIR": str((out / "triton_cache").resolve()),
           "EVOTUNE_KERNEL_CACHE": str((out / "kernels").resolve())}
    passes = []
    for name in ("cold", "warm"):
        run = out / name
        cmd = tune_model_cmd(args.model, args.tp, sizes, gpus, run, args.tuner, args.kernels)
        launched = time.time()
        wall, cut = run_capped(cmd, env, args.max_seconds)
        starts = worker_starts(run, plan)
        passes.append({"pass": name, "wall_s": wall, "interrupted": cut, "command": " ".join(cmd[1:]),
                       "workers": [{"worker": i, "startup_s": w.startup_s,
                                    "from_command_s": w.first_evaluation - launched}
                                   for i, w in sorted(starts.items())]})
    print(table([[p["pass"], w["worker"], w["startup_s"], w["from_command_s"]] for p in passes for w in p["workers"]],
                ["pass", "worker", "first evaluation s (from its start)", "(from the command's)"]))
    return {"model": args.model, "tp": args.tp, "gpus": gpus, "kernels": args.kernels, "batch_sizes": sizes,
            "passes": passes}


# -- decode-step -----------------------------------------------------------------------------------------------
def decode_step(args: argparse.Namespace) -> dict[str, Any]:
    import layer_step
    import torch

    run = Path(args.run)
    if not run.is_dir():
        raise ModelError(f"--run {args.run}: no such folder (the --out of a tune-model run)")
    if not (run / "tuned.json").is_file() and not (run / "vllm").is_dir():
        raise ModelError(f"--run {args.run}: no tuned.json and no vllm/ (the --out of a tune-model run)")
    model = load_model(args.model)
    device = torch.cuda.get_device_name()
    deadline = time.perf_counter() + args.max_seconds
    oracle = layer_step.clean_oracle()  # one oracle for the steps, their GEMMs and their reads
    results = []
    for m in args.ms:
        if time.perf_counter() > deadline:
            print(f"decode-step: --max-seconds reached before M={m}", flush=True)
            break
        gemms = layer_step.compose(make_plan(model, args.tp, "bf16", (m,)), m, run, device)
        for g in gemms:
            if g.tuned is None:
                print(f"decode-step: M={m} {g.name}: {g.source}", flush=True)
        steps = layer_step.launches(gemms, m)
        timing = layer_step.time_step([(s.tuned, s.untuned) for s in steps], args.rounds, args.replays, oracle)
        reads = layer_step.time_reads(layer_step.read_sizes(steps), args.rounds, args.replays, oracle)
        results.append(layer_step.step_record(m, gemms, steps, timing, reads))
        del steps, timing
        torch.cuda.empty_cache()
    rows = []
    for r in results:
        rows.append([r["m"], "step", *_step_row(r), ""])
        rows += [["", g["layers"], *_step_row(g), "cuBLAS" if g["untuned_config"] is None else "vLLM default"]
                 for g in r["layers"]]
    print(table(rows, ["M", "GEMM", "MB", "tuned ms", "untuned ms", "untuned / tuned", "read ms", "tuned % of read",
                       "untuned / read", "untuned is"]))
    print("each sample after the oracle's clean L2 flush (every replay reads its weights from HBM); MB: what the GEMM "
          "must move (input, the weights it touches, output); read ms: a plain read of those bytes timed the same "
          "way; untuned / read: the most tuning can gain")
    return {"model": args.model, "tp": args.tp, "device": device, "run": str(args.run), "flush": "clean",
            "steps": results}


def _step_row(r: dict[str, Any]) -> list[Any]:
    """A step's or a GEMM's cells of the decode-step table, from its record."""
    return [r["bytes"] / 1e6, r["tuned_ms"], r["untuned_ms"], r["ratio"], r["read_ms"], r["tuned_pct_of_read"],
            r["untuned_over_read"]]


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    helps = {"grid": "tune-model's fused-MoE picks against vLLM's grid, run the grid's way on the same GPUs",
             "scaling": "the same tune-model job on 1, 2, 4 GPUs, and the cost model's prediction",
             "decode-step": "one decoder layer's GEMMs in one CUDA graph, tuned against untuned and against a "
                            "plain read of the bytes each must move"}
    helps["startup"] = "each worker's seconds from its start to its first evaluation, cold and warm, as the run records"
    for name in ("grid", "scaling", "decode-step", "startup"):
        s = sub.add_parser(name, help=helps[name], description=helps[name])
        s.add_argument("--model", required=True, help="a shipped model or a config.json (as tune-model takes it)")
        s.add_argument("--tp", type=int, default=1)
        s.add_argument("--out", required=True, help="where the JSON and the runs go")
    g = sub.choices["grid"]
    g.add_argument("--batch-sizes", default="vllm", help="the fused-MoE keys (default vLLM's 18)")
    g.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="bf16",
                   help="the keys' dtype: bf16, or fp8 (e4m3 activations and weights scaled per tensor, vLLM's "
                        "fp8_w8a8) for the grid, tune-model and the re-timing")
    g.add_argument("--gpus", type=int, default=0, help="GPUs for the grid and for tune-model (default every one)")
    g.add_argument("--exhaustive", type=lambda t: set(_ints(t)), default={16, 256, 2048},
                   help="batch sizes timed over the whole grid (default 16,256,2048)")
    g.add_argument("--sample", type=int, default=128, help="grid configurations (seeded) for the other sizes")
    g.add_argument("--nearest", type=int, default=16, help="... plus the nearest exhaustive size's fastest")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--jobs", type=int, default=0, help="compile processes a GPU (default the host's cores, less "
                                                        "two a GPU, shared out)")
    g.add_argument("--grid-seconds", type=float, default=140.0, help="cap of each grid phase (exhaustive, sampled)")
    g.add_argument("--tune-seconds", type=float, default=150.0, help="cap of the tune-model run")
    g.add_argument("--retime-seconds", type=float, default=75.0, help="no batch size is re-timed after this")
    g.add_argument("--retime-each", type=float, default=3.0, help="seconds of rounds a batch size is re-timed for")
    g.add_argument("--grid-limit", type=int, default=0, help="only the first N grid configurations (tests)")
    g.add_argument("--tuner", default=DEFAULT_TUNER, help="tune-model's --tuner (a stand-in on the CPU)")
    g.add_argument("--workers-per-gpu", type=int, default=1, help="tune-model's --workers-per-gpu")
    sc = sub.choices["scaling"]
    sc.add_argument("--gpus", default="1,2,4", help="the GPU counts to run, comma-separated")
    sc.add_argument("--batch-sizes", default="vllm")
    sc.add_argument("--kernels", default="all", help="tune-model's --kernels: a smaller job")
    sc.add_argument("--max-seconds", type=float, default=None, help="cap of each run (interrupted; counted as far "
                                                                    "as it got)")
    sc.add_argument("--tuner", default=DEFAULT_TUNER)
    sc.add_argument("--workers-per-gpu", type=int, default=1, help="tune-model's --workers-per-gpu")
    sc.add_argument("--previous", default=None, help="the JSON of this command run earlier on the same machine with "
                    "other GPU counts: its runs join the table")
    ds = sub.choices["decode-step"]
    ds.add_argument("--ms", type=_ints, default=[1, 16, 64], help="the batches (tokens of the decode step)")
    ds.add_argument("--run", required=True, help="a tune-model run's --out (its tuned.json and vllm/)")
    ds.add_argument("--replays", type=int, default=10, help="samples of each version a round (each after a flush; "
                                                             "each plain read's too)")
    ds.add_argument("--rounds", type=int, default=10, help="rounds, tuned and untuned alternated (a plain read: "
                                                            "as many)")
    ds.add_argument("--max-seconds", type=float, default=120.0, help="no batch is started after this")
    st = sub.choices["startup"]
    st.add_argument("--gpus", type=int, default=0, help="workers, one a GPU, started together (default every GPU)")
    st.add_argument("--batch-sizes", default=None, help="the keys (default the first of vLLM's, one a worker)")
    st.add_argument("--kernels", default="fused_moe", help="tune-model's --kernels")
    st.add_argument("--tuner", default=DEFAULT_TUNER)
    st.add_argument("--max-seconds", type=float, default=300.0, help="cap of each pass")
    args = p.parse_args(argv)
    try:
        result = {"grid": grid, "scaling": scaling, "decode-step": decode_step, "startup": startup}[args.what](args)
    except ModelError as exc:
        print(f"tune_model.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.what.replace('-', '_')}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``tune-model`` on a GPU host: its scaling over GPUs, its fused-MoE picks against vLLM's grid, and a decode step.

Three subcommands; each writes JSON under ``--out``:

* ``scaling``: ``python -m evotune tune-model MODEL --tp T --gpus G`` for each G of ``--gpus`` (1,2,4), each in
  a fresh folder ``OUT/gpusG`` (cold: its own storage and autotune cache); per G the wall time, keys, evaluations
  and GPU-seconds (the run's report), and the speed-up over the smallest G. ``scaling.json``.
* ``grid``: the plan's fused-MoE keys written in ``tune-kernel``'s keys format (``OUT/moe_keys.toml``: M, N, K, E,
  top_k, dtype), then ``benchmarks/autotune_moe.py`` run on them: evotune's autotune as tune-model runs it, and
  vLLM's grid timed the grid's way (``benchmark_moe.py``'s 1,920 configurations), with its report of each batch
  size's pick against the grid's best and the GPU time of both.
* ``decode-step``: one decoder layer's dense GEMMs at batch ``--m`` (QKV, O, gate-up, down per shard), back to
  back in one CUDA graph: the tuned kernel (the run's decisions, ``OUT_OF_RUN/autotune.db``, read in cache-only
  mode) against cuBLAS (``torch.matmul``), the two graphs replayed alternately. ``decode_step.json``: the
  layers, each graph's median time and the ratio untuned / tuned.

::

    python benchmarks/tune_model.py scaling --model Mixtral-8x7B --tp 2 --gpus 1,2,4 --out runs/tune_model_scaling
    python benchmarks/tune_model.py grid --model Mixtral-8x7B --tp 2 --out runs/tune_model_grid -- --max-seconds 540
    python benchmarks/tune_model.py decode-step --model Llama-3-8B --tp 1 --m 16 \\
        --run runs/tune_model/Llama-3-8B-tp1-bf16 --out runs/tune_model_decode

``scaling`` takes ``--tuner`` and ``--batch-sizes`` as tune-model does (the CPU test runs it with a stand-in tuner
under the Triton interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.model.models import load_model  # noqa: E402
from evotune.model.plan import Family, Plan, make_plan, parse_batch_sizes  # noqa: E402
from evotune.model.runner import DEFAULT_TUNER  # noqa: E402

TORCH_DTYPES = {"bf16": "bfloat16"}


def moe_keys_toml(plan: Plan) -> str:
    """The plan's fused-MoE keys in tune-kernel's keys format (fused_moe.py's make_args)."""
    lines = ['launch = "make_args"', ""]
    for kernel in plan.kernels:
        if kernel.shape.family is not Family.FUSED_MOE:
            continue
        for key in kernel.keys:
            lines += ["[[key]]", f"M = {key.m}", f"N = {key.shape.n}", f"K = {key.shape.k}",
                      f"E = {key.shape.experts}", f"top_k = {key.shape.top_k}",
                      f'dtype = "{TORCH_DTYPES[plan.dtype]}"', ""]
    return "\n".join(lines)


def dense_layers(plan: Plan, m: int) -> list[tuple[str, int, int]]:
    """(layers, N, K) of the plan's dense GEMMs at batch ``m``, in the plan's order (one decoder layer's)."""
    return [(", ".join(k.layers), k.shape.n, k.shape.k) for k in plan.kernels
            if k.shape.family in (Family.DECODE, Family.GEMM) and any(key.m == m for key in k.keys)]


def scaling(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    rows = []
    for g in [int(x) for x in args.gpus.split(",")]:
        folder = out / f"gpus{g}"
        cmd = [sys.executable, "-m", "evotune", "tune-model", args.model, "--tp", str(args.tp), "--gpus", str(g),
               "--batch-sizes", args.batch_sizes, "--out", str(folder), "--no-progress", "--tuner", args.tuner]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT)
        wall = time.perf_counter() - started
        rep = json.loads((folder / "report.json").read_text())
        rows.append({"gpus": g, "wall_s": wall, "keys": sum(k["decided"] for k in rep["kernels"]),
                     "evaluations": sum(k["evaluations"] for k in rep["kernels"]),
                     "gpu_s": sum(k["gpu_s"] for k in rep["kernels"]), "command": " ".join(cmd[1:])})
    for r in rows:
        r["speedup"] = rows[0]["wall_s"] / r["wall_s"]
    return {"model": args.model, "tp": args.tp, "runs": rows}


def grid(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    plan = make_plan(load_model(args.model), args.tp, None, parse_batch_sizes(args.batch_sizes))
    out.mkdir(parents=True, exist_ok=True)
    keys = out / "moe_keys.toml"
    keys.write_text(moe_keys_toml(plan))
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    cmd = [sys.executable, str(ROOT / "benchmarks" / "autotune_moe.py"), "--keys", str(keys), "--out", str(out),
           *rest]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return {"model": args.model, "tp": args.tp, "keys": str(keys), "command": " ".join(cmd[1:])}


def decode_step(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from evotune.model.autotune_api import load_module

    plan = make_plan(load_model(args.model), args.tp, "bf16", (args.m,))
    layers = dense_layers(plan, args.m)
    module = load_module(str(ROOT / "examples" / "triton_autotune" / "matmul_space.py"))
    kernel = module.matmul_space_kernel
    kernel.use_cache(f"sqlite:///{(Path(args.run) / 'autotune.db').resolve()}")
    kernel.mode = "cache-only"  # the run's decisions; nothing is timed here
    inputs = []
    for _, n, k in layers:
        a = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
        inputs.append((a, b, torch.empty(args.m, n, device="cuda", dtype=torch.bfloat16)))

    def tuned() -> None:
        for a, b, c in inputs:
            kernel[module.grid(a.shape[0], b.shape[1])](*module.launch_args(a, b, c))

    def untuned() -> None:
        for a, b, c in inputs:
            torch.matmul(a, b, out=c)

    for a, b, c in inputs:  # the tuned kernel agrees with cuBLAS before anything is timed
        kernel[module.grid(a.shape[0], b.shape[1])](*module.launch_args(a, b, c))
        torch.testing.assert_close(c, a @ b, rtol=2e-2, atol=2e-2)
    graphs = {}
    for name, step in (("tuned", tuned), ("untuned", untuned)):
        step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(args.replays):
                step()
        graphs[name] = g
    samples: dict[str, list[float]] = {"tuned": [], "untuned": []}
    for _ in range(args.rounds):  # alternated: a clock or thermal drift reaches both
        for name, g in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / args.replays)
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"model": args.model, "tp": args.tp, "m": args.m, "device": torch.cuda.get_device_name(),
            "layers": [{"layers": n, "N": nn, "K": k} for n, nn, k in layers],
            "tuned_ms": med["tuned"], "untuned_ms": med["untuned"], "ratio": med["untuned"] / med["tuned"],
            "samples_ms": samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("scaling", "grid", "decode-step"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
        s.add_argument("--tp", type=int, default=1)
        s.add_argument("--out", required=True)
        s.add_argument("--batch-sizes", default="vllm")
    sc = sub.choices["scaling"]
    sc.add_argument("--gpus", default="1,2,4", help="the GPU counts to run, comma-separated")
    sc.add_argument("--tuner", default=DEFAULT_TUNER)
    sub.choices["grid"].add_argument("rest", nargs=argparse.REMAINDER, help="after --: more arguments for "
                                                                              "autotune_moe.py")
    ds = sub.choices["decode-step"]
    ds.add_argument("--m", type=int, default=16, help="the batch (tokens of the decode step)")
    ds.add_argument("--run", required=True, help="the tune-model run's --out (its autotune.db)")
    ds.add_argument("--replays", type=int, default=20, help="steps per graph")
    ds.add_argument("--rounds", type=int, default=50)
    args = p.parse_args(argv)
    result = {"scaling": scaling, "grid": grid, "decode-step": decode_step}[args.what](args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.what.replace('-', '_')}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples_ms"}, indent=1))
    print(path)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    sys.exit(main())

"""The most any configuration of vLLM's fused-MoE grid gains on vLLM's default for a MoE layer's two expert GEMMs
at one batch: the bound of what tuning the fused MoE can give a decode step.

For each batch M of ``--ms``, a layer of ``--model`` at ``--tp`` (bf16): the experts' gate-up GEMM (the hidden
state times each routed expert's ``2 x intermediate`` rows) and their down GEMM (each (token, expert) slot's
activated row times the expert's ``hidden`` rows, the routing weights applied), launched as
``benchmarks/layer_step.py`` launches them through the package's kernel (``search_spaces/_triton_fused_moe.py``).
Every configuration of the kernel's space (vLLM's 1,920, less what its constraints prune at that launch) is built
by ``--processes`` processes and timed on each GEMM by evotune's oracle with its clean L2 flush (every sample reads
the weights from HBM, as a decode step does), as are vLLM's default configuration (:func:`default_config`) and a
plain read of the bytes each GEMM must move (``benchmarks/read_ceiling.py``). Per M it reports:

* ``one config``: the configuration with the least gate-up + down time, as vLLM launches both GEMMs with one;
* ``own down``: the fastest gate-up and the fastest down configuration of one ``BLOCK_SIZE_M`` (both GEMMs share
  the token alignment), as SGLang's separate down-projection file allows;
* vLLM's default, and each against its plain read.

``default / one config`` is the most a tuned vLLM file can gain on the two GEMMs at that batch; a decode step's
other GEMMs (attention's projections, a few % of its bytes at most) move it little. The search's picks are not
part of it: this times the whole space.

    python benchmarks/moe_grid_bound.py --model Mixtral-8x7B --tp 2 --ms 1,16,64 --out runs/moe_bound
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from evotune.model.models import ModelError, load_model  # noqa: E402
from evotune.model.plan import Family, make_plan  # noqa: E402

GEMMS = ("gate_up", "down")


def expert_shape(model: str, tp: int) -> tuple[int, int, int, int]:
    """(experts, top_k, intermediate per shard, hidden) of the model's fused MoE at ``tp``."""
    plan = make_plan(load_model(model), tp, "bf16", (1,))
    shapes = [k.shape for k in plan.kernels if k.shape.family is Family.FUSED_MOE]
    if not shapes:
        raise ModelError(f"--model {model}: no routed experts, so no fused MoE to bound")
    s = shapes[0]
    return s.experts, s.top_k, s.n // 2, s.k


def launches(m: int, shape: tuple[int, int, int, int], fill: bool = True, seed: int = 0) -> dict[str, Any]:
    """Each GEMM's (grid, args, kwargs) at batch ``m``, routed by a seeded random gate; ``fill=False``: the
    weights left uninitialised (a build needs their shapes and dtypes only)."""
    import torch

    from search_spaces import _triton_fused_moe as moe

    experts, top_k, inter, hidden = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.bfloat16

    def weight(n: int, k: int) -> Any:
        if not fill:
            return torch.empty(experts, n, k, device="cuda", dtype=dt)
        return (torch.randn(experts, n, k, device="cuda", generator=g) / k**0.5).to(dt)

    x = torch.randn(m, hidden, device="cuda", generator=g).to(dt)
    gate = torch.randn(hidden, experts, device="cuda", generator=g).to(dt)
    weights, ids = moe.route(x, gate, top_k)
    act = torch.randn(m * top_k, inter, device="cuda", generator=g).to(dt)
    # the routing weights are applied by the down GEMM, which reads one row per slot (top_k 1), as vLLM's does
    return {"gate_up": moe.make_launch(x, weight(2 * inter, hidden), torch.ones_like(weights), ids, top_k),
            "down": moe.make_launch(act, weight(hidden, inter), weights.reshape(-1, 1), ids.reshape(-1, 1), 1),
            "hit": int(ids.unique().numel())}


def feasible(launch: tuple[Any, ...]) -> list[dict[str, int]]:
    """The configurations the kernel's space keeps for this launch (its constraints read the launch)."""
    from evotune.triton_tuning.configs import Candidates, LaunchContext
    from search_spaces import _triton_fused_moe as moe

    _, args, kwargs = launch
    named = {**dict(zip(moe.moe_gemm_kernel.arg_names, args, strict=False)), **kwargs}
    fs = Candidates.from_space(moe.SPACE).feasible(LaunchContext(args=named))
    return [dict(fs.point(i)) for i in range(len(fs))]


_BUILD: dict[int, dict[str, Any]] = {}


def _build(job: tuple[int, tuple[int, int, int, int], str, dict[str, int]]) -> str | None:
    """Build one configuration of one GEMM into the Triton cache (in a build process); why it failed, or None."""
    from search_spaces import _triton_fused_moe as moe

    m, shape, which, config = job
    if m not in _BUILD:  # one batch's launches at a time: a model's expert weights are gigabytes a process
        _BUILD.clear()
        _BUILD[m] = launches(m, shape, fill=False)
    grid, args, kwargs = _BUILD[m][which]
    try:
        moe.moe_gemm_kernel.warmup(*args, grid=grid, **kwargs, **config)
    except Exception as exc:  # a configuration the compiler refuses is timed as failed, not fatal
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def _key(c: dict[str, int]) -> tuple[int, ...]:
    return tuple(sorted(c.items()))  # type: ignore[arg-type]


def bound(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from layer_step import DOWN, GATE_UP, StepGemm, clean_oracle
    from read_ceiling import fastest_read

    from search_spaces import _triton_fused_moe as moe

    shape = expert_shape(args.model, args.tp)
    experts, top_k, inter, hidden = shape
    started = time.perf_counter()
    ls = {m: launches(m, shape) for m in args.ms}
    spaces = {m: {w: feasible(ls[m][w]) for w in GEMMS} for m in args.ms}
    jobs = [(m, shape, w, c) for m in args.ms for w in GEMMS for c in spaces[m][w]]
    # build processes spawned (not forked: this process holds a CUDA context), each with its own launches
    with mp.get_context("spawn").Pool(args.processes) as pool:
        failed = pool.map(_build, jobs, chunksize=4)
    print(f"{len(jobs)} builds in {time.perf_counter() - started:.0f} s, {sum(f is not None for f in failed)} "
          "failed", flush=True)
    oracle = clean_oracle()

    def median(fn: Any, n: int = args.samples) -> float:
        oracle.warm(fn)
        return statistics.median(oracle.round(fn, n))

    def launch(m: int, w: str, config: dict[str, int]) -> Any:
        grid, a, kw = ls[m][w]
        return lambda: moe.moe_gemm_kernel[grid](*a, **kw, **config)

    rows = []
    for m in args.ms:
        times: dict[str, dict[tuple[int, ...], float]] = {}
        default = moe.default_config(m, experts)
        defaults: dict[str, float] = {}
        for w in GEMMS:
            times[w] = {}
            for c in spaces[m][w]:
                try:
                    times[w][_key(c)] = median(launch(m, w, c))
                except Exception:  # a configuration that fails to launch is left out (the counts say how many)
                    continue
            defaults[w] = median(launch(m, w, default))  # as each configuration; the ratios come from the rounds below
        both = set(times["gate_up"]) & set(times["down"])
        one = min(both, key=lambda k: times["gate_up"][k] + times["down"][k])
        own: tuple[float, tuple[int, ...], tuple[int, ...]] | None = None
        for bm in sorted({dict(k)["BLOCK_SIZE_M"] for k in both}):
            gu = min((k for k in times["gate_up"] if dict(k)["BLOCK_SIZE_M"] == bm), key=times["gate_up"].get)
            dn = min((k for k in times["down"] if dict(k)["BLOCK_SIZE_M"] == bm), key=times["down"].get)
            if own is None or times["gate_up"][gu] + times["down"][dn] < own[0]:
                own = (times["gate_up"][gu] + times["down"][dn], gu, dn)
        assert own is not None
        # re-time the three pairs side by side, alternated, so that the ratios compare samples of one period
        pairs = {"default": (default, default), "one config": (dict(one), dict(one)),
                 "own down": (dict(own[1]), dict(own[2]))}
        got: dict[str, list[float]] = {name: [] for name in pairs}
        for _ in range(args.rounds):
            for name, (cg, cd) in pairs.items():
                t = 0.0
                for w, c in zip(GEMMS, (cg, cd), strict=True):
                    t += median(launch(m, w, c))
                got[name].append(t)
        ms = {name: statistics.median(v) for name, v in got.items()}
        hit = ls[m]["hit"]
        nbytes = {w: StepGemm(name, Family.FUSED_MOE.value, n, k, None, None, "", experts, top_k).bytes(m, 2, hit)
                  for w, name, n, k in (("gate_up", GATE_UP, 2 * inter, hidden), ("down", DOWN, hidden, inter))}
        reads = {w: fastest_read(nbytes[w], median).ms for w in GEMMS}
        read = reads["gate_up"] + reads["down"]
        row = {"m": m, "experts_hit": hit, "configurations": {w: len(times[w]) for w in GEMMS},
               "default": default, "one_config": dict(one), "own_down": {"gate_up": dict(own[1]), "down": dict(own[2])},
               "ms": ms, "alone_ms": {"default": defaults, "one config": {w: times[w][one] for w in GEMMS}},
               "read_ms": reads, "bytes": nbytes,
               "default_over_one_config": ms["default"] / ms["one config"],
               "default_over_own_down": ms["default"] / ms["own down"],
               "pct_of_read": {name: 100 * v / read for name, v in ms.items()}}
        rows.append(row)
        print(f"M={m}: default {ms['default']:.4f} ms, one config {ms['one config']:.4f}, own down "
              f"{ms['own down']:.4f}; default / one config {row['default_over_one_config']:.3f}x, / own down "
              f"{row['default_over_own_down']:.3f}x; % of a plain read: "
              + ", ".join(f"{k} {v:.1f}" for k, v in row["pct_of_read"].items()), flush=True)
        del ls[m]
        torch.cuda.empty_cache()
    return {"model": args.model, "tp": args.tp, "device": torch.cuda.get_device_name(), "flush": "clean",
            "experts": experts, "top_k": top_k, "intermediate": inter, "hidden": hidden, "rows": rows,
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a shipped model or a config.json (as tune-model takes it)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ms", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16, 64])
    p.add_argument("--out", required=True)
    p.add_argument("--processes", type=int, default=15, help="build processes")
    p.add_argument("--samples", type=int, default=8, help="samples of a configuration (each after a flush)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the side-by-side re-timing")
    args = p.parse_args(argv)
    try:
        result = bound(args)
    except ModelError as exc:
        print(f"moe_grid_bound.py: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_grid_bound.json").write_text(json.dumps(result, indent=1) + "\n")
    print(out / "moe_grid_bound.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

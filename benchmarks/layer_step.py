"""One decoder layer of a model at one batch, as ``benchmarks/tune_model.py decode-step`` times it: which GEMMs the
step holds, with which configuration each runs tuned and untuned, their launches, and the timing.

The step is the layer's GEMMs back to back: its dense linear layers (QKV, O; the MLP's gate-up and down for a dense
model or a MoE model's shared experts) and, for a MoE model, the experts' two grouped GEMMs (gate-up, then down on
the gate-up's activated half) through the package's fused-MoE kernel (``search_spaces/_triton_fused_moe.py``). The
step's tuned and untuned versions launch the same GEMMs:

* dense, M <= 64: the decode family's configuration from the run's ``tuned.json`` against cuBLAS
  (``torch.matmul``); above: the GEMM kernel's configuration against cuBLAS;
* fused MoE: the configuration the run wrote to vLLM's file (``OUT/vllm/E=..,N=..,device_name=...json``) for the
  batch size nearest M, as vLLM picks it, against vLLM's default configuration (what a server without the file
  launches); both GEMMs of the layer take it, as vLLM's do.

A GEMM the run has no decision for runs untuned in both versions and says so (``source``). The routing (each
token's top-k experts and weights, and the slots aligned per block size) is drawn once, outside the graphs.

Timing: each version of the step is one CUDA graph replayed by evotune's oracle with its clean L2 flush before every
sample (:meth:`evotune.measurement.oracle.Oracle.empty_l2`: the L2 emptied of the previous replay's weights and
written back, so every sample reads its weights from HBM, as a step of a model whose layers together exceed L2
does), the two versions in alternated rounds; each GEMM alone is timed the same way for the breakdown.
"""

from __future__ import annotations

import json
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from evotune.model.plan import DECODE_MAX_M, Family, Plan

#: the source of a GEMM the run decided nothing for: it runs untuned in both versions of the step
NO_DECISION = "no decision in the run: untuned in both"


@dataclass(frozen=True)
class StepGemm:
    """One GEMM of the step: what it is and how each version launches it. ``tuned``: the configuration the tuned
    step launches (None: it launches the untuned kernel, there being no decision); ``untuned``: the untuned step's
    configuration (None: cuBLAS); ``source``: where the tuned configuration was read."""

    name: str
    family: str  # Family.value: decode, gemm (dense, against cuBLAS) or fused_moe
    n: int
    k: int
    tuned: dict[str, Any] | None
    untuned: dict[str, int] | None
    source: str
    experts: int = 0
    top_k: int = 0


@dataclass
class GemmTiming:
    tuned_ms: float
    untuned_ms: float

    @property
    def ratio(self) -> float:
        return self.untuned_ms / self.tuned_ms


@dataclass
class StepTiming:
    """The whole step's medians and each GEMM's alone, with every sample kept."""

    step: GemmTiming
    gemms: list[GemmTiming]
    samples_ms: dict[str, list[float]] = field(default_factory=dict)


def moe_file(run: Path, experts: int, n_half: int, device: str | None) -> Path | None:
    """The run's vLLM fused-MoE file for ``experts`` and the intermediate size per shard ``n_half`` (bf16: no
    dtype in the name), the one for ``device`` (vLLM's spelling) when given and several are there."""
    from evotune.model.exports import ServerFileKind, device_part

    found = sorted(p for p in (run / "vllm").glob(f"E={experts},N={n_half},device_name=*.json")
                   if ",dtype=" not in p.name and ",block_shape=" not in p.name)
    if device is not None:
        mine = [p for p in found if p.name.endswith(f"device_name={device_part(device, ServerFileKind.VLLM_MOE)}.json")]
        found = mine or found
    return found[0] if found else None


def moe_configs(path: Path) -> dict[int, dict[str, int]]:
    """``{batch size: configuration}`` of a vLLM fused-MoE file (its ``triton_version`` left out)."""
    doc = json.loads(path.read_text())
    return {int(k): {f: int(v) for f, v in c.items()} for k, c in doc.items() if k.isdigit()}


def compose(plan: Plan, m: int, run: Path, device: str | None = None) -> list[StepGemm]:
    """The step's GEMMs at batch ``m`` in the layer's order, each with its tuned and untuned configuration: dense
    from ``run/tuned.json`` (the exact key only), the fused MoE from the run's vLLM file (the nearest batch size)."""
    from evotune.core.problem import Problem
    from evotune.reporting.lookup import lookup
    from search_spaces._triton_fused_moe import config_for, default_config

    tuned_json = run / "tuned.json"
    out = []
    # the layer's order: attention's projections (and a dense MLP) first, the experts after
    for kernel in sorted(plan.kernels, key=lambda k: k.shape.family is Family.FUSED_MOE):
        shape = kernel.shape
        if shape.family in (Family.DECODE, Family.GEMM):
            if not any(key.m == m for key in kernel.keys):
                continue
            decode = m <= DECODE_MAX_M
            problem = Problem.gemm(m, shape.n, shape.k, "bf16", "tn" if decode else "nn")
            space = "triton_decode_gemm" if decode else "matmul_example"
            config, source = None, f"{NO_DECISION} ({space} {problem.key})"
            if tuned_json.is_file():
                try:
                    with warnings.catch_warnings():  # a nearest key is not taken: its note is not wanted
                        warnings.simplefilter("ignore")
                        found = lookup(problem, space=space, path=tuned_json)
                except LookupError:
                    found = None
                if found is not None and found.exact:
                    config, source = dict(found.config), f"tuned.json {space} {problem.key}"
            out.append(StepGemm(", ".join(kernel.layers), shape.family.value, shape.n, shape.k, config, None,
                                source))
        elif shape.family is Family.FUSED_MOE:
            e, top_k, n_half = shape.experts, shape.top_k, shape.n // 2
            default = default_config(m, e)
            path = moe_file(run, e, n_half, device)
            configs = moe_configs(path) if path is not None else {}
            if configs:
                nearest = min(configs, key=lambda b: abs(b - m))
                tuned: dict[str, Any] | None = config_for(m, e, configs)
                source = f"vllm/{path.name if path else ''} batch size {nearest}"
            else:
                tuned, source = None, f"{NO_DECISION} (no vllm/E={e},N={n_half},device_name=*.json)"
            # gate-up: (tokens x top_k, 2 x intermediate) from the hidden state; down: the activated half back
            out.append(StepGemm("experts.gate_up", shape.family.value, shape.n, shape.k, tuned, default, source, e,
                                top_k))
            out.append(StepGemm("experts.down", shape.family.value, shape.k, n_half, tuned, default, source, e,
                                top_k))
    return out


# -- on the GPU ------------------------------------------------------------------------------------------------
Launch = Callable[[], object]


def launches(gemms: list[StepGemm], m: int, device: str = "cuda", dtype: str = "bfloat16"
             ) -> list[tuple[Launch, Launch]]:
    """(tuned, untuned) launch of each GEMM on fresh inputs of ``dtype`` on ``device`` (the CPU under Triton's
    interpreter, which computes float16 but not bfloat16),
    each tuned launch checked first: a dense one against cuBLAS, a fused-MoE one against the untuned
    configuration's output and both against torch on the first slots."""
    import torch

    from search_spaces import _triton_fused_moe as moe

    dt = getattr(torch, dtype)
    out: list[tuple[Launch, Launch]] = []
    routed: dict[tuple[int, ...], Any] = {}  # per MoE layer: the routing and the gate-up's activated output
    for g in gemms:
        if g.family != Family.FUSED_MOE.value:
            x = torch.randn(m, g.k, device=device, dtype=dt)
            w = torch.randn(g.n, g.k, device=device, dtype=dt) / g.k**0.5  # (N, K): the layer's weight
            c = torch.empty(m, g.n, device=device, dtype=dt)
            out.append(_dense(g, m, x, w, c))
            torch.testing.assert_close(c, x @ w.t(), rtol=2e-2, atol=2e-2)  # the tuned launch's output
            continue
        key = (g.experts, g.top_k)
        if g.name == "experts.gate_up":
            x = torch.randn(m, g.k, device=device, dtype=dt)
            gate = torch.randn(g.k, g.experts, device=device, dtype=dt)
            w = (torch.randn(g.experts, g.n, g.k, device=device) / g.k**0.5).to(dt)
            weights, ids = moe.route(x, gate, g.top_k)
            scale = torch.ones_like(weights)  # the routing weights are applied by the down GEMM, as vLLM does
            a, top_k = x, g.top_k
            routed[key] = (weights, ids)
        else:
            weights, ids = routed[key]
            inter = routed[(*key, 0)]
            w = (torch.randn(g.experts, g.n, g.k, device=device) / g.k**0.5).to(dt)
            # each slot (token, j) one row of top_k = 1, as vLLM's second GEMM reads the intermediate cache
            a, top_k, ids, scale = inter, 1, ids.reshape(-1, 1), weights.reshape(-1, 1)
        runs = []
        for config in (g.tuned if g.tuned is not None else g.untuned, g.untuned):
            grid, args, kwargs = moe.make_launch(a, w, scale, ids, top_k)
            runs.append((lambda grid=grid, args=args, kwargs=kwargs, config=config:
                         moe.moe_gemm_kernel[grid](*args, **kwargs, **dict(config or {})), args[2]))
        for run, _ in runs:
            run()
        (tuned, c_tuned), (untuned, c_untuned) = runs
        torch.testing.assert_close(c_tuned, c_untuned, rtol=2e-2, atol=2e-2)
        flat = ids.flatten()
        for s in range(min(4, flat.numel())):
            want = (a[s // top_k].float() @ w[flat[s]].float().T) * scale.flatten()[s]
            torch.testing.assert_close(c_untuned[s].float(), want, rtol=2e-2, atol=2e-2)
        if g.name == "experts.gate_up":  # SiLU(gate) x up: the down GEMM's input
            half = g.n // 2
            routed[(*key, 0)] = (torch.nn.functional.silu(c_untuned[:, :half].float())
                                  * c_untuned[:, half:].float()).to(dt)
        out.append((tuned, untuned))
    return out


def _dense(g: StepGemm, m: int, x: Any, w: Any, c: Any) -> tuple[Launch, Launch]:
    """(tuned, untuned) of a dense GEMM ``c = x w^T``; the tuned one launched once."""
    import torch

    from evotune.core.problem import Problem
    from search_spaces import _triton_decode, _triton_matmul_example

    def untuned() -> object:
        return torch.matmul(x, w.t(), out=c)

    tuned: Launch = untuned
    if g.tuned is not None and g.family == Family.DECODE.value:
        launch = _triton_decode.launcher(dict(g.tuned), Problem.gemm(m, g.n, g.k, "bf16", "tn"))[0]
        wt = w.t()  # the (N, K) weight's K-contiguous view: the decode kernel's operand

        def tuned() -> object:
            return launch(x, wt, c)
    elif g.tuned is not None:
        b = w.t().contiguous()  # (K, N) row-major: the GEMM kernel's layout
        grid = _triton_matmul_example.grid(m, g.n)
        kernel, cfg = _triton_matmul_example.matmul_space_plain, dict(g.tuned)
        launch_args = _triton_matmul_example.launch_args(x, b, c)

        def tuned() -> object:
            return kernel[grid](*launch_args, **cfg)
    tuned()
    return tuned, untuned


class Timer(Protocol):
    """What times the step: :class:`evotune.measurement.oracle.Oracle` on the GPU."""

    def warm(self, fn: Launch) -> None: ...

    def round(self, fn: Launch, n: int) -> list[float]: ...


def time_step(pairs: list[tuple[Launch, Launch]], rounds: int, per_round: int,
              timer: Timer | None = None) -> StepTiming:
    """The step (every GEMM, in order, one graph) tuned and untuned, and each GEMM alone, by evotune's oracle with
    the clean L2 flush before every sample (or ``timer``), tuned and untuned alternated each round; medians of all
    samples."""
    if timer is None:
        from evotune.measurement.options import TimingOptions
        from evotune.measurement.oracle import Oracle

        timer = Oracle(TimingOptions(flush="clean"))
    oracle = timer

    def both(tuned: Launch, untuned: Launch, label: str, samples: dict[str, list[float]]) -> GemmTiming:
        for fn in (tuned, untuned):
            oracle.warm(fn)
        got: dict[str, list[float]] = {"tuned": [], "untuned": []}
        for _ in range(rounds):  # alternated: a clock or thermal drift reaches both
            got["tuned"] += oracle.round(tuned, per_round)
            got["untuned"] += oracle.round(untuned, per_round)
        for name, v in got.items():
            samples[f"{label} {name}"] = v
        return GemmTiming(statistics.median(got["tuned"]), statistics.median(got["untuned"]))

    def whole(i: int) -> Launch:
        def step() -> None:
            for pair in pairs:
                pair[i]()
        return step

    samples: dict[str, list[float]] = {}
    step = both(whole(0), whole(1), "step", samples)
    gemms = [both(t, u, f"gemm{i}", samples) for i, (t, u) in enumerate(pairs)]
    return StepTiming(step, gemms, samples)

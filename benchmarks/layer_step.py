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

Against the memory: what each GEMM must move at the batch (:meth:`StepGemm.bytes`: its input, the weights it
touches, a fused MoE's only those of the experts the routing drawn hits, and its output) and the whole step's sum
are each read by ``benchmarks/read_ceiling.py``'s plain read (``torch.sum`` and its Triton read's sweep, the
fastest counting), timed the same way (the oracle, the clean flush, the rounds). A time as % of its read (100: as
fast as reading the bytes and nothing else) says how much is left to gain; ``untuned / read`` is the most any tuning
can gain on the untuned kernel: ``untuned / tuned`` cannot exceed it unless the tuned kernel outruns the plain read.
"""

from __future__ import annotations

import json
import statistics
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from read_ceiling import PlainRead, fastest_read

from evotune.model.plan import DECODE_MAX_M, Family, Plan

#: the source of a GEMM the run decided nothing for: it runs untuned in both versions of the step
NO_DECISION = "no decision in the run: untuned in both"
#: the names of a MoE layer's two expert GEMMs in the step
GATE_UP, DOWN = "experts.gate_up", "experts.down"
#: why a step's time is not set against a plain read (the plain read is not timed on the CPU)
READ_NOT_MEASURED = ("not measured: the plain read is timed on the GPU only (under Triton's interpreter it says "
                     "nothing of the memory's bandwidth)")


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

    def bytes(self, m: int, itemsize: int, experts_hit: int | None = None) -> int:
        """The bytes the GEMM must move at batch ``m``, ``itemsize`` bytes an element: its input, the weights it
        touches and its output, each once. A dense GEMM reads its whole (N, K) weight; a fused-MoE GEMM the
        weights of the ``experts_hit`` experts the routing sends a token to (the others' blocks are not
        launched), its gate-up each token's row once for its top-k experts, its down one row per (token, expert)
        slot, both writing one row per slot. The routing's indices and weights (a few bytes a token) are left
        out."""
        if self.family != Family.FUSED_MOE.value:
            return (m * self.k + self.n * self.k + m * self.n) * itemsize
        if experts_hit is None or not 0 < experts_hit <= self.experts:
            raise ValueError(f"{self.name}: experts_hit must be 1 to {self.experts}, got {experts_hit}")
        slots = m * self.top_k
        rows_in = m if self.name == GATE_UP else slots
        return (rows_in * self.k + experts_hit * self.n * self.k + slots * self.n) * itemsize


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
            out.append(StepGemm(GATE_UP, shape.family.value, shape.n, shape.k, tuned, default, source, e,
                                top_k))
            out.append(StepGemm(DOWN, shape.family.value, shape.k, n_half, tuned, default, source, e,
                                top_k))
    return out


# -- on the GPU ------------------------------------------------------------------------------------------------
Launch = Callable[[], object]


@dataclass(frozen=True)
class StepLaunch:
    """One GEMM of the step on its inputs: its tuned and untuned launch, the bytes it must move
    (:meth:`StepGemm.bytes`) and, for a fused-MoE GEMM, how many experts the routing drawn sends a token to."""

    tuned: Launch
    untuned: Launch
    bytes: int
    experts_hit: int = 0


def launches(gemms: list[StepGemm], m: int, device: str = "cuda", dtype: str = "bfloat16") -> list[StepLaunch]:
    """The launches of each GEMM on fresh inputs of ``dtype`` on ``device`` (the CPU under Triton's
    interpreter, which computes float16 but not bfloat16),
    each tuned launch checked first: a dense one against cuBLAS, a fused-MoE one against the untuned
    configuration's output and both against torch on the first slots."""
    import torch

    from search_spaces import _triton_fused_moe as moe

    dt = getattr(torch, dtype)
    out: list[StepLaunch] = []
    routed: dict[tuple[int, ...], Any] = {}  # per MoE layer: the routing and the gate-up's activated output
    for g in gemms:
        if g.family != Family.FUSED_MOE.value:
            x = torch.randn(m, g.k, device=device, dtype=dt)
            w = torch.randn(g.n, g.k, device=device, dtype=dt) / g.k**0.5  # (N, K): the layer's weight
            c = torch.empty(m, g.n, device=device, dtype=dt)
            out.append(StepLaunch(*_dense(g, m, x, w, c), g.bytes(m, dt.itemsize)))
            torch.testing.assert_close(c, x @ w.t(), rtol=2e-2, atol=2e-2)  # the tuned launch's output
            continue
        key = (g.experts, g.top_k)
        if g.name == GATE_UP:
            x = torch.randn(m, g.k, device=device, dtype=dt)
            gate = torch.randn(g.k, g.experts, device=device, dtype=dt)
            w = (torch.randn(g.experts, g.n, g.k, device=device) / g.k**0.5).to(dt)
            weights, ids = moe.route(x, gate, g.top_k)
            scale = torch.ones_like(weights)  # the routing weights are applied by the down GEMM, as vLLM does
            a, top_k = x, g.top_k
            routed[key] = (weights, ids)
        else:
            weights, ids = routed[key]  # the gate-up's routing: the same experts hit
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
        if g.name == GATE_UP:  # SiLU(gate) x up: the down GEMM's input
            half = g.n // 2
            routed[(*key, 0)] = (torch.nn.functional.silu(c_untuned[:, :half].float())
                                  * c_untuned[:, half:].float()).to(dt)
        hit = int(routed[key][1].unique().numel())
        out.append(StepLaunch(tuned, untuned, g.bytes(m, dt.itemsize, hit), hit))
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


def clean_oracle() -> Timer:
    """evotune's oracle with its clean L2 flush before every sample: what times the step, its GEMMs and their
    reads."""
    from evotune.measurement.options import TimingOptions
    from evotune.measurement.oracle import Oracle

    return Oracle(TimingOptions(flush="clean"))


def _rounds(timer: Timer, fns: list[Launch], rounds: int, per_round: int) -> list[list[float]]:
    """The samples of each of ``fns``: each warmed up, then ``rounds`` rounds of ``per_round`` samples of each in
    turn (a clock or thermal drift reaches all of them)."""
    for fn in fns:
        timer.warm(fn)
    got: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, samples in zip(fns, got, strict=True):
            samples += timer.round(fn, per_round)
    return got


def time_step(pairs: list[tuple[Launch, Launch]], rounds: int, per_round: int,
              timer: Timer | None = None) -> StepTiming:
    """The step (every GEMM, in order, one graph) tuned and untuned, and each GEMM alone, by evotune's oracle with
    the clean L2 flush before every sample (or ``timer``), tuned and untuned alternated each round; medians of all
    samples."""
    oracle = timer if timer is not None else clean_oracle()

    def both(tuned: Launch, untuned: Launch, label: str, samples: dict[str, list[float]]) -> GemmTiming:
        got = dict(zip(("tuned", "untuned"), _rounds(oracle, [tuned, untuned], rounds, per_round), strict=True))
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


def read_sizes(steps: list[StepLaunch]) -> list[int]:
    """The bytes each GEMM must move, then the whole step's: the plain reads the step is set against."""
    return [s.bytes for s in steps] + [sum(s.bytes for s in steps)]


def time_reads(sizes: list[int], rounds: int, per_round: int, timer: Timer | None = None, device: str = "cuda",
               sms: int | None = None) -> list[PlainRead]:
    """The fastest plain read of each of ``sizes`` (bytes): ``benchmarks/read_ceiling.py``'s reads (``torch.sum``
    and its Triton read's sweep), each timed as the step is: by ``timer`` (the oracle with its clean L2 flush
    before every sample), warmed up, ``rounds`` rounds of ``per_round`` samples, the median."""
    oracle = timer if timer is not None else clean_oracle()

    def median(fn: Launch) -> float:
        (samples,) = _rounds(oracle, [fn], rounds, per_round)
        return statistics.median(samples)

    return [fastest_read(nbytes, median, device, sms) for nbytes in sizes]


@dataclass(frozen=True)
class AgainstRead:
    """A GEMM's or the whole step's times set against a plain read of the bytes it must move, timed the same way
    (``read`` None: not measured, :data:`READ_NOT_MEASURED`)."""

    bytes: int
    timing: GemmTiming
    read: PlainRead | None

    @property
    def tuned_pct_of_read(self) -> float | None:
        """The tuned time as % of the read's: 100 is as fast as reading the bytes and nothing else."""
        return None if self.read is None else 100 * self.timing.tuned_ms / self.read.ms

    @property
    def untuned_over_read(self) -> float | None:
        """The most any kernel moving these bytes could gain on the untuned one: untuned ms / read ms (the
        bound of ``untuned / tuned``)."""
        return None if self.read is None else self.timing.untuned_ms / self.read.ms

    def fields(self) -> dict[str, Any]:
        """What ``decode_step.json`` holds of it."""
        out: dict[str, Any] = {
            "bytes": self.bytes, "read_ms": None if self.read is None else self.read.ms,
            "read": None if self.read is None else asdict(self.read), "tuned_pct_of_read": self.tuned_pct_of_read,
            "untuned_over_read": self.untuned_over_read}
        if self.read is None:
            out["read_note"] = READ_NOT_MEASURED
        return out


def step_record(m: int, gemms: list[StepGemm], steps: list[StepLaunch], timing: StepTiming,
                reads: list[PlainRead] | None) -> dict[str, Any]:
    """Batch ``m``'s record, as ``decode_step.json`` holds it: the step's tuned and untuned ms, their ratio, its
    bytes against its plain read; each GEMM the same, with its configurations, their source and (a fused-MoE
    GEMM) the experts hit; every sample. ``reads``: the plain read of each of :func:`read_sizes` (None: not
    measured)."""
    sizes = read_sizes(steps)
    against = [AgainstRead(nbytes, t, None if reads is None else reads[i])
               for i, (nbytes, t) in enumerate(zip(sizes, [*timing.gemms, timing.step], strict=True))]
    layers = []
    for g, s, a in zip(gemms, steps, against[:-1], strict=True):
        layers.append({"layers": g.name, "family": g.family, "N": g.n, "K": g.k, "config": g.tuned,
                       "untuned_config": g.untuned, "source": g.source, "tuned_ms": a.timing.tuned_ms,
                       "untuned_ms": a.timing.untuned_ms, "ratio": a.timing.ratio, **a.fields(),
                       **({"experts_hit": s.experts_hit} if g.family == Family.FUSED_MOE.value else {})})
    step = against[-1]
    return {"m": m, "tuned_ms": step.timing.tuned_ms, "untuned_ms": step.timing.untuned_ms,
            "ratio": step.timing.ratio, **step.fields(), "layers": layers, "samples_ms": timing.samples_ms}

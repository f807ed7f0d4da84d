"""A model's serving kernels at one tensor parallelism, and the keys each is tuned for.

Per decoder layer, sharded as vLLM shards it (column-parallel layers split N by ``tp``, row-parallel ones split K):

* dense linear layers (``y = x W^T``, N x K per shard): ``qkv_proj`` (N = (heads + 2 kv_heads) x head_dim / tp;
  key/value heads are replicated when tp exceeds them), ``o_proj`` (K = heads x head_dim / tp), ``gate_up_proj``
  (N = 2 x intermediate / tp), ``down_proj`` (K = intermediate / tp); with latent attention (DeepSeek) ``q_a_proj``
  and ``kv_a_proj`` (replicated), ``q_b_proj``, ``kv_b_proj``, ``o_proj``; an MoE model's dense MLPs are its
  shared experts and its leading dense layers. A GEMM is tuned with the decode family (``triton_decode_gemm``; fp8
  scaled per tensor) at M <= 64 and the GEMM family (``triton_matmul``) above; an fp8 model quantized in blocks
  (``weight_block_size``, as DeepSeek-V3 ships) goes to the block-fp8 family (``triton_block_fp8``, 128 x 128
  weight scale blocks) at every M, whose configurations vLLM reads from its ``N=..,K=..`` files.
* the fused MoE (``fused_moe``): one configuration per batch size for both of its GEMMs (vLLM's file is per
  (E, N)); tuned at the gate-and-up GEMM, E experts, top-k, N = 2 x expert intermediate / tp, K = hidden.

Layers of one shape share their keys (one (family, N, K) is tuned once). The batch sizes are vLLM's
(:data:`VLLM_BATCH_SIZES`) unless given.

The estimate (:func:`estimate`) gives each kernel's GPU time on one GPU, evotune's beside the grid's. evotune's is
its measured wall clock a key (:data:`KEY_S` at the default budget, in proportion to ``budget``; a grid smaller than
the budget is timed whole): its evaluations, the builds side by side with them, the confirmation. The grid's, run
the way vLLM's benchmarks run it, is every configuration of the family's space timed at every key, :data:`EVAL_S`
each, plus each configuration built once per kernel shape, :data:`BUILD_S` each, one after another.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from evotune.model.models import ModelError, ModelSpec

VLLM_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
DECODE_MAX_M = 64  # the decode family's rows
DTYPES = ("bf16", "fp8", "int8")
FP8_BLOCK = (128, 128)
#: GPU seconds of one evaluation: ~100 ms of sampling (the oracle's cap per configuration), warm-up launches, the
#: CUDA graph's capture, the inputs' reset; vLLM's benchmark_moe times each configuration for about as long
EVAL_S = 0.2
#: seconds to build one configuration of a Triton kernel (compile and load), once per kernel shape
BUILD_S = 1.5
#: evaluations a key (autotune's default budget)
DEFAULT_BUDGET = 64
#: wall seconds of one key on one GPU at the default budget: on one H200 the 54 keys of Mixtral-8x7B at tp 2 (fused
#: MoE, decode and GEMM keys) took 292.5 s, 283.5 s of it after the start below: its keys held the GPU 268 s, 5.0 s
#: a key, and a quarter of a second went between keys (benchmarks/RESULTS.md, "One, two and four GPUs")
KEY_S = 5.2
#: a run's seconds before its first key on that H200: the workers' server's imports, a worker's CUDA context
START_S = 9.0


class Family(enum.Enum):
    """The kernel family a key is tuned with; ``grid``: its full configuration space (vLLM's benchmark grids for
    the two kernels vLLM tunes: ``benchmark_moe.py`` 5x4x3x4x2x4, ``benchmark_w8a8_block_fp8.py`` 5x4x2x4x2x4;
    the evotune spaces' products for the GEMMs vLLM leaves to cuBLAS)."""

    DECODE = "triton_decode_gemm"
    GEMM = "triton_matmul"
    BLOCK_FP8 = "triton_block_fp8"
    FUSED_MOE = "fused_moe"

    @property
    def grid(self) -> int:
        return {"triton_decode_gemm": 16200, "triton_matmul": 19200, "triton_block_fp8": 1280,
                "fused_moe": 1920}[self.value]

    @property
    def untuned(self) -> str:
        """What an untuned server runs for this kernel, the baseline of the report's ratio."""
        return "vLLM default config" if self in (Family.BLOCK_FP8, Family.FUSED_MOE) else "cuBLAS"


@dataclass(frozen=True)
class Shape:
    """One tuned kernel shape: a family at (N, K), and for the fused MoE its experts."""

    family: Family
    n: int
    k: int
    experts: int = 0
    top_k: int = 0

    @property
    def name(self) -> str:
        if self.family is Family.FUSED_MOE:
            return f"fused_moe E={self.experts} top_k={self.top_k} N={self.n} K={self.k}"
        return f"{self.family.value} N={self.n} K={self.k}"


@dataclass(frozen=True)
class Key:
    """One key to tune: a shape at batch size M."""

    shape: Shape
    m: int

    @property
    def ident(self) -> str:
        """The key's name in the claims and the run's record."""
        return f"{self.shape.name} M={self.m}"

    def fields(self) -> dict[str, int]:
        out = {"M": self.m, "N": self.shape.n, "K": self.shape.k}
        if self.shape.family is Family.FUSED_MOE:
            out.update(E=self.shape.experts, top_k=self.shape.top_k)
        return out


@dataclass
class Kernel:
    """A shape, the model's layers that run it, and its keys in increasing batch size (transfer's order)."""

    shape: Shape
    layers: list[str]
    keys: list[Key] = field(default_factory=list)


@dataclass
class Plan:
    model: ModelSpec
    tp: int
    dtype: str
    batch_sizes: tuple[int, ...]
    kernels: list[Kernel]

    @property
    def ident(self) -> str:
        """The run's name in the storage: the model, tp and dtype (two runs of one plan share their record)."""
        return f"tune-model/{self.model.name}/tp{self.tp}/{self.dtype}"

    @property
    def keys(self) -> list[Key]:
        return [k for kernel in self.kernels for k in kernel.keys]


@dataclass(frozen=True)
class Estimate:
    keys: int
    evaluations: int
    gpu_s: float
    grid_evaluations: int
    grid_gpu_s: float


def estimate_kernel(kernel: Kernel, budget: int) -> Estimate:
    per_key = min(budget, kernel.shape.family.grid)
    n = len(kernel.keys)
    grid = kernel.shape.family.grid
    return Estimate(n, per_key * n, n * KEY_S * per_key / DEFAULT_BUDGET, grid * n, grid * (n * EVAL_S + BUILD_S))


def estimate(plan: Plan, budget: int) -> Estimate:
    parts = [estimate_kernel(k, budget) for k in plan.kernels]
    return Estimate(sum(p.keys for p in parts), sum(p.evaluations for p in parts), sum(p.gpu_s for p in parts),
                    sum(p.grid_evaluations for p in parts), sum(p.grid_gpu_s for p in parts))


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``vllm`` or a comma-separated list of positive integers; :class:`ModelError` naming ``--batch-sizes``."""
    if text == "vllm":
        return VLLM_BATCH_SIZES
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ModelError(f"--batch-sizes: expected vllm or positive integers separated by commas, got {text!r}")
    return tuple(sorted({int(p) for p in parts}))


def scaling_of(family: Family, dtype: str) -> str:
    """How a dense family's fp8 operands are scaled: per 128 x 128 weight block (block-fp8), per tensor (the decode
    family), or not at all (the GEMM family's fp8 product; any 16-bit key)."""
    if family is Family.BLOCK_FP8:
        return "block"
    return "tensor" if dtype == "fp8" and family is Family.DECODE else ""


def parse_kernels(text: str) -> frozenset[Family] | None:
    """``all`` (None) or families by name separated by commas; :class:`ModelError` naming ``--kernels``."""
    if text == "all":
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = {f.value: f for f in Family}
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise ModelError(f"--kernels: expected all or families of {', '.join(known)} separated by commas, got "
                         f"{text!r}")
    return frozenset(known[n] for n in names)


def only(plan: Plan, families: frozenset[Family] | None) -> Plan:
    """``plan`` with the kernels of ``families`` alone (None: every kernel); :class:`ModelError` when none is
    left."""
    if families is None:
        return plan
    kept = [k for k in plan.kernels if k.shape.family in families]
    if not kept:
        raise ModelError(f"--kernels: {plan.model.name} at tp {plan.tp}, {plan.dtype}, has no kernel of "
                         f"{', '.join(sorted(f.value for f in families))}")
    return replace(plan, kernels=kept)


def _divides(tp: int, value: int, what: str, model: ModelSpec) -> int:
    if value % tp:
        raise ModelError(f"--tp {tp}: does not divide {what} {value} ({model.source})")
    return value // tp


def make_plan(model: ModelSpec, tp: int, dtype: str | None = None, batch_sizes: Sequence[int] = VLLM_BATCH_SIZES,
              ) -> Plan:
    """The kernels and keys of ``model`` at tensor parallelism ``tp``; :class:`ModelError` for a ``tp`` that does
    not divide the heads or an intermediate size, or an unknown dtype."""
    if tp < 1:
        raise ModelError(f"--tp: expected an integer >= 1, got {tp}")
    dtype = dtype or model.default_dtype
    if dtype not in DTYPES:
        raise ModelError(f"--dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    heads = _divides(tp, model.heads, "num_attention_heads", model)
    layers: list[tuple[str, int, int]] = []  # (layer, N, K) of the dense GEMMs of one shard
    h = model.hidden_size
    if model.latent is not None:
        lat = model.latent
        qk = lat.qk_nope_head_dim + lat.qk_rope_head_dim
        if lat.q_lora_rank is None:
            layers.append(("q_proj", heads * qk, h))
        else:
            layers += [("q_a_proj", lat.q_lora_rank, h), ("q_b_proj", heads * qk, lat.q_lora_rank)]
        layers += [("kv_a_proj", lat.kv_lora_rank + lat.qk_rope_head_dim, h),
                   ("kv_b_proj", heads * (lat.qk_nope_head_dim + lat.v_head_dim), lat.kv_lora_rank),
                   ("o_proj", h, heads * lat.v_head_dim)]
    else:
        if tp <= model.kv_heads:
            kv = _divides(tp, model.kv_heads, "num_key_value_heads", model)
        elif tp % model.kv_heads:
            raise ModelError(f"--tp {tp}: num_key_value_heads {model.kv_heads} does not divide it, so the key and "
                             f"value heads cannot be replicated evenly ({model.source})")
        else:
            kv = 1
        layers += [("qkv_proj", (heads + 2 * kv) * model.head_dim, h), ("o_proj", h, heads * model.head_dim)]
    ex = model.experts
    if ex is None or ex.dense_layers:
        inter = _divides(tp, model.intermediate_size, "intermediate_size", model)
        prefix = "dense_" if ex is not None else ""
        layers += [(f"{prefix}gate_up_proj", 2 * inter, h), (f"{prefix}down_proj", h, inter)]
    kernels: dict[Shape, Kernel] = {}
    if ex is not None:
        inter = _divides(tp, ex.intermediate_size, "moe_intermediate_size" if model.intermediate_size !=
                         ex.intermediate_size else "intermediate_size", model)
        if ex.shared:
            shared = ex.shared * ex.intermediate_size
            s = _divides(tp, shared, "n_shared_experts x moe_intermediate_size", model)
            layers += [("shared_experts.gate_up_proj", 2 * s, h), ("shared_experts.down_proj", h, s)]
        shape = Shape(Family.FUSED_MOE, 2 * inter, h, ex.routed, ex.top_k)
        kernels[shape] = Kernel(shape, ["experts (gate_up and down)"])
    for name, n, k in layers:
        # a block-quantized checkpoint's linear layers run vLLM's block-fp8 kernel at every M; fp8 scaled per tensor
        # (or 16-bit, int8) runs the decode family up to DECODE_MAX_M, the GEMM family above
        block = dtype == "fp8" and model.fp8_block is not None
        families = [Family.BLOCK_FP8] if block else [Family.DECODE, Family.GEMM]
        for fam in families:
            if fam is Family.DECODE and not any(m <= DECODE_MAX_M for m in batch_sizes):
                continue
            if fam is Family.GEMM and not any(m > DECODE_MAX_M for m in batch_sizes):
                continue
            shape = Shape(fam, n, k)
            kernels.setdefault(shape, Kernel(shape, [])).layers.append(name)
    for kernel in kernels.values():
        fam = kernel.shape.family
        kernel.keys = [Key(kernel.shape, m) for m in batch_sizes
                       if (fam is not Family.DECODE or m <= DECODE_MAX_M) and (fam is not Family.GEMM
                                                                              or m > DECODE_MAX_M)]
    return Plan(model, tp, dtype, tuple(batch_sizes), list(kernels.values()))

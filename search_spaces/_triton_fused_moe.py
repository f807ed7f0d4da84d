"""The fused-MoE grouped GEMM ``tune-model`` tunes, and its launch: a plain ``@triton.jit`` kernel as vLLM writes
its own, vLLM's configuration grid as its space, torch routing and a torch reference.

``moe_gemm_kernel`` is launched with its configuration as keyword arguments (:func:`invoke_moe_gemm`:
``BLOCK_SIZE_M=..., num_warps=...``, the configuration a caller reads from vLLM's JSON files, :func:`config_for`).
Routing is torch: the top-k experts of each token (softmax over a gate), the token slots sorted by expert and each
expert's run padded to a multiple of the block size (vLLM's ``moe_align_block_size``). The GEMM is Triton: each
program multiplies one ``BLOCK_SIZE_M`` block of sorted slots (all of one expert) by that expert's weight, scales
each row by its routing weight and writes it to the slot's row; torch then sums each token's ``top_k`` rows.

fp8 (``FP8``, vLLM's ``fp8_w8a8``): e4m3 activations and weights, one scale for the activations and one per expert's
weights (per tensor), applied to each tile's fp32 product before the routing weight; or, with ``SCALE_BLOCK``
(128, as DeepSeek-V3 ships), one scale per row and 128 columns of the activations and one per 128 x 128 tile of
each expert's weights, applied to each K step's product (a K step lies in one scale group: ``BLOCK_SIZE_K`` at
most the block). The output is bf16 (:func:`make_args` with ``dtype="float8_e4m3fn"`` quantizes bf16 inputs,
:func:`dequantized` gives what they stand for).

The padding depends on ``BLOCK_SIZE_M``, a tuned parameter, so the launch carries the alignment for every
``BLOCK_SIZE_M`` of the space and the kernel reads its own (``align_all``): each configuration runs exactly what
vLLM would run for it.

``SPACE`` is vLLM's grid of ``benchmarks/kernels/benchmark_moe.py`` (``get_configs_compute_bound``: 5 x 4 x 3 x 4
x 2 x 4 = 1,920 configurations) with named constraints that read the launch (``ctx.args``, as
``evotune.autotune`` gives it): tiles no larger than the problem, shared memory of the pipeline stages, accumulator
registers per thread, and ``BLOCK_SIZE_M`` against the tokens an expert gets on average. The key is vLLM's (the
number of tokens ``M``, with ``N``, ``K``, ``E``). It is not a ``Problem`` space (its constraints read a launch),
so the module is private: ``examples/triton_autotune/fused_moe.py`` shows it under ``evotune.autotune``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import Context, SearchSpace, constraint, ordinal

BLOCK_M_CHOICES = (16, 32, 64, 128, 256)
FP8_DTYPE = torch.float8_e4m3fn  # vLLM's fp8_w8a8
#: the widest tile ``block-m-over-tokens-per-expert`` prunes: a tile of 16 or 32 rows no wider than an expert's
#: average tokens splits the expert into several row blocks, each streaming its weight slice again (0.27-0.92 of the
#: best on vLLM's grid on an H100 and an H200 wherever it was so); from 64 rows on the split is left to the timing
NARROW_M = 32
#: shared memory a Hopper block may use (227 KiB); the compiled-kernel check catches what this model misses
SHARED_BYTES = 232_448


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def _launch(ctx: Context) -> Mapping[str, Any]:
    """The launch's arguments by name (``evotune.autotune`` gives its constraints a context that holds them)."""
    args: Mapping[str, Any] = getattr(ctx, "args", {})
    return args


def _tokens_per_expert(ctx: Context) -> float:
    args = _launch(ctx)
    return float(args["M"] * args["top_k"] / args["E"])


def _shared_bytes(p: Mapping[str, int], ctx: Context) -> int:
    """The shared memory Triton's pipeliner gives the A and B tiles on Hopper: ``num_stages`` buffers of each where
    the tile is issued as a warpgroup MMA (wgmma: 64 rows or more), one fewer where it falls back to mma.sync (16
    and 32 rows), as the compiler reported for every configuration of vLLM's grid on an H100 and an H200 (Triton
    3.6). Counting ``num_stages`` for every tile would prune configurations that fit (on an H200 at M = 64, the
    fastest of the grid)."""
    buffers = p["num_stages"] if p["BLOCK_SIZE_M"] >= 64 else p["num_stages"] - 1
    return int((p["BLOCK_SIZE_M"] + p["BLOCK_SIZE_N"]) * p["BLOCK_SIZE_K"] * _launch(ctx)["a"].element_size() * buffers)


SPACE = SearchSpace(
    "vllm_fused_moe",
    [ordinal("BLOCK_SIZE_M", BLOCK_M_CHOICES), ordinal("BLOCK_SIZE_N", (32, 64, 128, 256)),
     ordinal("BLOCK_SIZE_K", (64, 128, 256)), ordinal("GROUP_SIZE_M", (1, 16, 32, 64)),
     ordinal("num_warps", (4, 8)), ordinal("num_stages", (2, 3, 4, 5))],
    constraints=[
        constraint("block-n-within-n", lambda p, ctx: p["BLOCK_SIZE_N"] <= max(32, _pow2_at_least(_launch(ctx)["N"])),
                   "BLOCK_SIZE_N {BLOCK_SIZE_N} is larger than N rounded up to a power of two"),
        constraint("block-k-within-k", lambda p, ctx: p["BLOCK_SIZE_K"] <= max(64, _pow2_at_least(_launch(ctx)["K"])),
                   "BLOCK_SIZE_K {BLOCK_SIZE_K} is larger than K rounded up to a power of two"),
        constraint("block-m-vs-tokens-per-expert",
                   lambda p, ctx: p["BLOCK_SIZE_M"] <= max(16, 2 * _pow2_at_least(int(_tokens_per_expert(ctx)))),
                   "BLOCK_SIZE_M {BLOCK_SIZE_M} is over twice the tokens an expert gets on average: mostly padding"),
        constraint("block-m-over-tokens-per-expert",
                   lambda p, ctx: p["BLOCK_SIZE_M"] > min(NARROW_M, _tokens_per_expert(ctx)),
                   "BLOCK_SIZE_M {BLOCK_SIZE_M} is no more than the tokens an expert gets on average: each expert's "
                   "weights are streamed once a row block"),
        constraint("block-k-within-scale-block",
                   lambda p, ctx: p["BLOCK_SIZE_K"] <= (_launch(ctx).get("SCALE_BLOCK") or p["BLOCK_SIZE_K"]),
                   "BLOCK_SIZE_K {BLOCK_SIZE_K} spans more than one fp8 scale block along K"),
        constraint("accumulator-registers",
                   lambda p, ctx: p["BLOCK_SIZE_M"] * p["BLOCK_SIZE_N"] <= 128 * 32 * p["num_warps"],
                   "a {BLOCK_SIZE_M}x{BLOCK_SIZE_N} fp32 accumulator needs over 128 registers a thread with "
                   "{num_warps} warps"),
        constraint("shared-memory", lambda p, ctx: _shared_bytes(p, ctx) <= SHARED_BYTES,
                   "{num_stages} stages of {BLOCK_SIZE_M}x{BLOCK_SIZE_K} and {BLOCK_SIZE_K}x{BLOCK_SIZE_N} tiles "
                   "exceed the shared memory"),
    ],
    description="vLLM's fused-MoE config grid (benchmark_moe.py, get_configs_compute_bound)",
)


# not specialised on M: M only bounds the routed slots (``slots < M * top_k``), never an address or a tile, so a
# configuration built for one batch size is the binary for every other (specialised, Triton builds one for M = 1,
# one for multiples of 16 and one for the rest: three builds of every configuration a model's batch sizes try)
@triton.jit(do_not_specialize=["M"])
def moe_gemm_kernel(a, w, c, slot_ids, block_expert, align_offsets, weights, a_scale, w_scale, M, N, K, E,
                    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
                    top_k: tl.constexpr, FP8: tl.constexpr, SCALE_BLOCK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr,
                    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    # this BLOCK_SIZE_M's alignment: align_offsets holds (slot start, block start, padded slots) per choice
    if BLOCK_SIZE_M == 16:
        variant = 0
    elif BLOCK_SIZE_M == 32:
        variant = 1
    elif BLOCK_SIZE_M == 64:
        variant = 2
    elif BLOCK_SIZE_M == 128:
        variant = 3
    else:
        variant = 4
    slot_start = tl.load(align_offsets + 3 * variant)
    block_start = tl.load(align_offsets + 3 * variant + 1)
    padded = tl.load(align_offsets + 3 * variant + 2)

    pid = tl.program_id(0)
    num_m = (padded + BLOCK_SIZE_M - 1) // BLOCK_SIZE_M
    num_n = (N + BLOCK_SIZE_N - 1) // BLOCK_SIZE_N
    group = GROUP_SIZE_M * num_n
    first_m = (pid // group) * GROUP_SIZE_M
    size_m = tl.minimum(num_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m
    if pid_m * BLOCK_SIZE_M >= padded:
        return
    valid = M * top_k
    slots = tl.load(slot_ids + slot_start + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    live = slots < valid
    expert = tl.load(block_expert + block_start + pid_m)
    rows = slots // top_k
    rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    rk = tl.arange(0, BLOCK_SIZE_K)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    k_groups = (K + SCALE_BLOCK - 1) // SCALE_BLOCK if SCALE_BLOCK > 0 else 1
    n_groups = (N + SCALE_BLOCK - 1) // SCALE_BLOCK if SCALE_BLOCK > 0 else 1
    for k0 in range(0, (K + BLOCK_SIZE_K - 1) // BLOCK_SIZE_K):
        kk = k0 * BLOCK_SIZE_K + rk
        x = tl.load(a + rows[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=live[:, None] & (kk[None, :] < K), other=0.0)
        wt = tl.load(w + expert * stride_we + kk[:, None] * stride_wk + rn[None, :] * stride_wn,
                     mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        if FP8 and SCALE_BLOCK > 0:  # this K step lies in one scale group: its rows' and its columns' scales
            group = (k0 * BLOCK_SIZE_K) // SCALE_BLOCK
            sa = tl.load(a_scale + rows * k_groups + group, mask=live, other=0.0)
            sw = tl.load(w_scale + (expert * n_groups + rn // SCALE_BLOCK) * k_groups + group, mask=rn < N,
                         other=0.0)
            acc += tl.dot(x, wt) * sa[:, None] * sw[None, :]
        else:
            acc += tl.dot(x, wt)
    if FP8 and SCALE_BLOCK == 0:  # e4m3 scaled per tensor: the activations' scale and the expert's
        acc = acc * (tl.load(a_scale) * tl.load(w_scale + expert))
    acc = acc * tl.load(weights + slots, mask=live, other=0.0)[:, None]
    tl.store(c + slots[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c.dtype.element_ty),
             mask=live[:, None] & (rn[None, :] < N))


def route(x: torch.Tensor, gate: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids) of each token's top-k experts, each of shape (tokens, top_k)."""
    probs = torch.softmax(x.float() @ gate.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def align(ids: torch.Tensor, experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's moe_align_block_size: the token slots sorted by expert, each expert's run padded with the
    sentinel ``ids.numel()`` to a multiple of ``block``; and the expert of each block."""
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts).tolist()
    slots, owners, start = [], [], 0
    for e, n in enumerate(counts):
        padded = -(-n // block) * block
        run = torch.full((padded,), flat.numel(), dtype=torch.int32)
        run[:n] = order[start:start + n].to(torch.int32)
        slots.append(run)
        owners += [e] * (padded // block)
        start += n
    return torch.cat(slots), torch.tensor(owners, dtype=torch.int32)


def align_all(ids: torch.Tensor, experts: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[int, int]]:
    """The alignment for every BLOCK_SIZE_M choice, concatenated, with (slot start, block start, padded slots)
    per choice; and the padded slots of each choice, for the grid."""
    slots, owners, table, padded = [], [], [], {}
    s0 = b0 = 0
    for bm in BLOCK_M_CHOICES:
        s, o = align(ids, experts, bm)
        slots.append(s)
        owners.append(o)
        table += [s0, b0, len(s)]
        padded[bm] = len(s)
        s0, b0 = s0 + len(s), b0 + len(o)
    return (torch.cat(slots).to(device), torch.cat(owners).to(device),
            torch.tensor(table, dtype=torch.int32, device=device), padded)


def make_launch(x: torch.Tensor, w: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, top_k: int,
                scales: tuple[torch.Tensor, torch.Tensor] | None = None, block: int = 0):
    """(grid, args, kwargs) of one launch; the output (tokens x top_k, N) is args[2]. ``scales``: fp8 inputs'
    (the activations' one scale, each expert's weight scale: per tensor, as vLLM's ``fp8_w8a8`` MoE; with
    ``block``, one per row and ``block`` columns of the activations, one per ``block x block`` tile of each expert's
    weights, as DeepSeek-V3 ships them), the output then bf16."""
    tokens, k = x.shape
    experts, n, _ = w.shape
    slot_ids, block_expert, offsets, padded = align_all(ids, experts, x.device)
    c = torch.zeros(tokens * top_k, n, device=x.device, dtype=x.dtype if scales is None else torch.bfloat16)
    flat_w = weights.flatten().to(torch.float32)
    a_scale, w_scale = scales if scales is not None else (flat_w, flat_w)  # unread without FP8

    def grid(meta: dict[str, int]) -> tuple[int]:
        bm, bn = meta["BLOCK_SIZE_M"], meta["BLOCK_SIZE_N"]
        return (triton.cdiv(padded[bm], bm) * triton.cdiv(n, bn),)

    args = (x, w, c, slot_ids, block_expert, offsets, flat_w, a_scale, w_scale, tokens, n, k, experts,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1))
    return grid, args, {"top_k": top_k, "FP8": scales is not None, "SCALE_BLOCK": block if scales is not None else 0}


def default_config(M: int, E: int, block: int = 0) -> dict[str, int]:
    """vLLM's default configuration (``get_default_config`` of its fused MoE): what a server with no tuned file
    launches, and what a tuned one is timed against. A 16-bit or per-tensor fp8 MoE: 16 x 32 x 64 tiles, no
    grouping, while M is at most the number of experts (about a token an expert); 64 x 64 x 32 in groups of 8
    past that. Block-scaled fp8 (``block``): 64 rows, one scale block of N and of K, groups of 32. vLLM leaves
    ``num_warps`` and ``num_stages`` to Triton's defaults (4 and 3) except in the block-scaled case, which sets
    them to the same; they are written out because this kernel's launch passes them."""
    if block:
        return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": block, "BLOCK_SIZE_K": block, "GROUP_SIZE_M": 32,
                "num_warps": 4, "num_stages": 3}
    if M <= E:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                "num_stages": 3}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8, "num_warps": 4,
            "num_stages": 3}


def config_for(M: int, E: int, configs: dict[int, dict[str, int]] | None = None, block: int = 0) -> dict[str, int]:
    """The configuration for M tokens from a vLLM-style file's ``{batch size: config}`` (the batch size nearest
    M, as vLLM picks it; ``export-configs --format vllm-moe`` writes such files), else :func:`default_config`."""
    if not configs:
        return default_config(M, E, block)
    return dict(configs[min(configs, key=lambda b: abs(b - M))])


def invoke_moe_gemm(x: torch.Tensor, w: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, top_k: int,
                    config: dict[str, int], kernel=moe_gemm_kernel) -> torch.Tensor:
    """One launch of the plain kernel, its configuration passed as keyword arguments (as vLLM's
    ``invoke_fused_moe_kernel`` launches its kernel); the output (tokens x top_k, N)."""
    grid, args, kwargs = make_launch(x, w, weights, ids, top_k)
    kernel[grid](*args, **kwargs, **config)
    out: torch.Tensor = args[2]
    return out


def reference(x: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, top_k: int) -> torch.Tensor:
    weights, ids = route(x, gate, top_k)
    out = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float32, device=x.device)
    for j in range(top_k):
        for e in range(w.shape[0]):
            rows = ids[:, j] == e
            out[rows] += weights[rows, j, None] * (x[rows].float() @ w[e].float().T)
    return out.to(x.dtype)


def make_inputs(M: int, N: int, K: int, E: int, dtype: str = "float16",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded random (x, gate, w) of a key, on the GPU when there is one. Drawn where they live: a model's expert
    weights are a gigabyte or more, seconds of the CPU's generator before a key's first launch."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, dtype)
    x = torch.randn(M, K, generator=g, device=device).to(dt)
    gate = torch.randn(K, E, generator=g, device=device).to(dt)
    w = (torch.randn(E, N, K, generator=g, device=device) / K**0.5).to(dt)
    return x, gate, w


def quantize_fp8(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x in e4m3, its scale, w in e4m3, each expert's scale): per-tensor scales, the largest magnitude mapped to
    e4m3's largest (448), as vLLM's dynamic per-tensor quantization of an ``fp8_w8a8`` MoE."""
    top = torch.finfo(FP8_DTYPE).max
    a_scale = (x.float().abs().max() / top).clamp(min=1e-12).reshape(1)
    w_scale = (w.float().abs().amax(dim=(1, 2)) / top).clamp(min=1e-12)
    xq = (x.float() / a_scale).clamp(-top, top).to(FP8_DTYPE)
    wq = (w.float() / w_scale[:, None, None]).clamp(-top, top).to(FP8_DTYPE)
    return xq, a_scale, wq, w_scale


def quantize_fp8_blocks(x: torch.Tensor, w: torch.Tensor, block: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x in e4m3, a scale per row and ``block`` columns, w in e4m3, a scale per ``block x block`` tile of each
    expert): each group's largest magnitude mapped to e4m3's largest, as DeepSeek-V3's weights and vLLM's dynamic
    1 x 128 activation groups. N and K must be multiples of ``block``."""
    experts, n, k = w.shape
    if n % block or k % block:
        raise ValueError(f"N={n} and K={k} must be multiples of the scale block {block}")
    top = torch.finfo(FP8_DTYPE).max
    xg = x.float().reshape(x.shape[0], k // block, block)
    a_scale = (xg.abs().amax(dim=2) / top).clamp(min=1e-12)
    wg = w.float().reshape(experts, n // block, block, k // block, block)
    w_scale = (wg.abs().amax(dim=(2, 4)) / top).clamp(min=1e-12)
    xq = (xg / a_scale[:, :, None]).clamp(-top, top).reshape(x.shape).to(FP8_DTYPE)
    wq = (wg / w_scale[:, :, None, :, None]).clamp(-top, top).reshape(w.shape).to(FP8_DTYPE)
    return xq, a_scale.contiguous(), wq, w_scale.contiguous()


def dequantized(xq: torch.Tensor, a_scale: torch.Tensor, wq: torch.Tensor, w_scale: torch.Tensor,
                block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 values fp8 inputs stand for (scaled per tensor, or per ``block`` group): what an fp8 launch is
    checked against."""
    if not block:
        return xq.float() * a_scale, wq.float() * w_scale[:, None, None]
    xs = a_scale.repeat_interleave(block, dim=1)
    ws = w_scale.repeat_interleave(block, dim=1).repeat_interleave(block, dim=2)
    return xq.float() * xs, wq.float() * ws


def make_args(M: int, N: int, K: int, E: int, top_k: int = 2, dtype: str = "float16", seed: int = 0,
              block: int = 0):
    """A key's launch for ``tune-kernel`` (grid, args, kwargs), on :func:`make_inputs`; ``float8_e4m3fn``: bf16
    inputs routed, then quantized per tensor (:func:`quantize_fp8`) or, with ``block``, per block
    (:func:`quantize_fp8_blocks`)."""
    fp8 = dtype == str(FP8_DTYPE).removeprefix("torch.")
    x, gate, w = make_inputs(M, N, K, E, "bfloat16" if fp8 else dtype, seed)
    weights, ids = route(x, gate, top_k)
    if not fp8:
        return make_launch(x, w, weights, ids, top_k)
    xq, a_scale, wq, w_scale = quantize_fp8_blocks(x, w, block) if block else quantize_fp8(x, w)
    return make_launch(xq, wq, weights, ids, top_k, (a_scale, w_scale), block)


def make_vllm_args(M: int, N: int, K: int, E: int, top_k: int = 2, dtype: str = "float16", seed: int = 0):
    """A key's launch as a vLLM-style caller makes it for the plain kernel: :func:`make_args`'s, its keyword
    arguments holding the default configuration too (``tune-kernel`` drops it: the tuner chooses it)."""
    grid, args, kwargs = make_args(M, N, K, E, top_k, dtype, seed)
    return grid, args, {**kwargs, **default_config(M, E)}

"""A fused-MoE grouped GEMM tuned by ``evotune.autotune`` over vLLM's config grid, with a torch reference.

The kernel is written as vLLM writes its own: a plain ``@triton.jit`` kernel, ``moe_gemm_kernel`` (shipped
with evotune, as ``tune-model`` tunes it, in ``search_spaces/_triton_fused_moe.py`` with its launch helpers and
space; this file imports them), launched with its configuration as keyword arguments
(:func:`invoke_moe_gemm`: ``BLOCK_SIZE_M=..., num_warps=...``, the configuration a caller reads from vLLM's JSON
files, :func:`config_for`). It is tuned without editing it: ``moe_gemm_tuned`` is ``evotune.autotune(...)``
applied to it, and ``tune-kernel`` takes the plain kernel with ``--space`` and ``--key``.

Routing is torch: the top-k experts of each token (softmax over a gate), the token
slots sorted by expert and each expert's run padded to a multiple of the block size
(vLLM's ``moe_align_block_size``). The GEMM is Triton: each program multiplies one
``BLOCK_SIZE_M`` block of sorted slots (all of one expert) by that expert's weight,
scales each row by its routing weight and writes it to the slot's row; torch then
sums each token's ``top_k`` rows.

The padding depends on ``BLOCK_SIZE_M``, a tuned parameter, so the launch carries
the alignment for every ``BLOCK_SIZE_M`` of the space and the kernel reads its own
(``align_all``): each configuration runs exactly what vLLM would run for it.

The space is vLLM's grid of ``benchmarks/kernels/benchmark_moe.py``
(``get_configs_compute_bound``: 5 x 4 x 3 x 4 x 2 x 4 = 1,920 configurations) with
named constraints that read the launch (``ctx.args``): tiles no larger than the
problem, shared memory of the pipeline stages, accumulator registers per thread, and
``BLOCK_SIZE_M`` against the tokens an expert gets on average. The key is vLLM's
(the number of tokens ``M``, with ``N``, ``K``, ``E``): ``export-configs --format vllm-moe``
writes the files vLLM reads (their N is the down projection's: ``shard_intermediate_size // 2``).

    python examples/triton_autotune/fused_moe.py          # on a GPU: Mixtral-like layer, M = 64
    TRITON_INTERPRET=1 python examples/triton_autotune/fused_moe.py   # CPU: tiny shapes
    python -m evotune tune-kernel examples/triton_autotune/fused_moe.py:moe_gemm_kernel \
        --space examples/triton_autotune/fused_moe.py:SPACE --key M,N,K,E \
        --keys examples/triton_autotune/moe_keys_plain.toml          # the plain kernel, ahead of time
"""

from __future__ import annotations

import os
import sys

import torch

import evotune
from search_spaces._triton_fused_moe import (
    BLOCK_M_CHOICES,
    SPACE,
    align,
    align_all,
    config_for,
    default_config,
    invoke_moe_gemm,
    make_args,
    make_inputs,
    make_launch,
    make_vllm_args,
    moe_gemm_kernel,
    reference,
    route,
)

#: the kernel under evotune.autotune, its module left as it is (the same kernel: its studies are the plain one's)
moe_gemm_tuned = evotune.autotune(space=SPACE, key=["M", "N", "K", "E"], budget=48)(moe_gemm_kernel)


def fused_moe(x: torch.Tensor, gate: torch.Tensor, w: torch.Tensor, top_k: int, kernel=moe_gemm_tuned,
              config: dict[str, int] | None = None) -> torch.Tensor:
    """sum over each token's top-k experts e of weight_e * (x @ w[e].T); x (tokens, K), w (E, N, K). ``kernel``
    tuned (``moe_gemm_tuned``, no ``config``) or plain (``moe_gemm_kernel`` with a ``config``)."""
    weights, ids = route(x, gate, top_k)
    out = invoke_moe_gemm(x, w, weights, ids, top_k, config or {}, kernel)
    return out.view(x.shape[0], top_k, -1).float().sum(dim=1).to(x.dtype)


__all__ = ["BLOCK_M_CHOICES", "SPACE", "align", "align_all", "config_for", "default_config", "fused_moe",
           "invoke_moe_gemm", "make_args", "make_inputs", "make_launch", "make_vllm_args", "moe_gemm_kernel",
           "moe_gemm_tuned", "reference", "route"]


if __name__ == "__main__":
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        print("fused_moe.py: no GPU found: set TRITON_INTERPRET=1 to run on the CPU through Triton's interpreter",
              file=sys.stderr)
        raise SystemExit(2)
    gpu = torch.cuda.is_available()
    tokens, hidden, inter, experts, top_k = (64, 4096, 14336 // 8, 8, 2) if gpu else (8, 64, 32, 4, 2)
    dt = torch.float16 if gpu else torch.float32
    dev = "cuda" if gpu else "cpu"
    x = torch.randn(tokens, hidden, device=dev, dtype=dt)
    gate = torch.randn(hidden, experts, device=dev, dtype=dt)
    w = torch.randn(experts, inter, hidden, device=dev, dtype=dt) / hidden**0.5
    out = fused_moe(x, gate, w, top_k)
    err = (out.float() - reference(x, gate, w, top_k).float()).abs().max().item()
    print(f"fused MoE ({tokens} tokens, E={experts}, N={inter}, K={hidden}): max abs error vs torch {err:.3g}; "
          f"chosen: {moe_gemm_tuned.best_config}")

"""The dense Triton GEMM ``tune-model`` tunes above the decode range, and the examples' matmul: its body, its
launch, and the space it is tuned over.

``matmul_body`` is ``c = a @ b`` (a M x K, b K x N, both row-major: layout ``nn``) over ``BLOCK_M x BLOCK_N``
output tiles grouped ``GROUP_M`` rows of tiles at a time. ``matmul_space_plain`` is it as a plain ``@triton.jit``
kernel, launched with its configuration as keyword arguments; ``examples/triton_autotune/matmul.py`` and
``matmul_space.py`` put it under ``evotune.autotune`` (a configuration list, and ``SPACE``).

``SPACE``: ``BLOCK_M`` and ``BLOCK_N`` in {16, ..., 256}, ``BLOCK_K`` in {16, ..., 128}, ``GROUP_M`` in
{1, 4, 8}, ``num_warps`` in {2, 4, 8}, ``num_stages`` in {2, 3, 4, 5}: 3,600 points, of which 2,478 are
feasible for fp16 on an H100. Its named constraints read the launch (``ctx.args``: the element size of
``a_ptr``) and the GPU (``ctx.hardware``; the H100's limits when the context names none, as inside
``evotune.autotune``, whose check of each compiled kernel then catches a smaller device's):

* ``shared-memory``: the pipelined A and B tiles, ``num_stages`` x (BLOCK_M + BLOCK_N) x BLOCK_K elements,
  within the shared memory a block may use;
* ``accumulator-registers``: the fp32 accumulator, at most 128 registers a thread;
* ``warps-for-tile``: every warp owns at least one 16 x 16 block of the output tile.

None of them reads the problem's shape, so every shape has the same feasible set. It is not a ``Problem`` space
(its constraints read a launch), so the module is private.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import Context, Hardware, Point, SearchSpace, constraint, get_hardware, hardware_limit, ordinal


@triton.jit
def matmul_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        kk = k * BLOCK_K + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c, mask=(rm[:, None] < M) & (rn[None, :] < N))


ACC_REGS = 128  # fp32 accumulator registers a thread may hold
WARP = 32


def _hardware(ctx: Context) -> Hardware:
    return ctx.hardware or get_hardware("H100")


def _element_bytes(ctx: Context) -> int:
    a: Any = getattr(ctx, "args", {}).get("a_ptr")
    return int(a.element_size()) if hasattr(a, "element_size") else 2  # fp16, which the space is written for


def shared_bytes(p: Point, ctx: Context) -> int:
    """Shared memory of the pipeline: ``num_stages`` buffers of a BLOCK_M x BLOCK_K and a BLOCK_K x BLOCK_N tile."""
    return int((p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * _element_bytes(ctx) * p["num_stages"])


SPACE = SearchSpace(
    "matmul_example",
    [ordinal("BLOCK_M", (16, 32, 64, 128, 256)), ordinal("BLOCK_N", (16, 32, 64, 128, 256)),
     ordinal("BLOCK_K", (16, 32, 64, 128)), ordinal("GROUP_M", (1, 4, 8)),
     ordinal("num_warps", (2, 4, 8)), ordinal("num_stages", (2, 3, 4, 5))],
    constraints=[
        hardware_limit("shared-memory", lambda p, ctx: shared_bytes(p, ctx) <= _hardware(ctx).smem_per_block,
                       "{num_stages} stages of {BLOCK_M}x{BLOCK_K} and {BLOCK_K}x{BLOCK_N} tiles exceed the "
                       "shared memory a block may use"),
        constraint("accumulator-registers",
                   lambda p, ctx: p["BLOCK_M"] * p["BLOCK_N"] <= ACC_REGS * WARP * p["num_warps"],
                   "a {BLOCK_M}x{BLOCK_N} fp32 accumulator needs over 128 registers a thread with {num_warps} warps"),
        constraint("warps-for-tile", lambda p, ctx: p["BLOCK_M"] * p["BLOCK_N"] >= 16 * 16 * p["num_warps"],
                   "a {BLOCK_M}x{BLOCK_N} tile has less than one 16x16 block for each of {num_warps} warps"),
    ],
    description="the Triton matmul example (examples/triton_autotune/matmul.py) over tiles, grouping, warps and "
                "stages",
)


@triton.jit
def matmul_space_plain(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                       stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr):
    matmul_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


def grid(M: int, N: int):
    return lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)


def launch_args(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[object, ...]:
    M, K = a.shape
    _, N = b.shape
    return (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


def make_args(M: int, N: int, K: int, dtype: str = "float16"):
    """A key's launch for ``tune-kernel``: (grid, args) on fresh random inputs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dt = getattr(torch, dtype)
    a = torch.randn(M, K, device=device, dtype=dt)
    b = torch.randn(K, N, device=device, dtype=dt)
    c = torch.empty(M, N, device=device, dtype=dt)
    return grid(M, N), launch_args(a, b, c)

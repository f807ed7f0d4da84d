"""The matmul of ``matmul.py`` tuned over a space of configurations instead of a list.

``SPACE``: ``BLOCK_M`` and ``BLOCK_N`` in {16, ..., 256}, ``BLOCK_K`` in {16, ..., 128}, ``GROUP_M`` in
{1, 4, 8}, ``num_warps`` in {2, 4, 8}, ``num_stages`` in {2, 3, 4, 5}: 3,600 points, of which 2,478 are
feasible for fp16 on an H100. Its named constraints read the launch (``ctx.args``: the element size of
``a_ptr``) and the GPU (``ctx.hardware``; the H100's limits when the context names none, as inside
``evotune.autotune``, whose check of each compiled kernel then catches a smaller device's):

* ``shared-memory``: the pipelined A and B tiles, ``num_stages`` x (BLOCK_M + BLOCK_N) x BLOCK_K elements,
  within the shared memory a block may use;
* ``accumulator-registers``: the fp32 accumulator, at most 128 registers a thread;
* ``warps-for-tile``: every warp owns at least one 16 x 16 block of the output tile.

None of them reads the problem's shape, so every shape has the same feasible set (a sample drawn once serves
them all, each kernel compiled once)::

    python -m evotune tune-kernel examples/triton_autotune/matmul_space.py:matmul_space_kernel \\
        --keys examples/triton_autotune/keys.toml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

import evotune
from evotune.authoring import Context, Hardware, Point, SearchSpace, constraint, get_hardware, hardware_limit, ordinal

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the kernel's body and launch helpers are matmul.py's, beside this file
    sys.path.insert(0, HERE)

from matmul import grid, launch_args, make_args, matmul, matmul_body  # noqa: E402

ACC_REGS = 128  # fp32 accumulator registers a thread may hold
WARP = 32


def _hardware(ctx: Context) -> Hardware:
    return ctx.hardware or get_hardware("H100")


def _element_bytes(ctx: Context) -> int:
    a = getattr(ctx, "args", {}).get("a_ptr")
    return int(a.element_size()) if hasattr(a, "element_size") else 2  # fp16, which the space is written for


def shared_bytes(p: Point, ctx: Context) -> int:
    """Shared memory of the pipeline: ``num_stages`` buffers of a BLOCK_M x BLOCK_K and a BLOCK_K x BLOCK_N tile."""
    return (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * _element_bytes(ctx) * p["num_stages"]


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


@evotune.autotune(space=SPACE, key=["M", "N", "K"], budget=40)
@triton.jit
def matmul_space_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    matmul_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


def tuned_matmul(a: Any, b: Any) -> Any:
    """``a @ b`` by the kernel tuned over ``SPACE``."""
    return matmul(a, b, kernel=matmul_space_kernel)


__all__ = ["SPACE", "grid", "launch_args", "make_args", "matmul", "matmul_space_kernel", "shared_bytes",
           "tuned_matmul"]

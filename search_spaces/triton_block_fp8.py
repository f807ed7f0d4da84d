"""A block-scaled fp8 Triton GEMM, as LLM serving runs DeepSeek-V3 style checkpoints on Hopper.

The problem is a GEMM with ``dtype = "fp8"`` and ``scaling = "block"``: e4m3 activations with one fp32 scale
per row and 128-element group of K, e4m3 weights with one fp32 scale per 128x128 block, bf16 output
(``evotune.measurement.workloads.gemm_fp8``). The kernel (``_triton_block_fp8.py``) multiplies each
``BLOCK_SIZE_K`` step's fp8 dot by its rows' and columns' scales and sums in fp32.

The parameters and their choices are those of vLLM's tuning grid for its ``w8a8_block_fp8_matmul`` kernel
(``benchmarks/kernels/benchmark_w8a8_block_fp8.py``), under the names its config files use, so that a tuned
configuration is written as a vLLM config file as it is (``export-configs --format vllm-block-fp8``). vLLM's
default configuration, which it launches where no tuned file exists, is named here: every run on a GPU times it
beside the cuBLAS baseline, as "triton_block_fp8: vLLM default".

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.triton_block_fp8 import SPACE

    ctx = Context(get_hardware("H100"), Problem.gemm(16, 4096, 7168, "fp8", "tn", "block"))
    feasible = SPACE.feasible(ctx)
    len(feasible), feasible.pruned.most_common(3)
"""

from __future__ import annotations

from evotune.authoring import (
    SCALE_BLOCK,
    Context,
    Needs,
    Point,
    Problem,
    SearchSpace,
    constraint,
    deferred,
    hardware_limit,
    ordinal,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr

DEFAULT_PROBLEM = Problem.gemm(64, 4096, 7168, "fp8", "tn", "block")
TILE = gr.TritonTile("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K")  # its shared memory and registers
# what vLLM launches for a shape without a tuned config file (w8a8_triton_block_scaled_mm)
VLLM_DEFAULT = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32, "num_warps": 4,
                "num_stages": 2}
VLLM_DEFAULT_NAME = "vLLM default"


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def _fp8_supported(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or ctx.hardware.has("fp8")


def _block_k_ok(p: Point, ctx: Context) -> bool:
    """Each K step lies in one scale group: one A scale per row and one weight scale per column a step."""
    return SCALE_BLOCK % int(p["BLOCK_SIZE_K"]) == 0


def _rows(ctx: Context) -> int | None:
    """M: the problem's, or under ``evotune.autotune`` the launch's argument ``M``."""
    problem = gr.gemm_problem(ctx)
    if problem is not None:
        return problem.m
    m = getattr(ctx, "args", {}).get("M")
    return m if isinstance(m, int) and not isinstance(m, bool) and m > 0 else None


def _m_rows_ok(p: Point, ctx: Context) -> bool:
    m = _rows(ctx)
    return m is None or p["BLOCK_SIZE_M"] <= max(16, 1 << (m - 1).bit_length())


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    tiling = TILE.tiling(point, problem, hw, persistent=False, band=point["GROUP_SIZE_M"], band_along_m=True)
    return gm.estimate_ms(tiling, problem, hw)


SPACE = SearchSpace(
    name="triton_block_fp8",
    # compile a configuration (returns fn(a, b, scale_a, scale_b, c)), or only fill the kernel cache: GPU-only
    build=deferred("search_spaces._triton_block_fp8", "build"),
    precompile=deferred("search_spaces._triton_block_fp8", "precompile"),
    needs=Needs(modules=("triton",)),
    params=[
        ordinal("BLOCK_SIZE_M", [16, 32, 64, 128, 256], doc="rows (tokens) per program"),
        ordinal("BLOCK_SIZE_N", [32, 64, 128, 256], doc="output columns (weight rows) per program"),
        ordinal("BLOCK_SIZE_K", [64, 128], doc="K elements per step; each step lies in one 128-element scale "
                                               "group"),
        ordinal("GROUP_SIZE_M", [1, 16, 32, 64], doc="tile rows per band of the program order (L2 reuse of the "
                                                     "weight tiles)"),
        ordinal("num_warps", [4, 8], doc="warps per program"),
        ordinal("num_stages", [2, 3, 4, 5], doc="software-pipeline depth of the K loop"),
    ],
    constraints=[
        gr.dtype_rule(("fp8",), "triton_block_fp8", scalings=("block",)),
        # Triton lowers e4m3 dots only on sm_89 and newer
        hardware_limit("fp8", _fp8_supported, "fp8 inputs need FP8 tensor cores; {ctx.hardware.name} has none"),
        constraint("block-k", _block_k_ok,
                   f"BLOCK_SIZE_K={{BLOCK_SIZE_K}} does not divide the {SCALE_BLOCK}-element scale group: a step "
                   "would span two groups"),
        constraint("block-m", _m_rows_ok,
                   gr.Message("BLOCK_SIZE_M={BLOCK_SIZE_M} is wider than M={m} needs (the rows past M are wrapped "
                              "copies)", lambda p, ctx: {"m": _rows(ctx)})),
        gr.smem_limit("smem", lambda p, ctx: TILE.smem_bytes(p, _problem(ctx)),
                      "{num_stages} stages of ({BLOCK_SIZE_M}+{BLOCK_SIZE_N})x{BLOCK_SIZE_K} fp8"),
        *TILE.register_limits(),
    ],
    description="Triton block-scaled fp8 GEMM (1x128 activation groups, 128x128 weight blocks), vLLM's "
                "w8a8_block_fp8_matmul tuning grid",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
    named={VLLM_DEFAULT_NAME: VLLM_DEFAULT},
)

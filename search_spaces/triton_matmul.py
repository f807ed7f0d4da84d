"""A Triton GEMM in the style of the tutorial matmul, with grouped ordering and split-K.

Each program computes a ``BLOCK_M x BLOCK_N`` tile of C over ``K / SPLIT_K`` of the
reduction, ``BLOCK_K`` at a time through a ``num_stages``-deep software pipeline;
programs are ordered in bands of ``GROUP_M`` tile rows for L2 reuse.  With
``SPLIT_K > 1`` the partial tiles are added into C with atomics (fp32 or int32 for
int8).  ``num_ctas > 1`` asks Triton for a thread-block cluster (sm_90+).

fp8 (e4m3) inputs give a bf16 output, unscaled or scaled per tensor (``scaling = "tensor"``: the accumulator
multiplied by ``scale_a * scale_b`` in the epilogue, the kernel called as ``fn(a, b, scale_a, scale_b, c)``, as
``torch._scaled_mm`` is); for fp8 on Hopper, BLOCK_K 128 (one 128-byte swizzle row), 3 to 5 stages and 8 warps
are in the space. ``triton_tma_matmul`` is the same GEMM with TMA loads and a persistent grid.

``build`` (in ``_triton_kernel.py``, imported only when a GPU run needs it)
compiles a configuration; verification and timing are the GEMM defaults of
``evotune.measurement.workloads.gemm``. The kernel masks the K tail, so ``SPLIT_K = 1``
takes any K.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.triton_matmul import SPACE

    ctx = Context(get_hardware("A100"), Problem.gemm(4096, 4096, 4096, "bf16"))
    feasible = SPACE.feasible(ctx)
    len(feasible), feasible.pruned.most_common(3)
    best = min((feasible.point(r) for r in range(len(feasible))), key=lambda p: SPACE.estimate(p, ctx))
"""

from __future__ import annotations

from evotune.authoring import (
    Context,
    Needs,
    Point,
    Problem,
    SearchSpace,
    constraint,
    deferred,
    hardware_limit,
    ordinal,
    power_of_two,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "bf16")
TILE = gr.TritonTile("BLOCK_M", "BLOCK_N", "BLOCK_K")  # its shared memory and registers
SCALINGS = ("", "tensor")  # fp8: unscaled, or scaled per tensor in the epilogue


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def _fp8_supported(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return ctx.hardware is None or problem is None or problem.dtype != "fp8" or ctx.hardware.has("fp8")


def _clusters_ok(p: Point, ctx: Context) -> bool:
    hw = ctx.hardware
    return hw is None or p["num_ctas"] == 1 or (hw.has("clusters") and p["num_ctas"] <= hw.max_cluster_portable)


def _split_k_ok(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    if problem is None or p["SPLIT_K"] == 1:
        return True
    return problem.k % (int(p["SPLIT_K"]) * int(p["BLOCK_K"])) == 0


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown).

    ``num_ctas > 1`` is modelled as a cluster whose CTAs split BLOCK_M and share the
    B tile by multicast; shared memory and registers are charged as if unsplit.
    """
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    ctas = point["num_ctas"]
    tiling = TILE.tiling(point, problem, hw, tile_m=max(point["BLOCK_M"] // ctas, 1), cluster=(ctas, 1),
                         split_k=point["SPLIT_K"], persistent=False, band=point["GROUP_M"], band_along_m=True)
    return gm.estimate_ms(tiling, problem, hw)


SPACE = SearchSpace(
    name="triton_matmul",
    # compile a configuration (returns fn(a, b, c)), or only fill the kernel cache: GPU-only code
    build=deferred("search_spaces._triton_kernel", "build"),
    precompile=deferred("search_spaces._triton_kernel", "precompile"),
    needs=Needs(modules=("triton",)),
    params=[
        power_of_two("BLOCK_M", 16, 256, doc="tile rows per program"),
        power_of_two("BLOCK_N", 32, 256, doc="tile columns per program"),
        power_of_two("BLOCK_K", 32, 256, doc="K elements per pipeline step"),
        ordinal("GROUP_M", [1, 4, 8], doc="tile rows per band of the grouped program order (L2 reuse)"),
        power_of_two("SPLIT_K", 1, 16, doc="programs sharing one tile's K range, reduced with atomics"),
        ordinal("num_warps", [4, 8], doc="warps per program"),
        ordinal("num_stages", [2, 3, 4, 5], doc="software-pipeline depth of the K loop"),
        ordinal("num_ctas", [1, 2], doc="CTAs per program as a thread-block cluster (sm_90+)"),
    ],
    constraints=[
        # every dtype, fp8 unscaled or scaled per tensor (block scales: triton_block_fp8; per row: the decode
        # family)
        gr.dtype_rule(("bf16", "fp16", "fp8", "int8", "fp32"), "triton_matmul", SCALINGS),
        # Triton lowers e4m3 dots only on sm_89 and newer
        hardware_limit("fp8", _fp8_supported, "fp8 inputs need fp8 tensor cores; {ctx.hardware.name} has none"),
        hardware_limit("clusters", _clusters_ok,
                       "num_ctas={num_ctas} needs thread-block clusters (sm_90+); {ctx.hardware.name} "
                       "allows {ctx.hardware.max_cluster_portable} CTA per cluster"),
        gr.smem_limit("smem", lambda p, ctx: TILE.smem_bytes(p, _problem(ctx)),
                      "{num_stages} stages of ({BLOCK_M}+{BLOCK_N})x{BLOCK_K}"),
        *TILE.register_limits(),
        constraint("split-k", _split_k_ok,
                   "K={ctx.problem.k} does not split into {SPLIT_K} chunks that are multiples of BLOCK_K={BLOCK_K}"),
    ],
    description="Triton tutorial-style GEMM with grouped ordering, split-K and optional clusters",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

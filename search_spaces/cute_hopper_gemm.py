"""The sm90 persistent, warp-specialised CuTe DSL GEMM (nvidia-cutlass-operators): WGMMA + TMA.

One DMA warpgroup loads A and B with TMA (multicast across the cluster) into a
``stages``-deep shared-memory ring; one MMA warpgroup, or two for 128x256 tiles,
runs WGMMA with the fp32/int32 accumulator in registers, then stores C through a
shared-memory staging buffer with TMA.  One CTA per SM walks the tiles in the
order set by ``raster`` and ``swizzle``.

``build`` (the adapter in ``_cute_sm90.py``, imported only for GPU runs)
compiles a configuration; verification and timing are the GEMM defaults of
``evotune.measurement.workloads.gemm``.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.cute_hopper_gemm import SPACE

    ctx = Context(get_hardware("H100"), Problem.gemm(4096, 4096, 4096, "bf16"))
    feasible = SPACE.feasible(ctx)
    point = feasible.point(0)
    SPACE.check(dict(point, tile_m=128, tile_n=256, stages=8), ctx)
    # 'smem: needs 428032 B of shared memory (8 stages of 128x256 + epilogue + barriers), H100 allows 232448'
    SPACE.estimate(point, ctx)   # predicted milliseconds
"""

from __future__ import annotations

from evotune.authoring import (
    Context,
    Needs,
    Point,
    Problem,
    SearchSpace,
    categorical,
    deferred,
    int_range,
    ordinal,
    tuples,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "bf16")
SUPPORTED_DTYPES = ("bf16", "fp16", "fp8", "int8")
EPI_STAGES = 4  # TMA-store staging buffers the kernel keeps in flight


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def mma_warpgroups(point: Point) -> int:
    """Two consumer warpgroups (64 rows each) for 128x256 tiles, else one.

    This is also why no register-pressure rule is needed: one warpgroup holds at
    most a 64x256 or 128x128 fp32 accumulator, 128 registers per thread, within the
    232 the kernel gives its MMA warps with setmaxnreg; 128x256 is split over two.
    """
    return 2 if point["tile_m"] > 64 and point["tile_n"] > 128 else 1


def epilogue_tile(point: Point, out_bytes: int) -> tuple[int, int]:
    """The TMA-store subtile: up to 128 rows with two MMA warpgroups, else 64; 32 columns (64 for 8-bit C)."""
    tm, tn = point["tile_m"], point["tile_n"]
    if mma_warpgroups(point) == 2:
        return min(128, tm), min(32, tn)
    return min(64, tm), min(64 if out_bytes == 1 else 32, tn)


def smem_bytes(point: Point, problem: Problem) -> int:
    """Operand stages + epilogue staging + mbarriers + the binary's static shared memory, in bytes.

    This is the shared memory each compiled binary launches with (checked for every point on the H100)."""
    tk = gr.k_tile(problem.in_bytes)
    operands = int(point["stages"]) * gr.operand_stage_bytes(point["tile_m"], point["tile_n"], tk, problem.in_bytes)
    rows, cols = epilogue_tile(point, problem.out_bytes)
    return (operands + gr.epilogue_bytes(rows, cols, problem.out_bytes, EPI_STAGES) + gr.MBARRIER_RESERVE
            + gr.CUTE_STATIC_SMEM)


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    measured = gr.compiled_resources(ctx, SPACE, point)  # the binary's registers and shared memory, if compiled
    tiling = gm.Tiling(
        tile_m=point["tile_m"], tile_n=point["tile_n"], tile_k=gr.k_tile(problem.in_bytes),
        stages=point["stages"], smem_bytes=measured.smem if measured else smem_bytes(point, problem),
        regs_per_thread=measured.regs if measured else 0, cluster=tuple(point["cluster"]),
        persistent=True, threads=128 * (1 + mma_warpgroups(point)),
        band=point["swizzle"] * (point["cluster"][0] if point["raster"] == "n" else point["cluster"][1]),
        # raster along M walks down M inside a band of `swizzle` clusters along N, and vice versa
        band_along_m=point["raster"] == "n",
        wave_overhead_us=0.5,  # epilogue of each tile is not overlapped with the next mainloop
    )
    return gm.estimate_ms(tiling, problem, hw)


SPACE = SearchSpace(
    name="cute_hopper_gemm",
    # compile a configuration (returns fn(a, b, c)), or only fill the kernel cache: GPU-only code
    build=deferred("search_spaces._cute_sm90", "build"),
    precompile=deferred("search_spaces._cute_sm90", "precompile"),
    compile_only=deferred("search_spaces._cute_sm90", "compile_only"),
    # its compiler and launcher, imported once for the GPU worker and every compile process
    preload=("cutlass.cute", "cutlass.operators", "tvm_ffi", "search_spaces._cute_sm90"),
    needs=Needs(modules=("cutlass.cute", "cutlass.operators")),  # CuTe DSL and its GEMM operators
    params=[
        ordinal("tile_m", [64, 128], doc="CTA tile rows (one 64-row WGMMA per warpgroup step)"),
        ordinal("tile_n", [64, 128, 256], doc="CTA tile columns"),
        tuples("cluster", [(cm, cn) for cm in (1, 2) for cn in (1, 2)],
               doc="cluster shape (M, N); B is TMA-multicast along M, A along N"),
        ordinal("swizzle", [1, 2, 4, 8], doc="tile-scheduler swizzle: band width, in clusters, for L2 reuse"),
        categorical("raster", ["m", "n"], doc="walk the tiles along M or along N first"),
        int_range("stages", 2, 8, doc="depth of the A/B shared-memory pipeline"),
    ],
    constraints=[
        gr.sm90_arch_limit(),
        gr.dtype_rule(SUPPORTED_DTYPES, "the sm90 CuTe GEMM"),
        gr.k_major_8bit_rule(),
        gr.tma_alignment_limit(),
        gr.portable_cluster_limit(),
        gr.smem_limit("smem", lambda p, ctx: smem_bytes(p, _problem(ctx)),
                      "{stages} stages of {tile_m}x{tile_n} + epilogue + barriers"),
    ],
    description="sm90 persistent warp-specialised CuTe DSL GEMM (WGMMA, TMA multicast, TMA-store epilogue)",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

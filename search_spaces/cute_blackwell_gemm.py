"""The sm100 persistent CuTe DSL GEMM (nvidia-cutlass-operators): tcgen05 MMA into tensor memory.

A TMA warp loads A and B (multicast across the cluster), a single MMA warp issues
``tcgen05.mma`` with the accumulator in tensor memory (double-buffered, so the
epilogue of one tile overlaps the mainloop of the next), and four epilogue warps
move it out, through shared memory and a TMA store or straight from registers.
With ``use_2cta_instrs`` a CTA pair shares one ``mma_m``-row MMA: each CTA holds
``mma_m / 2`` rows of A and half of the B tile.  The kernel fills shared memory
with as many A/B stages as fit, so stages are not a parameter here.

Definitions only for now: ``build``/``run``/``reference`` come with the GPU half.

Example::

    from evotune.hardware import get_hardware
    from evotune.space import Context
    from search_spaces.cute_blackwell_gemm import SPACE

    b200 = Context(get_hardware("B200"), SPACE.default_problem)
    point = SPACE.feasible(b200).point(0)
    SPACE.estimate(point, b200)   # predicted milliseconds
    SPACE.check(point, Context(get_hardware("H100"), SPACE.default_problem))
    # 'arch: needs sm_100 (tcgen05 MMA and tensor memory); H100 is sm_90a'
"""

from __future__ import annotations

import math

from evotune.problem import Problem
from evotune.space import (
    Context,
    Point,
    SearchSpace,
    boolean,
    constraint,
    deferred,
    hardware_limit,
    int_range,
    ordinal,
    tuples,
)
from search_spaces import _gemm_model as gm

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "bf16")
SUPPORTED_DTYPES = ("bf16", "fp16", "fp8", "int8")
MIN_STAGES = 2  # the kernel chooses its A/B stage count; a point is feasible when two fit
C_STAGES = 2  # TMA-store staging buffers reserved before the A/B stages are sized
EPI_ELEMS = 4096  # the sm100 epilogue subtile holds about this many outputs (up to 128 rows)

_POW2 = (1, 2, 4, 8, 16)
CLUSTERS = [(cm, cn) for cm in _POW2 for cn in _POW2 if cm * cn <= 16]


def _problem(ctx: Context) -> Problem:
    return gm.problem_or(ctx, DEFAULT_PROBLEM)


def cta_tile(point: Point) -> tuple[int, int]:
    """Output rows and columns one CTA owns: a 2-CTA MMA splits its M between the pair."""
    return point["mma_m"] // (2 if point["use_2cta_instrs"] else 1), point["mma_n"]


def b_rows_per_cta(point: Point) -> int:
    """Rows of the B tile one CTA stages: half of ``mma_n`` with 2-CTA MMAs, the pair shares B."""
    return point["mma_n"] // (2 if point["use_2cta_instrs"] else 1)


def smem_bytes(point: Point, problem: Problem, stages: int = MIN_STAGES) -> int:
    """Shared memory for ``stages`` A/B stages, the TMA-store buffers and mbarriers.

    Tensor memory needs no check: two fp32 accumulator buffers of ``mma_n <= 256``
    columns fit in the 512 columns of every SM.
    """
    tm, tn = cta_tile(point)
    stage = gm.operand_stage_bytes(tm, b_rows_per_cta(point), gm.k_tile(problem.in_bytes), problem.in_bytes)
    epi = 0
    if point["use_tma_store"]:
        rows = min(tm, 128)
        cols = min(tn, max(EPI_ELEMS // rows, 8))
        epi = gm.epilogue_bytes(rows, cols, problem.out_bytes, C_STAGES)
    return stages * stage + epi + gm.MBARRIER_RESERVE


def auto_stages(point: Point, problem: Problem, smem_capacity: int) -> int:
    """The A/B stage count the kernel would pick: as many as fit after the epilogue and barriers."""
    fixed = smem_bytes(point, problem, stages=0)
    per_stage = smem_bytes(point, problem, stages=1) - fixed
    return max(0, (smem_capacity - fixed) // per_stage)


def _has_sm100(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or ctx.hardware.has("tcgen05")


def _mma_m_ok(p: Point, ctx: Context) -> bool:
    return p["mma_m"] in ((128, 256) if p["use_2cta_instrs"] else (64, 128))


def _pair_cluster(p: Point, ctx: Context) -> bool:
    return not p["use_2cta_instrs"] or p["cluster"][0] % 2 == 0


def _has_2cta(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or not p["use_2cta_instrs"] or ctx.hardware.has("2cta")


def _cluster_fits(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or math.prod(p["cluster"]) <= ctx.hardware.max_cluster


def _full_tiles_without_tma_store(p: Point, ctx: Context) -> bool:
    problem = gm.gemm_problem(ctx)
    if problem is None or p["use_tma_store"]:
        return True
    tm, tn = cta_tile(p)
    return problem.m % tm == 0 and problem.n % tn == 0


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gm.hardware_or_default(ctx)
    tm, tn = cta_tile(point)
    measured = gm.compiled_resources(ctx, SPACE, point)  # the stages the kernel chose, read off its binary
    stages = max(MIN_STAGES, min(measured.stages if measured else auto_stages(point, problem, hw.smem_per_block), 8))
    tiling = gm.Tiling(
        tile_m=tm, tile_n=tn, tile_k=gm.k_tile(problem.in_bytes), stages=stages,
        smem_bytes=measured.smem if measured else smem_bytes(point, problem, stages),
        regs_per_thread=measured.regs if measured else 0, cluster=tuple(point["cluster"]),
        persistent=True, threads=192, b_rows=b_rows_per_cta(point),
        # an MMA with 64 rows per CTA drives half of the SM's tensor-core datapath
        mma_rate=0.5 if tm < 128 else 1.0,
        # the kernel's tile scheduler walks along M, one cluster wide in N
        band=point["cluster"][1], band_along_m=False,
        wave_overhead_us=0.25,  # double-buffered TMEM accumulator: epilogue overlaps the next tile
    )
    return gm.estimate_ms(tiling, problem, hw)


SPACE = SearchSpace(
    name="cute_blackwell_gemm",
    params=[
        ordinal("mma_m", [64, 128, 256], doc="MMA tile rows (split over the CTA pair with 2-CTA MMAs)"),
        int_range("mma_n", 32, 256, 32, doc="MMA tile columns"),
        tuples("cluster", CLUSTERS, doc="cluster shape (M, N), powers of two, at most 16 CTAs"),
        boolean("use_2cta_instrs", doc="tcgen05 cta_group::2: one MMA spans a CTA pair along M"),
        boolean("use_tma_store", doc="epilogue through shared memory and a TMA store (else direct stores)"),
    ],
    constraints=[
        # first, so that on a Hopper or Ampere part every point is pruned for the architecture
        hardware_limit("arch", _has_sm100,
                       "needs sm_100 (tcgen05 MMA and tensor memory); {ctx.hardware.name} is {ctx.hardware.arch}"),
        constraint("mma-m", _mma_m_ok,
                   "mma_m={mma_m} with use_2cta_instrs={use_2cta_instrs}: 1-CTA MMAs take M 64/128, 2-CTA 128/256"),
        constraint("2cta-cluster", _pair_cluster,
                   "2-CTA MMAs pair CTAs along M, so cluster M must be even, not {cluster[0]}"),
        hardware_limit("2cta", _has_2cta, "{ctx.hardware.name} has no 2-CTA tcgen05 MMA"),
        hardware_limit("cluster-size", _cluster_fits,
                       "a {cluster[0]}x{cluster[1]} cluster exceeds the {ctx.hardware.max_cluster} CTAs "
                       "{ctx.hardware.name} allows"),
        gm.dtype_rule(SUPPORTED_DTYPES, "the sm100 CuTe GEMM"),
        gm.tma_alignment_limit(),
        # the direct-store epilogue has no bounds predication
        constraint("no-tma-store-oob", _full_tiles_without_tma_store,
                   "without TMA store the CTA tile must divide M and N "
                   "({ctx.problem.m}x{ctx.problem.n} is not tiled by mma {mma_m}x{mma_n})"),
        gm.smem_limit("smem", lambda p, ctx: smem_bytes(p, _problem(ctx)),
                      f"{MIN_STAGES} A/B stages + epilogue + barriers"),
    ],
    description="sm100 persistent CuTe DSL GEMM (tcgen05 MMA into TMEM, optional 2-CTA MMA and TMA store)",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
    # compiled for sm_100a from fake tensors on any machine; building to run needs a B200
    compile_only=deferred("search_spaces._cute_sm100", "compile_only"),
)

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

    from evotune.core.hardware import get_hardware
    from evotune.core.space import Context
    from search_spaces.cute_blackwell_gemm import SPACE

    b200 = Context(get_hardware("B200"), SPACE.default_problem)
    point = SPACE.feasible(b200).point(0)
    SPACE.estimate(point, b200)   # predicted milliseconds
    SPACE.check(point, Context(get_hardware("H100"), SPACE.default_problem))
    # 'arch: needs sm_100 (tcgen05 MMA and tensor memory); H100 is sm_90a'
"""

from __future__ import annotations

import math

from evotune.authoring import (
    Context,
    Needs,
    Point,
    Problem,
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
from search_spaces import _gemm_rules as gr

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "bf16")
SUPPORTED_DTYPES = ("bf16", "fp16", "fp8", "int8")
MIN_STAGES = 2  # the kernel chooses its A/B stage count; a point is feasible when two fit
C_STAGES = 2  # TMA-store staging buffers reserved before the A/B stages are sized
EPI_ELEMS = 4096  # the sm100 epilogue subtile holds about this many outputs (up to 128 rows)
STATIC_SMEM = gr.CUTE_STATIC_SMEM  # shared memory the compiled kernel declares statically (.nv.shared)

_POW2 = (1, 2, 4, 8, 16)
CLUSTERS = [(cm, cn) for cm in _POW2 for cn in _POW2 if cm * cn <= 16]


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def cta_tile(point: Point) -> tuple[int, int]:
    """Output rows and columns one CTA owns: a 2-CTA MMA splits its M between the pair."""
    return int(point["mma_m"]) // (2 if point["use_2cta_instrs"] else 1), int(point["mma_n"])


def b_rows_per_cta(point: Point) -> int:
    """Rows of the B tile one CTA stages: half of ``mma_n`` with 2-CTA MMAs, the pair shares B."""
    return int(point["mma_n"]) // (2 if point["use_2cta_instrs"] else 1)


def epilogue_tile(point: Point) -> tuple[int, int]:
    """The TMA-store subtile (rows, columns) the kernel stages C through.

    Four epilogue warps split it along M, 32 TMEM lanes each (2x2 warps for a 64-row
    CTA of a 2-CTA MMA), and it holds about ``EPI_ELEMS`` outputs: the widest
    power-of-two column count up to that which divides the CTA tile's N.
    """
    tm, tn = cta_tile(point)
    warps_n = 2 if point["use_2cta_instrs"] and tm == 64 else 1
    rows = min(tm, 128 // warps_n)
    cols = min(tn, max(EPI_ELEMS // rows, 16))
    while tn % cols:
        cols //= 2
    return rows, cols


def _stage_bytes(point: Point, problem: Problem) -> tuple[int, int]:
    """(A/B bytes per stage, C bytes per TMA-store stage; 0 without TMA store)."""
    tm, _ = cta_tile(point)
    ab = gr.operand_stage_bytes(tm, b_rows_per_cta(point), gr.k_tile(problem.in_bytes), problem.in_bytes)
    if not point["use_tma_store"]:
        return ab, 0
    rows, cols = epilogue_tile(point)
    return ab, rows * cols * problem.out_bytes


def smem_bytes(point: Point, problem: Problem, stages: int = MIN_STAGES) -> int:
    """Shared memory for ``stages`` A/B stages, the TMA-store buffers and mbarriers.

    Tensor memory needs no check: two fp32 accumulator buffers of ``mma_n <= 256``
    columns fit in the 512 columns of every SM.
    """
    ab, c = _stage_bytes(point, problem)
    return stages * ab + gr.align_up(C_STAGES * c) + gr.MBARRIER_RESERVE


def auto_stages(point: Point, problem: Problem, smem_capacity: int) -> int:
    """The A/B stage count the kernel would pick: as many as fit after the epilogue and barriers."""
    ab, c = _stage_bytes(point, problem)
    return max(0, (smem_capacity - gr.MBARRIER_RESERVE - C_STAGES * c) // ab)


def launch_smem(point: Point, problem: Problem, smem_capacity: int) -> tuple[int, int, int]:
    """(bytes, A/B stages, C stages) of shared memory the kernel launches with, as its stage heuristic fills it.

    The kernel sizes its stages to the capacity less a 1 KiB reserve for barriers, and gives what is
    left to more C stages. Its barrier block (two mbarriers per A/B stage and per accumulator buffer,
    rounded up to 128 B) then comes on top, and so does the 1 KiB of static shared memory its binary
    declares: a fill that leaves less than that over the capacity compiles, and fails at launch.
    """
    ab, c = _stage_bytes(point, problem)
    n_ab = auto_stages(point, problem, smem_capacity)
    n_c = 0
    if c:
        n_c = C_STAGES + (smem_capacity - n_ab * ab - gr.MBARRIER_RESERVE - C_STAGES * c) // c
    barriers = -(-(16 * n_ab + 16 * 2 + 12) // 128) * 128
    return n_ab * ab + n_c * c + barriers + STATIC_SMEM, n_ab, n_c


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
    problem = gr.gemm_problem(ctx)
    if problem is None or p["use_tma_store"]:
        return True
    tm, tn = cta_tile(p)
    return problem.m % tm == 0 and problem.n % tn == 0


def _fill(p: Point, ctx: Context) -> tuple[int, int, int]:
    return launch_smem(p, _problem(ctx), gr.hardware_or_default(ctx).smem_per_block)


def _fill_fits(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or _fill(p, ctx)[0] <= ctx.hardware.smem_per_block


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    tm, tn = cta_tile(point)
    measured = gr.compiled_resources(ctx, SPACE, point)  # the stages the kernel chose, read off its binary
    stages = max(MIN_STAGES, min(measured.stages if measured else auto_stages(point, problem, hw.smem_per_block), 8))
    tiling = gm.Tiling(
        tile_m=tm, tile_n=tn, tile_k=gr.k_tile(problem.in_bytes), stages=stages,
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
        gr.dtype_rule(SUPPORTED_DTYPES, "the sm100 CuTe GEMM"),
        gr.tma_alignment_limit(),
        # the direct-store epilogue has no bounds predication; the compiler cannot see it (shapes are symbolic)
        constraint("no-tma-store-oob", _full_tiles_without_tma_store,
                   "without TMA store the CTA tile must divide M and N "
                   "({ctx.problem.m}x{ctx.problem.n} is not tiled by mma {mma_m}x{mma_n}): such a point compiles, "
                   "the shapes being symbolic, but its direct stores are not bounds-checked, and the kernel "
                   "allows no partial tile without TMA store"),
        gr.smem_limit("smem", lambda p, ctx: smem_bytes(p, _problem(ctx)),
                      f"{MIN_STAGES} A/B stages + epilogue + barriers"),
        # the compiler builds these, but the binary asks for more shared memory than a block may have
        hardware_limit("smem-fill", _fill_fits, gr.Message(
            "the kernel fills shared memory with {fill_ab} A/B and {fill_c} C stages and then needs {fill} B "
            "with its barriers and {static} B of static shared memory, {ctx.hardware.name} allows "
            "{ctx.hardware.smem_per_block}: it compiles but cannot launch",
            lambda p, ctx: dict(zip(("fill", "fill_ab", "fill_c"), _fill(p, ctx), strict=True), static=STATIC_SMEM))),
    ],
    description="sm100 persistent CuTe DSL GEMM (tcgen05 MMA into TMEM, optional 2-CTA MMA and TMA store)",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
    # compiled for sm_100a from meta tensors on any machine; building to run needs a B200
    compile_only=deferred("search_spaces._cute_sm100", "compile_only"),
    needs=Needs(modules=("cutlass.cute", "cutlass.operators")),  # CuTe DSL and its GEMM operators
)

"""The CUTLASS C++ sm90 GEMM (CUTLASS 3.x ``GemmUniversal`` through nvidia-cutlass), with stream-K and split-K.

The knobs are the template and runtime parameters CUTLASS exposes for Hopper:

- compiled into the kernel: the kernel schedule (``cooperative``: two consumer
  warpgroups share one tile; ``pingpong``: they alternate between tiles, so one's
  epilogue overlaps the other's mainloop), the epilogue (``tma``: staged through
  shared memory and stored with TMA; ``nosmem``: registers straight to global),
  the tile scheduler (``persistent``, or ``streamk``, which can split the K loop of
  a tile over several CTAs), the CTA tile M x N x K, the cluster shape, the
  pipeline depth (``stages``; 0 takes the most that fit, as CUTLASS computes it),
  and ``swap_ab``: compute ``D^T = B^T A^T`` so that a GEMM with few rows runs its
  M along the narrow tile N;
- arguments at launch, free once the kernel is built: the raster order, the
  swizzle (band width of the tile walk, for L2 reuse), and for stream-K the
  decomposition (``heuristic``, ``dataparallel``, ``splitk`` with ``splits``, or
  ``streamk``).

A compiled kernel is shape-free: the on-disk cache key holds only the compiled
knobs, the dtypes and the layouts (``_cutlass_sm90.COMPILE_KNOBS``), so every
problem and every runtime knob reuse one nvcc run (about a minute each).

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.cutlass_sm90_gemm import SPACE

    ctx = Context(get_hardware("H100"), Problem.gemm(64, 4096, 11008, "bf16"))
    feasible = SPACE.feasible(ctx)
    SPACE.check(dict(feasible.point(0), schedule="pingpong", scheduler="streamk"), ctx)
    # 'streamk-cooperative: stream-K and split-K need the cooperative schedule (CUTLASS's ping-pong ...'
"""

from __future__ import annotations

import dataclasses
import math

from evotune.authoring import (
    Context,
    Needs,
    Point,
    Problem,
    SearchSpace,
    boolean,
    categorical,
    constraint,
    deferred,
    hardware_limit,
    ordinal,
    tuples,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr
from search_spaces._cutlass_sm90 import COMPILE_KNOBS

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "bf16")
SUPPORTED_DTYPES = ("bf16", "fp16", "int8")
EPILOGUE_STAGES = 2  # D staging buffers of CUTLASS's sm90 TMA epilogue
# The largest fp32/int32 accumulator fragment a consumer thread keeps without spilling, of the 240 registers
# setmaxnreg gives a consumer warpgroup: ptxas (nvcc 13.0, -Xptxas -v) builds 192 per thread (a 256x192
# cooperative or a 128x192 ping-pong tile) with no spills, and spills 4.7 KB at 256 (256x256 cooperative,
# 128x256 ping-pong).
MAX_ACCUMULATORS = 192


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def consumer_warpgroups(point: Point) -> int:
    """Warpgroups that share one tile's accumulator: two for the cooperative schedule, one for ping-pong."""
    return 2 if point["schedule"] == "cooperative" else 1


def accumulators_per_thread(point: Point) -> int:
    return int(point["tile_m"]) * int(point["tile_n"]) // (128 * consumer_warpgroups(point))


def epilogue_smem(point: Point, problem: Problem) -> int:
    """The TMA epilogue's D staging (CUTLASS's automatic epilogue tile); none without shared memory."""
    if point["epilogue"] == "nosmem":
        return 0
    rows = min(point["tile_m"], 128 if point["schedule"] == "cooperative" else 64)
    cols = min(point["tile_n"], 32)
    return gr.align_up(rows * cols * problem.out_bytes * EPILOGUE_STAGES)


def stages(point: Point, problem: Problem, hw_smem: int) -> int:
    """The pipeline depth: as set, or for 0 the most that fit beside the epilogue (CUTLASS's carve-out)."""
    if point["stages"]:
        return int(point["stages"])
    stage = gr.operand_stage_bytes(point["tile_m"], point["tile_n"], point["tile_k"], problem.in_bytes)
    return max(1, (hw_smem - epilogue_smem(point, problem) - gr.MBARRIER_RESERVE) // stage)


def smem_bytes(point: Point, problem: Problem, hw_smem: int = 232448) -> int:
    depth = stages(point, problem, hw_smem)
    stage = gr.operand_stage_bytes(point["tile_m"], point["tile_n"], point["tile_k"], problem.in_bytes)
    return depth * stage + epilogue_smem(point, problem) + gr.MBARRIER_RESERVE


def kernel_problem(point: Point, problem: Problem) -> Problem:
    """The GEMM the kernel computes: ``n x m x k`` when A and B are swapped."""
    if point["swap_ab"]:
        return dataclasses.replace(problem, m=problem.n, n=problem.m)
    return problem


def _smem_need(p: Point, ctx: Context) -> int:
    hw_smem = ctx.hardware.smem_per_block if ctx.hardware is not None else 232448
    return smem_bytes(p, _problem(ctx), hw_smem)


def _tile_k_bytes(p: Point, ctx: Context) -> bool:
    return int(p["tile_k"]) * _problem(ctx).in_bytes in (64, 128, 256)


def _split_split(p: Point, ctx: Context) -> bool:
    return (int(p["splits"]) > 1) == (str(p["decomposition"]) == "splitk")


def _split_fits_k(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return problem is None or p["splits"] <= max(1, problem.k // p["tile_k"])


def effective_split(point: Point, problem: Problem, sm_count: int) -> int:
    """How many CTAs share one tile's K loop, as the estimate models the decomposition."""
    if point["scheduler"] != "streamk" or point["decomposition"] == "dataparallel":
        return 1
    if point["decomposition"] == "splitk":
        return int(point["splits"])
    kp = kernel_problem(point, problem)
    tiles = math.ceil(kp.m / point["tile_m"]) * math.ceil(kp.n / point["tile_n"])
    k_tiles = max(1, kp.k // point["tile_k"])
    # stream-K (and its heuristic) spreads the K iterations of a partial last wave over every SM
    return max(1, min(k_tiles, round(sm_count / tiles))) if tiles < sm_count else 1


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    kp = kernel_problem(point, problem)
    cluster = tuple(point["cluster"])
    tiling = gm.Tiling(
        tile_m=point["tile_m"], tile_n=point["tile_n"], tile_k=point["tile_k"],
        stages=stages(point, kp, hw.smem_per_block), smem_bytes=smem_bytes(point, kp, hw.smem_per_block),
        cluster=cluster, split_k=effective_split(point, problem, hw.sm_count), persistent=True,
        threads=128 * (1 + 2), band=point["swizzle"] * (cluster[0] if point["raster"] == "n" else cluster[1]),
        band_along_m=point["raster"] == "n",
        # ping-pong overlaps one tile's epilogue with the next tile's mainloop
        wave_overhead_us=0.2 if point["schedule"] == "pingpong" else 0.5,
    )
    return gm.estimate_ms(tiling, kp, hw)


SPACE = SearchSpace(
    name="cutlass_sm90_gemm",
    # nvcc a configuration into a shared library (returns fn(a, b, c)), or only fill the cache: GPU-only code
    build=deferred("search_spaces._cutlass_sm90", "build"),
    precompile=deferred("search_spaces._cutlass_sm90", "precompile"),
    needs=Needs(programs=("nvcc",), check=deferred("search_spaces._cutlass_build", "headers_missing")),
    # a search varies the launch arguments of a built kernel for free, and counts cached kernels as built
    compiled_params=COMPILE_KNOBS,
    built=deferred("search_spaces._cutlass_sm90", "built"),
    params=[
        boolean("swap_ab", doc="compute D^T = B^T A^T: the problem's M runs along the tile's N"),
        categorical("schedule", ["cooperative", "pingpong"],
                    doc="two consumer warpgroups on one tile, or alternating between tiles"),
        categorical("epilogue", ["tma", "nosmem"], doc="store D through shared memory with TMA, or directly"),
        categorical("scheduler", ["persistent", "streamk"], doc="tile scheduler: one tile per CTA turn, or stream-K"),
        ordinal("tile_m", [64, 128, 256], doc="CTA tile rows (of the kernel's M)"),
        ordinal("tile_n", [16, 32, 64, 128, 192, 256], doc="CTA tile columns (WGMMA N)"),
        ordinal("tile_k", [32, 64, 128, 256], doc="CTA tile depth, in elements (64, 128 or 256 bytes)"),
        tuples("cluster", [(cm, cn) for cm in (1, 2) for cn in (1, 2)],
               doc="cluster shape (M, N); B is TMA-multicast along M, A along N"),
        ordinal("stages", [0, 3, 4, 5, 6], doc="A/B pipeline depth; 0: the most that fit"),
        categorical("raster", ["m", "n"], doc="walk the tiles along M or along N first (launch argument)"),
        ordinal("swizzle", [1, 2, 4, 8], doc="band width of the tile walk, in tiles (launch argument)"),
        categorical("decomposition", ["heuristic", "streamk", "splitk"],
                    doc="stream-K scheduler's split of the K loops (launch argument)"),
        ordinal("splits", [1, 2, 3, 4, 8], doc="K slices per tile with the splitk decomposition (launch argument)"),
    ],
    constraints=[
        gr.sm90_arch_limit(),
        gr.dtype_rule(SUPPORTED_DTYPES, "the CUTLASS sm90 GEMM"),
        gr.k_major_8bit_rule(),
        gr.tma_alignment_limit(),
        constraint("tile-k", _tile_k_bytes,
                   "tile K of {tile_k} elements is not 64, 128 or 256 bytes of {ctx.problem.dtype}"),
        constraint("cooperative-tile-m", lambda p, ctx: p["schedule"] != "cooperative" or p["tile_m"] >= 128,
                   "the cooperative schedule splits tile M over two 64-row warpgroups: tile_m {tile_m} < 128"),
        hardware_limit("accumulators", lambda p, ctx: accumulators_per_thread(p) <= MAX_ACCUMULATORS,
                       "a {tile_m}x{tile_n} tile over the {schedule} schedule's consumer warpgroups needs more than "
                       f"{MAX_ACCUMULATORS} accumulator registers per thread (spills)"),
        constraint("streamk-cooperative", lambda p, ctx: p["scheduler"] != "streamk" or p["schedule"] == "cooperative",
                   "stream-K and split-K need the cooperative schedule (CUTLASS's ping-pong kernel has no "
                   "stream-K support)"),
        gr.portable_cluster_limit(),
        gr.smem_limit("smem", _smem_need, "{stages} stages of {tile_m}x{tile_n}x{tile_k} + epilogue + barriers"),
        # launch arguments last: they are checked once the compiled kernel's knobs have passed
        constraint("decomposition-streamk",
                   lambda p, ctx: p["scheduler"] == "streamk" or (p["decomposition"] == "heuristic"
                                                                  and p["splits"] == 1),
                   "the persistent scheduler takes no decomposition or splits (decomposition {decomposition}, "
                   "splits {splits}): they are stream-K arguments"),
        constraint("splits", _split_split, "splits > 1 goes with the splitk decomposition and only with it "
                   "(decomposition {decomposition}, splits {splits})"),
        constraint("splits-fit-k", _split_fits_k,
                   "{splits} splits of K {ctx.problem.k} leave a slice under one tile K"),
    ],
    description="CUTLASS C++ sm90 GEMM: cooperative/ping-pong TMA warp-specialised kernels, persistent or stream-K",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

"""int8 conv2d fprop on Hopper with CUTLASS C++ (CUTLASS 3.x: TMA im2col and WGMMA), NHWC, for the conv2d workload.

The convolution runs as an implicit GEMM (``M = N*P*Q`` output pixels, ``N = K``
filters, ``K = C*R*S``) whose activation tiles TMA gathers in im2col mode, so no
thread computes an address; the MMA is WGMMA on int8 with int32 accumulation,
which the CUTLASS 2.x kernels of ``cutlass_conv2d_int8`` (mma.sync) cannot
use. CUTLASS's TMA im2col reads channels-last tensors only: this space serves
``layout = "nhwc"``.

The knobs are the kernel's template parameters, all compiled in: the CTA tile
``tile_m x tile_n x tile_k``, the ``cluster`` shape (the filter tile is
multicast along M, the activation tile along N), the pipeline depth
(``stages``; 0 takes the most that fit, as CUTLASS computes it) and the
``epilogue`` (``tma``: staged through shared memory and stored with TMA;
``nosmem``: registers straight to global). CUTLASS 4.2 builds its sm90
convolutions with the basic warp-specialised schedule only (a producer and a
consumer warpgroup, one output tile per CTA), so the schedule, tile scheduler
and split-K of ``cutlass_sm90_gemm`` are not offered here; a second CTA on the
same SM (when two fit) is what overlaps one tile's epilogue with another's
mainloop.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.space import Context
    from evotune.measurement.workloads.conv2d_shape import ConvShape
    from search_spaces.cutlass_sm90_conv2d_int8 import SPACE

    problem = ConvShape(10, 128, 72, 120, 128, 3, 3, pad=1, scaling="tensor").problem("int8", "nhwc")
    ctx = Context(get_hardware("H100"), problem)
    point = {"tile_m": 128, "tile_n": 128, "tile_k": 128, "cluster": (1, 1), "stages": 0, "epilogue": "tma"}
    SPACE.check(point, ctx)                         # None: feasible
    SPACE.check(dict(point, tile_n=256), ctx)
    # 'accumulators: a 128x256 tile needs 256 int32 accumulators per consumer thread; ...'
"""

from __future__ import annotations

import dataclasses
import math

from evotune.authoring import (
    Context,
    ConvShape,
    Needs,
    Point,
    Problem,
    SearchSpace,
    categorical,
    constraint,
    deferred,
    hardware_limit,
    ordinal,
    tuples,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr
from search_spaces.cutlass_conv2d_int8 import _is_conv, implicit_gemm

DEFAULT_PROBLEM = ConvShape(10, 128, 72, 120, 128, 3, 3, pad=1, scaling="tensor").problem("int8", "nhwc")
SMEM_CAPACITY = 232448  # CUTLASS's sm90 shared-memory capacity, from which the automatic stage count is taken
STAGE_BARRIERS = 16  # a full and an empty mbarrier per stage, counted in CUTLASS's automatic stage count
# The most int32 accumulators a consumer thread keeps without spilling: the basic schedule sets no register
# split, so a thread may have 255 (ptxas -v, nvcc 13.0: 128x192 uses 254 registers and spills nothing)
MAX_ACCUMULATORS = 192
# What the shared GEMM model does not see in this kernel, measured on the H100 (nvcc 13.0, CUTLASS 4.2, the
# shapes of experiments/h100_int8_conv_sm90.toml): with one consumer warpgroup, TMA must keep about 384 bytes of
# each row's K in flight (two 64-deep stages run 1.35-1.8x slower than three to six); the epilogue without
# shared memory stores 4 int8 per thread, uncoalesced (1.8x); a 256-deep K tile runs 1.5-1.9x slower than 128.
PIPELINE_BYTES = 384
NOSMEM_FACTOR = 1.8
DEEP_K_FACTOR = 1.5


def _problem(ctx: Context) -> Problem:
    return ctx.problem if ctx.problem is not None and ctx.problem.kind == "conv2d" else DEFAULT_PROBLEM


def _shape(ctx: Context) -> ConvShape:
    return ConvShape.of(_problem(ctx))


def accumulators(point: Point) -> int:
    """int32 accumulators per thread of the one consumer warpgroup (128 threads)."""
    return int(point["tile_m"]) * int(point["tile_n"]) // 128


def stage_bytes(point: Point) -> int:
    """One pipeline stage: the activation tile (tile_m x tile_k int8) and the filter tile (tile_n x tile_k)."""
    return gr.operand_stage_bytes(point["tile_m"], point["tile_n"], point["tile_k"], 1)


def epilogue_bytes(point: Point) -> int:
    """The TMA epilogue's int8 staging: two subtiles of at most 64 rows by 64 columns (32 unless tile_n is a
    multiple of 64), CUTLASS's automatic epilogue tile; none without shared memory."""
    if point["epilogue"] == "nosmem":
        return 0
    cols = 64 if point["tile_n"] % 64 == 0 else math.gcd(32, point["tile_n"])
    rows = min(64, point["tile_m"])
    subtiles = (point["tile_m"] // rows) * (point["tile_n"] // cols)
    return gr.epilogue_bytes(rows, cols, 1, min(subtiles, 2))


def stages(point: Point) -> int:
    """The pipeline depth: as set, or for 0 CUTLASS's carve-out rule (what is left beside the epilogue)."""
    if point["stages"]:
        return int(point["stages"])
    return (SMEM_CAPACITY - epilogue_bytes(point)) // (stage_bytes(point) + STAGE_BARRIERS)


def smem_bytes(point: Point) -> int:
    """The kernel's shared memory. The basic schedule's epilogue reuses the operand buffers (a union: the
    mainloop has finished when it runs), so the larger of the two counts, plus the barriers."""
    return max(stages(point) * stage_bytes(point), epilogue_bytes(point)) + gr.MBARRIER_RESERVE


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model, run on the implicit GEMM."""
    hw = gr.hardware_or_default(ctx)
    tiling = gm.Tiling(
        tile_m=point["tile_m"], tile_n=point["tile_n"], tile_k=point["tile_k"], stages=stages(point),
        smem_bytes=smem_bytes(point), cluster=tuple(point["cluster"]), threads=256,
    )
    # one tile per CTA: the epilogue overlaps another tile's mainloop only when a second CTA fits
    tiling = dataclasses.replace(tiling, wave_overhead_us=0.5 if gm.ctas_per_sm(tiling, hw) > 1 else 1.0)
    s = _shape(ctx)
    k_total = s.C * s.R * s.S
    in_flight = min(stages(point), math.ceil(k_total / point["tile_k"])) * point["tile_k"]
    factor = math.sqrt(max(1.0, min(PIPELINE_BYTES, k_total) / in_flight))
    factor *= NOSMEM_FACTOR if point["epilogue"] == "nosmem" else 1.0
    factor *= DEEP_K_FACTOR if point["tile_k"] == 256 else 1.0
    return gm.estimate_ms(tiling, implicit_gemm(_problem(ctx)), hw) * factor


def _aligned(p: Point, ctx: Context) -> bool:
    s = _shape(ctx)
    return s.C % gr.TMA_ALIGN_BYTES == 0 and s.K % gr.TMA_ALIGN_BYTES == 0


SPACE = SearchSpace(
    name="cutlass_sm90_conv2d_int8",
    workload="conv2d",
    # nvcc a configuration into a shared library (returns fn(x, w, scale, y)), or only fill the cache
    build=deferred("search_spaces._cutlass_sm90_conv", "build"),
    precompile=deferred("search_spaces._cutlass_sm90_conv", "precompile"),
    needs=Needs(programs=("nvcc",), check=deferred("search_spaces._cutlass_build", "headers_missing")),
    # the CUTLASS 2.x hand-picked configuration, timed beside cuDNN in every run
    baselines=deferred("search_spaces._cutlass_sm90_conv", "baselines"),
    params=[
        ordinal("tile_m", [64, 128, 256], doc="CTA tile M (output pixels)"),
        ordinal("tile_n", [32, 64, 128, 192, 256], doc="CTA tile N (filters; WGMMA N)"),
        ordinal("tile_k", [64, 128, 256], doc="CTA tile K (channels of one filter tap), in int8 elements"),
        tuples("cluster", [(1, 1), (2, 1), (1, 2), (2, 2)],
               doc="cluster shape (M, N): the filter tile is multicast along M, the activation tile along N"),
        ordinal("stages", [0, 2, 3, 4, 5, 6], doc="operand pipeline depth; 0: the most that fit"),
        categorical("epilogue", ["tma", "nosmem"], doc="store y through shared memory with TMA, or directly"),
    ],
    constraints=[
        gr.sm90_arch_limit(),
        constraint("workload", lambda p, ctx: _is_conv(ctx), "this space computes conv2d, not {ctx.problem.kind}"),
        constraint("dtype", lambda p, ctx: _problem(ctx).dtype == "int8",
                   "this space computes int8 convolutions, not {ctx.problem.dtype}"),
        constraint("layout", lambda p, ctx: _problem(ctx).layout == "nhwc",
                   "TMA im2col reads channels-last tensors: layout nhwc, not {ctx.problem.layout} (the CUTLASS 2.x "
                   "space cutlass_conv2d_int8 runs nc32hw32)"),
        constraint("scaling", lambda p, ctx: _shape(ctx).scaling == "tensor",
                   "the epilogue scales the output by one number; per-channel scaling is not offered"),
        hardware_limit("alignment", _aligned,
                       gr.Message("TMA needs C = {C} and K = {K} int8 channels to be multiples of 16 bytes",
                                  lambda p, ctx: vars(_shape(ctx)))),
        hardware_limit("accumulators", lambda p, ctx: accumulators(p) <= MAX_ACCUMULATORS,
                       gr.Message("a {tile_m}x{tile_n} tile needs {acc} int32 accumulators per consumer thread; "
                                  f"more than {MAX_ACCUMULATORS} spill",
                                  lambda p, ctx: {"acc": accumulators(p)})),
        gr.portable_cluster_limit(),
        gr.smem_limit("smem", lambda p, ctx: smem_bytes(p), "{stages} stages of {tile_m}x{tile_k} + {tile_n}x{tile_k} "
                      "int8, or the epilogue's staging, plus barriers"),
    ],
    description="CUTLASS C++ sm90 int8 conv2d fprop (3.x implicit GEMM: TMA im2col, WGMMA), NHWC",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

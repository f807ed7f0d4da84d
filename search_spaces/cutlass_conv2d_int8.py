"""int8 conv2d fprop with CUTLASS C++ (CUTLASS 2.x implicit GEMM through nvidia-cutlass), for the conv2d workload.

The convolution runs as an implicit GEMM: ``M = N*P*Q`` output pixels, ``N = K``
filters, ``K = C*R*S`` reduction. The knobs are CUTLASS's template parameters:

- compiled into the kernel: the threadblock tile ``tb_m x tb_n x tb_k``, the warp
  tile ``warp_m x warp_n`` (its K is the threadblock's), the tensor-core
  ``instruction`` (Ampere's 16x8x32 int8 MMA, or Turing's 8x8x16, which CUTLASS
  builds as a two-stage pipeline), ``stages`` of the operand pipeline, the
  ``iterator`` over the activation (``analytic``, ``optimized``; ``fixed_channels``
  and ``few_channels`` for NHWC inputs with few channels), the operands'
  ``alignment`` (int8 elements per global load) and the ``epilogue``'s vector
  width (int8 outputs per store);
- an argument at launch: the threadblock ``swizzle``, the band of tiles along N
  that consecutive CTAs walk (CUTLASS's ``GemmIdentityThreadblockSwizzle<N>``).

Layouts: ``nc32hw32`` (CUTLASS's ``TensorNCxHWx<32>``, ``TensorCxRSKx<32>`` filter) and
``nhwc``. The output is ``clamp(round(scale * acc))`` to int8 with one scale for the
tensor (``LinearCombinationClamp``); per-channel scaling is pruned. Split-K is not
offered: serial split-K would round each slice's partial sums to int8.

A compiled kernel is shape-free (the problem is an argument), so one nvcc run
(about a minute) serves every convolution of its layout and every swizzle.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.space import Context
    from evotune.core.problem import get_workload
    from search_spaces.cutlass_conv2d_int8 import SPACE, HAND_PICKED

    problem = get_workload("conv2d").parse({"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3,
                                            "pad": 1, "dtype": "int8", "layout": "nc32hw32"})
    ctx = Context(get_hardware("H100"), problem)
    SPACE.check(HAND_PICKED, ctx)                       # None: feasible
    SPACE.check(dict(HAND_PICKED, tb_k=32), ctx)
    # "warp-k-steps: tb_k 32 is 1 step(s) of the instruction's K; CUTLASS's warp-level pipeline needs an ..."
"""

from __future__ import annotations

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

DEFAULT_PROBLEM = ConvShape(10, 128, 72, 120, 128, 3, 3, pad=1, scaling="tensor").problem("int8", "nc32hw32")
INTERLEAVE = 32
# The most int32 accumulators a thread keeps; CUTLASS's own int8 configurations stop at a 64x64 warp tile
# (128 per thread) beside the operand fragments, within the 255 registers a thread may have.
MAX_ACCUMULATORS = 128
# Registers a thread needs besides its accumulators: operand fragments (double-buffered), addresses,
# predicates and the epilogue (ptxas -v of the hand-picked 64x64 warp tile: 128 accumulators, 250 registers)
REGISTER_OVERHEAD = 122

HAND_PICKED_NAME = "hand-picked 128x128x64 4-stage"  # the label of HAND_PICKED among the named configurations
# The configuration CUTLASS's int8 interleaved examples and a typical hand-written deployment use.
HAND_PICKED: Point = {
    "tb_m": 128, "tb_n": 128, "tb_k": 64, "warp_m": 64, "warp_n": 64, "instruction": (16, 8, 32), "stages": 4,
    "iterator": "optimized", "alignment": 16, "epilogue": 8, "swizzle": 1,
}


def _shape(ctx: Context) -> ConvShape:
    p = ctx.problem if ctx.problem is not None and ctx.problem.kind == "conv2d" else DEFAULT_PROBLEM
    return ConvShape.of(p)


def _problem(ctx: Context) -> Problem:
    return ctx.problem if ctx.problem is not None and ctx.problem.kind == "conv2d" else DEFAULT_PROBLEM


def warps(point: Point) -> int:
    return (int(point["tb_m"]) // int(point["warp_m"])) * (int(point["tb_n"]) // int(point["warp_n"]))


def threads(point: Point) -> int:
    return 32 * warps(point)


def accumulators(point: Point) -> int:
    """int32 accumulators per thread: the warp tile over a warp's 32 threads."""
    return int(point["warp_m"]) * int(point["warp_n"]) // 32


def registers(point: Point) -> int:
    return accumulators(point) + REGISTER_OVERHEAD


def smem_bytes(point: Point) -> int:
    """The kernel's shared memory: the operand stages (int8 A and B tiles); the epilogue reuses them."""
    return int(point["stages"]) * (int(point["tb_m"]) + int(point["tb_n"])) * int(point["tb_k"])


def implicit_gemm(problem: Problem) -> Problem:
    """The GEMM the convolution runs as: ``(N*P*Q) x K x (C*R*S)`` in int8."""
    s = ConvShape.of(problem)
    return Problem.gemm(s.N * s.P * s.Q, s.K, s.C * s.R * s.S, "int8")


def swizzle_log(n_tiles: int, swizzle: int) -> int:
    """CUTLASS's ``GemmIdentityThreadblockSwizzle`` rule: the band it really uses for ``n_tiles`` tiles along N."""
    if swizzle >= 8 and n_tiles >= 6:
        return 3
    if swizzle >= 4 and n_tiles >= 3:
        return 2
    if swizzle >= 2 and n_tiles >= 2:
        return 1
    return 0


def _n_tiles(p: Point, ctx: Context) -> int:
    return math.ceil(_shape(ctx).K / int(p["tb_n"]))


def _warp_k_steps(p: Point) -> int:
    return int(p["tb_k"]) // int(p["instruction"][2])


def _channels_ok(p: Point, ctx: Context) -> bool:
    """kFixedChannels reads one pixel's C channels in one access (C equal to the alignment); kFewChannels
    reads C in alignment-wide pieces with C at most the alignment times the threads' share of tb_k."""
    c, alignment = _shape(ctx).C, int(p["alignment"])
    if p["iterator"] == "fixed_channels":
        return c == alignment
    if p["iterator"] == "few_channels":
        return c % alignment == 0 and c < int(p["tb_k"])
    return True


def interleaved_thread_map(point: Point) -> bool:
    """Whether CUTLASS's thread map for interleaved operands covers both tiles. Each operand tile is
    ``tb_k / 32`` rows of 32-channel vectors, loaded 16 int8 at a time by warps of 32 threads
    (``PitchLinearWarpRakedThreadMap`` transposed for shared memory): every warp must load at most one of
    those rows (``tb_k / 32 <= warps``, or the transposed map iterates twice along its contiguous side), and
    the warps that share a row must split its ``tile / 16`` warp-wide accesses evenly."""
    rows, w = point["tb_k"] // INTERLEAVE, warps(point)
    share = max(1, w // rows)  # warps side by side on one row
    return rows <= w and all((tile // 16) % share == 0 and tile // 16 >= share
                             for tile in (point["tb_m"], point["tb_n"]))


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model, run on the implicit GEMM."""
    hw = gr.hardware_or_default(ctx)
    gemm = implicit_gemm(_problem(ctx))
    inst = point["instruction"]
    tiling = gm.Tiling(
        tile_m=point["tb_m"], tile_n=point["tb_n"], tile_k=point["tb_k"], stages=point["stages"],
        smem_bytes=smem_bytes(point), threads=threads(point), regs_per_thread=registers(point),
        # mma.sync, not WGMMA; Turing's 8x8x16 MMA does half the work of 16x8x32 per instruction
        mma_rate=gm.LEGACY_MMA_RATE * (0.5 if inst == (8, 8, 16) else 1.0),
        band=1 << swizzle_log(math.ceil(gemm.n / point["tb_n"]), point["swizzle"]), band_along_m=False,
        # the analytic iterator recomputes every filter offset on each K step
        wave_overhead_us=1.5 if point["iterator"] == "analytic" else 1.0,
    )
    return gm.estimate_ms(tiling, gemm, hw)


def _with_sizes(template: str) -> gr.Message:
    """A message that may name the convolution's sizes (``{C}``, ``{K}``...)."""
    return gr.Message(template, lambda p, ctx: vars(_shape(ctx)))


def _is_conv(ctx: Context) -> bool:
    return ctx.problem is None or ctx.problem.kind == "conv2d"


SPACE = SearchSpace(
    name="cutlass_conv2d_int8",
    workload="conv2d",
    # nvcc a configuration into a shared library (returns fn(x, w, scale, y)), or only fill the cache
    build=deferred("search_spaces._cutlass_conv", "build"),
    precompile=deferred("search_spaces._cutlass_conv", "precompile"),
    needs=Needs(programs=("nvcc",), check=deferred("search_spaces._cutlass_build", "headers_missing")),
    params=[
        ordinal("tb_m", [64, 128, 256], doc="threadblock tile M (output pixels)"),
        ordinal("tb_n", [32, 64, 128, 256], doc="threadblock tile N (filters)"),
        ordinal("tb_k", [32, 64, 128], doc="threadblock tile K (channels x filter taps), in int8 elements"),
        ordinal("warp_m", [32, 64], doc="warp tile M"),
        ordinal("warp_n", [32, 64], doc="warp tile N"),
        tuples("instruction", [(16, 8, 32), (8, 8, 16)], doc="tensor-core MMA shape (Ampere 16x8x32, Turing 8x8x16)"),
        ordinal("stages", [2, 3, 4, 5, 6], doc="operand pipeline depth"),
        categorical("iterator", ["analytic", "optimized", "fixed_channels", "few_channels"],
                    doc="activation iterator: CUTLASS's IteratorAlgorithm"),
        ordinal("alignment", [4, 8, 16], doc="int8 elements per global load of the activation and the filter"),
        ordinal("epilogue", [4, 8, 16], doc="int8 outputs per store of the epilogue"),
        ordinal("swizzle", [1, 2, 4, 8], doc="band of tiles along N that consecutive CTAs walk (launch argument)"),
    ],
    constraints=[
        hardware_limit("arch", lambda p, ctx: ctx.hardware is None or ctx.hardware.arch == "sm_90a",
                       "the kernels are built for sm_90a; {ctx.hardware.name} is {ctx.hardware.arch}"),
        constraint("workload", lambda p, ctx: _is_conv(ctx), "this space computes conv2d, not {ctx.problem.kind}"),
        constraint("dtype", lambda p, ctx: _problem(ctx).dtype == "int8",
                   "this space computes int8 convolutions, not {ctx.problem.dtype}"),
        constraint("scaling", lambda p, ctx: _shape(ctx).scaling == "tensor",
                   "LinearCombinationClamp scales the output by one number; per-channel scaling is not offered"),
        constraint("warp-tile", lambda p, ctx: p["tb_m"] % p["warp_m"] == 0 and p["tb_n"] % p["warp_n"] == 0,
                   "a {warp_m}x{warp_n} warp tile does not divide the {tb_m}x{tb_n} threadblock tile"),
        constraint("warp-k-steps", lambda p, ctx: _warp_k_steps(p) >= 2 and _warp_k_steps(p) % 2 == 0,
                   gr.Message("tb_k {tb_k} is {steps} step(s) of the instruction's K; CUTLASS's warp-level pipeline "
                              "needs an even number, at least 2", lambda p, ctx: {"steps": _warp_k_steps(p)})),
        constraint("turing-two-stage", lambda p, ctx: p["instruction"] != (8, 8, 16) or p["stages"] == 2,
                   "the 8x8x16 MMA is offered as CUTLASS's Turing kernels use it, with a two-stage pipeline; "
                   "with {stages} stages it compiles and has never run on a GPU"),
        constraint("iterator-layout", lambda p, ctx: p["iterator"] in ("analytic", "optimized")
                   or _problem(ctx).layout == "nhwc",
                   "the {iterator} iterator reads NHWC activations; {ctx.problem.layout} is interleaved"),
        constraint("iterator-channels", _channels_ok,
                   _with_sizes("the {iterator} iterator does not fit C = {C} with alignment {alignment} and tb_k "
                               "{tb_k} (fixed_channels: C equal to the alignment; few_channels: C a multiple of it, "
                               "below tb_k)")),
        constraint("interleaved-thread-map", lambda p, ctx: _problem(ctx).layout != "nc32hw32"
                   or interleaved_thread_map(p),
                   "CUTLASS's interleaved thread map does not cover a {tb_m}x{tb_n}x{tb_k} tile with "
                   "{warp_m}x{warp_n} warps (each warp loads at most one 32-channel row of tb_k, and the warps "
                   "on a row split it evenly)"),
        constraint("interleaved-alignment", lambda p, ctx: _problem(ctx).layout != "nc32hw32" or p["alignment"] == 16,
                   "nc32hw32 tiles are loaded 16 int8 at a time (128 bits); alignment {alignment} does not apply"),
        hardware_limit("alignment-channels", lambda p, ctx: _shape(ctx).C % p["alignment"] == 0,
                       _with_sizes("loads of {alignment} int8 need C = {C} to be a multiple of them")),
        hardware_limit("epilogue-filters", lambda p, ctx: _shape(ctx).K % p["epilogue"] == 0,
                       _with_sizes("stores of {epilogue} int8 need K = {K} to be a multiple of them")),
        constraint("interleaved-epilogue", lambda p, ctx: _problem(ctx).layout != "nc32hw32" or p["epilogue"] == 8,
                   "CUTLASS's interleaved epilogue stores 8 int8 (64 bits) at a time: with {epilogue} it compiles, "
                   "and writes channels 4 to 15 of every 32 wrong (seen on the H100)"),
        constraint("nhwc-thread-map", lambda p, ctx: _problem(ctx).layout != "nhwc" or all(
                       tile * p["tb_k"] // 16 >= threads(p) for tile in (p["tb_m"], p["tb_n"])),
                   "CUTLASS's NHWC thread map gives every thread at least one 16-byte piece of each operand tile: "
                   "{tb_m}x{tb_k} and {tb_n}x{tb_k} int8 are too small for {warp_m}x{warp_n} warps"),
        constraint("nhwc-epilogue", lambda p, ctx: _problem(ctx).layout != "nhwc" or p["epilogue"] <= 8,
                   "CUTLASS's NHWC epilogue thread map leaves no rows or columns to some threads at 16 outputs "
                   "per store; stores of {epilogue} are not offered for nhwc"),
        hardware_limit("threads", lambda p, ctx: threads(p) <= 512,
                       "{tb_m}x{tb_n} over {warp_m}x{warp_n} warps is more than 16 warps"),
        hardware_limit("accumulators", lambda p, ctx: accumulators(p) <= MAX_ACCUMULATORS,
                       "a {warp_m}x{warp_n} warp tile keeps more than "
                       f"{MAX_ACCUMULATORS} int32 accumulators per thread"),
        hardware_limit("registers", lambda p, ctx: registers(p) * threads(p) <= gr.hardware_or_default(ctx).regs_per_sm,
                       "{tb_m}x{tb_n} over {warp_m}x{warp_n} warps needs more registers than an SM has"),
        gr.smem_limit("smem", lambda p, ctx: smem_bytes(p), "{stages} stages of {tb_m}x{tb_k} + {tb_n}x{tb_k} int8"),
        # the launch argument last: checked once the compiled knobs have passed
        constraint("swizzle-band", lambda p, ctx: p["swizzle"] == 1 << swizzle_log(_n_tiles(p, ctx), p["swizzle"]),
                   "swizzle {swizzle} wants a band of {swizzle} tiles along N, and K has fewer tiles of {tb_n}: "
                   "CUTLASS would run a narrower band, the same kernel as a smaller swizzle"),
    ],
    description="CUTLASS C++ int8 conv2d fprop (2.x implicit GEMM, mma.sync with saturation), NC/32HW32 or NHWC",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
    named={HAND_PICKED_NAME: HAND_PICKED},
)

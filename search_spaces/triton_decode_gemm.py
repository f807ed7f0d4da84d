"""A Triton GEMM for decode: few rows (M from 1 to 64), a weight matrix streamed once from HBM.

At decode time ``y = x @ W^T`` is memory-bound: ``x`` is a few rows, ``W`` (N x K) is read once
and is nearly all the bytes. The kernel (``_triton_decode.py``) is built for that stream:

* the weight tile is a ``BLOCK_N x BLOCK_K`` slab read along K (layout ``tn``), so each thread
  loads whole 16-byte vectors;
* ``num_stages`` shared-memory buffers keep the stream in flight (software pipelining of the K loop);
* ``SPLIT_K`` programs share each output tile's K range, so a short, wide problem still has enough
  programs for every SM; their partial tiles are summed by a second kernel (``REDUCE = "sum"``:
  fp32, int32 for int8, deterministic), added with atomics (``"atomic"``), or summed by the last split
  of each tile to finish, in the same launch (``"last"``: no second kernel, deterministic);
* rows past M are wrapped copies, never masked loads: ``BLOCK_M`` is 16 at least for ``tl.dot`` (the
  tensor-core tile), and no wider than M needs;
* a ``BLOCK_M`` under 16 is the GEMV path, for M of 8 or less: no ``tl.dot`` (a tensor-core tile would
  multiply 16 rows where M has one), each weight tile converted in registers, multiplied by each row of ``x``
  and summed along K on the CUDA cores; its one M tile holds every row (M rounded up to a power of two), so
  the weight is streamed once.

bf16, fp16, int8 (int8 x int8 -> int32, as ``torch._int_mm``) and fp8 (e4m3 -> bf16; sm_89 and newer),
unscaled or scaled per tensor or per row (the scales applied in each program's epilogue, the kernel called
as ``fn(a, b, scale_a, scale_b, c)``; block scaling is ``triton_block_fp8``'s). ``build`` compiles a
configuration; verification and timing are the GEMM defaults of ``evotune.measurement.workloads.gemm``.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.triton_decode_gemm import SPACE

    ctx = Context(get_hardware("H100"), Problem.gemm(16, 4096, 11008, "int8"))
    feasible = SPACE.feasible(ctx)
    len(feasible), feasible.pruned.most_common(3)
"""

from __future__ import annotations

import functools
import math

from evotune.authoring import (
    Context,
    Hardware,
    Needs,
    Point,
    Problem,
    SearchSpace,
    categorical,
    constraint,
    deferred,
    hardware_limit,
    ordinal,
    power_of_two,
)
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr

DEFAULT_PROBLEM = Problem.gemm(16, 4096, 4096, "bf16")
TILE = gr.TritonTile("BLOCK_M", "BLOCK_N", "BLOCK_K")  # its shared memory and registers
DTYPES = ("bf16", "fp16", "int8", "fp8")
SCALINGS = ("", "tensor", "row")  # fp8: unscaled, or a scaled epilogue (see _triton_decode.py)
VECTOR_BYTES = 16  # the widest load a thread issues
MIN_SM_SHARE = 2  # at least one program per this many SMs (see _enough_programs)
MMA_ROWS = 16  # the tensor-core tile's rows: a BLOCK_M under it selects the GEMV path (no tl.dot)
BLOCK_N_MIN, BLOCK_K_MIN, SPLIT_K_MAX = 16, 64, 32  # the space's narrowest weight tile and most K splits
# CUDA-core FMA throughput as a share of the 16-bit tensor-core peak (H100 67 of 989 TFLOPS, A100 19.5 of 312)
CUDA_CORE_SHARE = 1 / 16
# share of a memory-bound kernel's arithmetic that its loads do not hide (the issue slots it takes from the load
# stream): it orders configurations that move the same bytes
UNHIDDEN = 0.25
# REDUCE=last: the most partial-tile values a thread of the finishing split loads in its unrolled sum (SPLIT_K times
# its share of the BLOCK_M x BLOCK_N tile). Measured on H200s (six tune-model runs, 1,295 REDUCE=last evaluations):
# at 512 the best came within 5% of its key's best, from 1,024 none within 40%, and builds grow with it: at 4,096
# one took 14-19 s (0.3-0.5 s typically) for a kernel 6-8x slower than its key's best
LAST_SUM_LOADS = 512


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def k_blocks(point: Point, problem: Problem) -> int:
    return -(-problem.k // int(point["BLOCK_K"]))


def programs(point: Point, problem: Problem) -> int:
    """Programs (CTAs) of the main kernel: output tiles times K splits."""
    return -(-problem.m // int(point["BLOCK_M"])) * -(-problem.n // int(point["BLOCK_N"])) * int(point["SPLIT_K"])


def gemv(point: Point) -> bool:
    """The GEMV path: fewer rows per program than a tensor-core tile, multiplied on the CUDA cores."""
    return bool(point["BLOCK_M"] < MMA_ROWS)


def _rows(problem: Problem) -> int:
    """M rounded up to a power of two."""
    return 1 << (problem.m - 1).bit_length()


def _m_rows_ok(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return problem is None or p["BLOCK_M"] <= max(MMA_ROWS, _rows(problem))


def _gemv_rows_ok(p: Point, ctx: Context) -> bool:
    """The GEMV path takes every row in its one M tile (M up to 8): several would each stream the weight."""
    problem = gr.gemm_problem(ctx)
    return problem is None or not gemv(p) or p["BLOCK_M"] == _rows(problem)


def gemv_registers(p: Point) -> int:
    """32-bit registers per thread of the GEMV path: its weight tile converted to 32 bits, beside the
    accumulator and the fixed overhead the tensor-core path needs too."""
    return int(-(-p["BLOCK_N"] * p["BLOCK_K"] // TILE.threads(p)) + TILE.registers(p))


def _gemv_registers_ok(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or not gemv(p) or gemv_registers(p) <= ctx.hardware.regs_per_thread


def _layout_ok(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return problem is None or problem.layout == "tn"


def _reduce_ok(p: Point, ctx: Context) -> bool:
    return int(p["SPLIT_K"]) > 1 or p["REDUCE"] == "sum"


def _splits_ok(p: Point, ctx: Context) -> bool:
    """Every split gets K blocks: with ``ceil(blocks / SPLIT_K)`` blocks each, exactly SPLIT_K splits have some."""
    problem = gr.gemm_problem(ctx)
    if problem is None:
        return True
    blocks, split = k_blocks(p, problem), int(p["SPLIT_K"])
    return -(-blocks // -(-blocks // split)) == split


def most_programs(problem: Problem) -> int:
    """The most programs any configuration of the space launches for ``problem``: the smallest output tiles (all of
    M in one GEMV tile under 16 rows, else 16 rows; the narrowest weight tile) times the most K splits of the
    shortest K blocks that leave no split without work."""
    return _most_programs(problem.m, problem.n, problem.k)


@functools.cache
def _most_programs(m: int, n: int, k: int) -> int:
    # once a shape: the programs rule asks it of every point a feasible set enumerates
    m_tiles = 1 if m < MMA_ROWS else -(-m // MMA_ROWS)
    blocks = -(-k // BLOCK_K_MIN)
    splits = max(s for s in _powers_of_two(1, SPLIT_K_MAX) if s <= blocks and -(-blocks // -(-blocks // s)) == s)
    return m_tiles * -(-n // BLOCK_N_MIN) * splits


def _powers_of_two(low: int, high: int) -> list[int]:
    return [1 << i for i in range(low.bit_length() - 1, high.bit_length())]


def _enough_programs(p: Point, ctx: Context) -> bool:
    """A memory-bound kernel on fewer programs than half the SMs leaves the idle SMs' share of the bandwidth
    unused (one SM's loads in flight cannot draw much more than its share). A problem too small for that (a small
    layer's few weight rows and K blocks) takes at least half the programs it can have."""
    problem = gr.gemm_problem(ctx)
    return problem is None or ctx.hardware is None or \
        programs(p, problem) * MIN_SM_SHARE >= min(ctx.hardware.sm_count, most_programs(problem))


def _vector_loads_ok(p: Point, ctx: Context) -> bool:
    """Every thread loads at least one full vector of the weight tile per K step."""
    return int(p["BLOCK_N"]) * int(p["BLOCK_K"]) * _problem(ctx).in_bytes >= TILE.threads(p) * VECTOR_BYTES


def last_sum_loads(p: Point) -> int:
    """Values each thread of REDUCE=last's finishing split loads in its sum: every split's partial tile, unrolled."""
    return int(p["SPLIT_K"]) * -(-int(p["BLOCK_M"]) * int(p["BLOCK_N"]) // TILE.threads(p))


def _last_sum_ok(p: Point, ctx: Context) -> bool:
    return p["REDUCE"] != "last" or last_sum_loads(p) <= LAST_SUM_LOADS


def _fp8_supported(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return ctx.hardware is None or problem is None or problem.dtype != "fp8" or ctx.hardware.has("fp8")


def arithmetic_ms(point: Point, problem: Problem, hw: Hardware) -> float:
    """The multiplications alone, in ms: the GEMV path's on the CUDA cores (per weight element, a conversion
    and a multiply-add per row of its tile), the tensor-core path's over whole tiles of BLOCK_M rows (the rows
    past M too) at its MMA's rate."""
    m_pad = -(-problem.m // point["BLOCK_M"]) * point["BLOCK_M"]
    if gemv(point):
        ops = problem.n * problem.k * (2 * m_pad + 1)
        return float(ops / (gm.peak_tflops(hw, "bf16") * 1e12 * CUDA_CORE_SHARE) * 1e3)
    t = TILE.tiling(point, problem, hw, split_k=point["SPLIT_K"])
    rate = gm.peak_tflops(hw, problem.dtype) * 1e12 * t.mma_rate * gm.mma_efficiency(t)
    return float(2.0 * m_pad * problem.n * problem.k / rate * 1e3)


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown), plus
    what the model leaves out for decode: each M tile streams the whole weight from HBM (the grid walks N
    first, so the M tiles of one weight tile run a whole grid row apart), and the share UNHIDDEN of the
    arithmetic (:func:`arithmetic_ms`) shows beside the stream."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    # the GEMV path leaves the tensor cores idle: the model's MMA term drops out (its arithmetic is added below)
    fields = {"mma_rate": math.inf, "regs_per_thread": gemv_registers(point)} if gemv(point) else {}
    # the rows past M are wrapped copies of rows a stage holds already: not bytes in flight from memory
    rows = min(point["BLOCK_M"], problem.m)
    ms = gm.estimate_ms(TILE.tiling(point, problem, hw, split_k=point["SPLIT_K"], a_rows=rows, **fields),
                        problem, hw)
    restreams = -(-problem.m // point["BLOCK_M"]) - 1
    ms += restreams * problem.n * problem.k * problem.in_bytes / (hw.hbm_gbps * 1e9) * 1e3
    return float(ms + UNHIDDEN * arithmetic_ms(point, problem, hw))


SPACE = SearchSpace(
    name="triton_decode_gemm",
    # compile a configuration (returns fn(a, b, c)), or only fill the kernel cache: GPU-only code
    build=deferred("search_spaces._triton_decode", "build"),
    precompile=deferred("search_spaces._triton_decode", "precompile"),
    needs=Needs(modules=("triton",)),
    params=[
        power_of_two("BLOCK_M", 1, 64, doc="rows per program: 16 or more multiply with tl.dot (the tensor-core "
                                           "tile), fewer take the GEMV path (CUDA cores; all of M in one tile)"),
        power_of_two("BLOCK_N", BLOCK_N_MIN, 256, doc="weight rows (outputs) per program"),
        power_of_two("BLOCK_K", BLOCK_K_MIN, 512, doc="K elements per pipeline step of the weight stream"),
        power_of_two("SPLIT_K", 1, SPLIT_K_MAX, doc="programs sharing one output tile's K range"),
        categorical("REDUCE", ["sum", "atomic", "last"],
                    doc="how split-K partials meet: a reduction kernel over fp32 partials, atomic adds, or the "
                        "last split of each tile summing them in the same launch"),
        ordinal("num_warps", [2, 4, 8], doc="warps per program"),
        ordinal("num_stages", [2, 3, 4, 5, 6], doc="software-pipeline depth of the weight stream"),
    ],
    constraints=[
        gr.dtype_rule(DTYPES, "triton_decode_gemm", SCALINGS),
        # Triton lowers e4m3 dots only on sm_89 and newer
        hardware_limit("fp8", _fp8_supported, "fp8 inputs need fp8 tensor cores; {ctx.hardware.name} has none"),
        constraint("layout", _layout_ok, "the kernel streams K-contiguous operands: layout tn only, not "
                                         "{ctx.problem.layout}"),
        constraint("block-m", _m_rows_ok, "BLOCK_M={BLOCK_M} is wider than M={ctx.problem.m} needs (the rows past "
                                          "M are wrapped copies)"),
        constraint("gemv-rows", _gemv_rows_ok,
                   "BLOCK_M={BLOCK_M} is the GEMV path, which takes all of M={ctx.problem.m} in one tile: its BLOCK_M "
                   "is M rounded up to a power of two, under 16"),
        constraint("reduce", _reduce_ok, "REDUCE={REDUCE} with SPLIT_K=1 has nothing to reduce (the kernel of "
                                         "REDUCE=sum)"),
        constraint("split-k", _splits_ok,
                   gr.Message("K={ctx.problem.k} is {blocks} blocks of BLOCK_K={BLOCK_K}: SPLIT_K={SPLIT_K} would "
                              "leave a split without work",
                              lambda p, ctx: {"blocks": k_blocks(p, _problem(ctx))})),
        constraint("last-sum", _last_sum_ok,
                   gr.Message("REDUCE=last sums {SPLIT_K} partial {BLOCK_M}x{BLOCK_N} tiles over {num_warps} warps "
                              "unrolled: {loads} loads a thread, over {most} (it builds for seconds and runs slower "
                              "than a smaller split or tile)",
                              lambda p, ctx: {"loads": last_sum_loads(p), "most": LAST_SUM_LOADS})),
        constraint("vector-loads", _vector_loads_ok,
                   "a {BLOCK_N}x{BLOCK_K} weight tile is less than one 16-byte vector per thread of {num_warps} "
                   "warps"),
        hardware_limit("programs", _enough_programs,
                       gr.Message("{programs} programs leave more than half of the {ctx.hardware.sm_count} SMs, and "
                                  "their share of the memory bandwidth, idle",
                                  lambda p, ctx: {"programs": programs(p, _problem(ctx))})),
        gr.smem_limit("smem", lambda p, ctx: TILE.smem_bytes(p, _problem(ctx)),
                      "{num_stages} stages of ({BLOCK_M}+{BLOCK_N})x{BLOCK_K}"),
        *TILE.register_limits(),
        hardware_limit("gemv-registers", _gemv_registers_ok,
                       gr.Message("the GEMV path's {BLOCK_N}x{BLOCK_K} weight tile in 32 bits needs about {regs} "
                                  "registers per thread over {num_warps} warps, {ctx.hardware.name} allows "
                                  "{ctx.hardware.regs_per_thread}", lambda p, ctx: {"regs": gemv_registers(p)})),
    ],
    description="Triton split-K GEMM for decode (M up to 64): a pipelined weight stream on the tensor cores "
                "or, for M up to 8, a GEMV on the CUDA cores, reduced by a second kernel, atomics or the last "
                "split of each tile",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

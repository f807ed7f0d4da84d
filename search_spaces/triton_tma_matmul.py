"""A Triton GEMM with TMA loads and stores on Hopper, one program per tile or persistent: prefill-sized GEMMs.

``triton_matmul`` loads its tiles through pointers; this family (``_triton_tma.py``) reads them through tensor
descriptors (TMA, sm_90 and newer), the way Triton's persistent-matmul tutorial does on Hopper, and writes C's
tile by a TMA store:

* ``GRID = "tiles"`` launches a program per output tile; ``"persistent"`` one per SM, each walking the tiles,
  with ``FLATTEN = 1`` the tile and K loops pipelined as one (the next tile's loads overlap the epilogue);
* tiles are ordered in bands of ``GROUP_M`` tile rows, so that the programs running together share weight tiles
  in L2;
* ``num_stages`` buffers of the A and W tiles keep the TMA loads ahead of the tensor cores; for fp8 a
  ``BLOCK_K`` of 128 is one 128-byte swizzle row.

Layout ``tn`` (A and the (N, K) weights K-contiguous, as a linear layer keeps them); fp8 (e4m3) with a bf16
output, unscaled or scaled per tensor (the kernel called as ``fn(a, b, scale_a, scale_b, c)``, as
``torch._scaled_mm``), bf16 and fp16. TMA needs each row's bytes to be a multiple of 16: K for the inputs,
N for C.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from evotune.core.space import Context
    from search_spaces.triton_tma_matmul import SPACE

    ctx = Context(get_hardware("H100"), Problem.gemm(4096, 28672, 4096, "fp8", "tn", "tensor"))
    feasible = SPACE.feasible(ctx)
    len(feasible), feasible.pruned.most_common(3)
"""

from __future__ import annotations

from evotune.authoring import (
    Context,
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

DEFAULT_PROBLEM = Problem.gemm(4096, 4096, 4096, "fp8", "tn", "tensor")
TILE = gr.TritonTile("BLOCK_M", "BLOCK_N", "BLOCK_K")  # its shared memory and registers
DTYPES = ("bf16", "fp16", "fp8")
SCALINGS = ("", "tensor")  # fp8: unscaled, or scaled per tensor in the epilogue
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2}  # C's element: fp8 writes bf16


def _problem(ctx: Context) -> Problem:
    return gr.problem_or(ctx, DEFAULT_PROBLEM)


def smem_bytes(p: Point, problem: Problem) -> int:
    """The operand stages and C's tile, staged for the TMA store."""
    return TILE.smem_bytes(p, problem) + int(p["BLOCK_M"]) * int(p["BLOCK_N"]) * OUT_BYTES.get(problem.dtype, 2)


def _tma_ok(p: Point, ctx: Context) -> bool:
    return ctx.hardware is None or ctx.hardware.has("tma")


def _fp8_supported(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return ctx.hardware is None or problem is None or problem.dtype != "fp8" or ctx.hardware.has("fp8")


def _layout_ok(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return problem is None or problem.layout == "tn"


def _aligned(p: Point, ctx: Context) -> bool:
    problem = gr.gemm_problem(ctx)
    return problem is None or (problem.k * problem.in_bytes % gr.TMA_ALIGN_BYTES == 0
                               and problem.n * OUT_BYTES.get(problem.dtype, 2) % gr.TMA_ALIGN_BYTES == 0)


def _flatten_ok(p: Point, ctx: Context) -> bool:
    return bool(p["GRID"] == "persistent" or p["FLATTEN"] == 0)


def estimate(point: Point, ctx: Context) -> float:
    """Predicted time in ms from the shared roofline/wave model (default problem and H100 when unknown)."""
    problem, hw = _problem(ctx), gr.hardware_or_default(ctx)
    tiling = TILE.tiling(point, problem, hw, smem_bytes=smem_bytes(point, problem),
                         persistent=point["GRID"] == "persistent", band=point["GROUP_M"], band_along_m=True)
    return gm.estimate_ms(tiling, problem, hw)


SPACE = SearchSpace(
    name="triton_tma_matmul",
    # compile a configuration (returns fn(a, b, c)), or only fill the kernel cache: GPU-only code
    build=deferred("search_spaces._triton_tma", "build"),
    precompile=deferred("search_spaces._triton_tma", "precompile"),
    needs=Needs(modules=("triton", "triton.tools.tensor_descriptor")),  # host-side descriptors: Triton 3.4+
    params=[
        power_of_two("BLOCK_M", 64, 256, doc="tile rows per program (64 at least: a warpgroup MMA)"),
        power_of_two("BLOCK_N", 64, 256, doc="tile columns per program"),
        power_of_two("BLOCK_K", 64, 256, doc="K elements per pipeline step"),
        ordinal("GROUP_M", [1, 4, 8, 16], doc="tile rows per band of the tile order (L2 reuse)"),
        categorical("GRID", ["tiles", "persistent"], doc="a program per tile, or one per SM walking the tiles"),
        ordinal("FLATTEN", [0, 1], doc="persistent: the tile and K loops pipelined as one"),
        ordinal("num_warps", [4, 8], doc="warps per program"),
        ordinal("num_stages", [2, 3, 4, 5], doc="TMA buffers of the A and W tiles"),
    ],
    constraints=[
        gr.dtype_rule(DTYPES, "triton_tma_matmul", SCALINGS),
        hardware_limit("tma", _tma_ok, "TMA needs sm_90 or newer; {ctx.hardware.name} is {ctx.hardware.arch}"),
        # Triton lowers e4m3 dots only on sm_89 and newer
        hardware_limit("fp8", _fp8_supported, "fp8 inputs need fp8 tensor cores; {ctx.hardware.name} has none"),
        constraint("layout", _layout_ok, "the kernel reads K-contiguous operands: layout tn only, not "
                                         "{ctx.problem.layout}"),
        constraint("tma-align", _aligned, "TMA needs rows of a multiple of 16 bytes: K={ctx.problem.k} inputs and "
                                          "N={ctx.problem.n} outputs are not"),
        constraint("flatten", _flatten_ok, "FLATTEN=1 pipelines a persistent program's tiles: GRID=tiles has one"),
        gr.smem_limit("smem", lambda p, ctx: smem_bytes(p, _problem(ctx)),
                      "{num_stages} stages of ({BLOCK_M}+{BLOCK_N})x{BLOCK_K} and a {BLOCK_M}x{BLOCK_N} C tile"),
        *TILE.register_limits(),
    ],
    description="Triton GEMM with TMA loads and stores, a program per tile or persistent (sm_90+): fp8 "
                "scaled per tensor, bf16, fp16",
    estimate=estimate,
    default_problem=DEFAULT_PROBLEM,
)

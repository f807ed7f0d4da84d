"""Shared pieces of the built-in GEMM spaces' constraints: shared-memory sizing, TMA alignment, the dtype,
architecture and cluster rules, messages that carry computed numbers, Triton's tile resources and the
context helpers (the time estimate is in :mod:`_gemm_model`).

Not a space itself (the leading underscore keeps it out of ``builtin_names()``).

Shared memory
    Operand stages hold a 128-byte K slice of A and B (``tile_k = 128 / in_bytes``
    elements: 64 for 16-bit inputs, 128 for 8-bit), the width of one 128-byte swizzle
    atom; the sm90 and sm100 CuTe kernels both pick ``tile_k`` this way (four MMA
    K-steps per stage).  Every kernel also reserves :data:`MBARRIER_RESERVE` bytes for
    pipeline mbarriers and the tile-scheduler bookkeeping, and each buffer is rounded up
    to the 1024-byte alignment that 128-byte swizzled layouts need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from evotune.authoring import Constraint, Context, Hardware, Point, Problem, constraint, get_hardware, hardware_limit
from search_spaces._gemm_model import LEGACY_MMA_RATE, Tiling

K_SLICE_BYTES = 128  # bytes of K per operand row and stage: one 128-byte swizzle atom
MBARRIER_RESERVE = 1024  # mbarriers (full/empty per stage, accumulator, epilogue) and scheduler state
CUTE_STATIC_SMEM = 1024  # static shared memory every CuTe DSL GEMM binary declares (.nv.shared), on top
SMEM_ALIGN = 1024  # 128-byte swizzled buffers start on 1024-byte boundaries
TMA_ALIGN_BYTES = 16  # TMA needs every global stride (the contiguous extent) to be a multiple of 16 bytes

DEFAULT_HARDWARE = "H100"


# -- context helpers ------------------------------------------------------------

@dataclass(frozen=True)
class TritonTile:
    """Where a Triton GEMM space's point keeps its tile sizes (``m``, ``n``, ``k``: the names of its block
    parameters), and what that tile takes before anything is compiled: each program's shared memory, its
    ``num_stages`` buffers of the A and B tiles, and its registers per thread, the fp32 (int32 for int8)
    accumulator spread over the program's threads plus a fixed overhead for pointers, offsets, masks and loop
    state. Triton's spaces share it so that their constraints estimate alike."""

    m: str
    n: str
    k: str

    ACC_BYTES: ClassVar[int] = 4
    REG_OVERHEAD: ClassVar[int] = 32
    WARP: ClassVar[int] = 32

    def threads(self, point: Point) -> int:
        return int(point["num_warps"]) * self.WARP

    def smem_bytes(self, point: Point, problem: Problem) -> int:
        return int(point["num_stages"] * (point[self.m] + point[self.n]) * point[self.k] * problem.in_bytes)

    def acc_registers(self, point: Point) -> int:
        """32-bit registers per thread for the accumulator tile, spread over every thread of the program."""
        return -(-int(point[self.m]) * int(point[self.n]) * self.ACC_BYTES // (self.threads(point) * 4))

    def registers(self, point: Point) -> int:
        return self.acc_registers(point) + self.REG_OVERHEAD

    def block_registers(self, point: Point) -> int:
        """Registers of the whole program, allocated in units of 8 per thread."""
        return -(-self.registers(point) // 8) * 8 * self.threads(point)

    def mma_rate(self, point: Point, hw: Hardware) -> float:
        """The tensor cores' rate for this tile, relative to the chip's peak: Triton issues a warpgroup MMA
        (wgmma, tcgen05) only for tiles of 64 rows or more over whole warpgroups (``num_warps`` a multiple of 4);
        any other tile falls back to mma.sync."""
        async_mma = hw.has("wgmma") or hw.has("tcgen05")
        warpgroups = point["num_warps"] % 4 == 0
        return LEGACY_MMA_RATE if async_mma and (point[self.m] < 64 or not warpgroups) else 1.0

    def tiling(self, point: Point, problem: Problem, hw: Hardware, **fields: Any) -> Tiling:
        """The estimate's view of one program of this tile (:class:`Tiling`); ``fields`` add or override what
        the kernel does beyond it (a raster band, split-K, a cluster)."""
        base: dict[str, Any] = dict(
            tile_m=point[self.m], tile_n=point[self.n], tile_k=point[self.k], stages=point["num_stages"],
            smem_bytes=self.smem_bytes(point, problem), threads=self.threads(point),
            regs_per_thread=self.registers(point), mma_rate=self.mma_rate(point, hw), wave_overhead_us=1.0)
        return Tiling(**{**base, **fields})

    def register_limits(self) -> list[Constraint]:
        """The program's registers against the GPU's: per thread, and per block (one SM's register file)."""
        return [
            hardware_limit("regs-per-thread",
                           lambda p, ctx: ctx.hardware is None or self.registers(p) <= ctx.hardware.regs_per_thread,
                           Message(f"needs about {{regs}} registers per thread ({{acc}} for the {{{self.m}}}x"
                                   f"{{{self.n}}} accumulator over {{num_warps}} warps + {{overhead}}), "
                                   "{ctx.hardware.name} allows {ctx.hardware.regs_per_thread}",
                                   lambda p, ctx: {"regs": self.registers(p), "acc": self.acc_registers(p),
                                                   "overhead": self.REG_OVERHEAD})),
            hardware_limit("regs-per-block",
                           lambda p, ctx: ctx.hardware is None or self.block_registers(p) <= ctx.hardware.regs_per_sm,
                           Message("needs {block_regs} registers per block, {ctx.hardware.name} has "
                                   "{ctx.hardware.regs_per_sm} per SM",
                                   lambda p, ctx: {"block_regs": self.block_registers(p)})),
        ]


def gemm_problem(ctx: Context) -> Problem | None:
    """The context's problem if it is a GEMM, else None (rules that need the shape are skipped)."""
    p = ctx.problem
    return p if p is not None and p.kind == "gemm" else None


def problem_or(ctx: Context, default: Problem) -> Problem:
    """The context's GEMM, or ``default`` (the space's default problem) when there is none."""
    return gemm_problem(ctx) or default


def hardware_or_default(ctx: Context) -> Hardware:
    """The context's GPU, or the H100 table entry when there is none."""
    return ctx.hardware or get_hardware(DEFAULT_HARDWARE)


def compiled_resources(ctx: Context, space: Any, point: Point) -> Any:
    """What the compiler measured for ``point`` (an ``evotune.core.compile_results.Compiled`` that built), or None."""
    table = ctx.compiled
    c = table.get(space, point) if table is not None else None
    return c if c is not None and c.ok and c.smem is not None else None


# -- messages that carry computed numbers -----------------------------------------
class Message(str):
    """A constraint message whose extra fields are computed from the point when it prunes.

    :class:`evotune.core.space.Constraint` formats its message with the point's values
    and ``ctx``; this adds fields such as the bytes a point needs::

        Message("needs {need} B", lambda p, ctx: {"need": 2 * p["stages"]})
    """

    _fields: Callable[[Point, Context], Mapping[str, Any]]

    def __new__(cls, template: str, fields: Callable[[Point, Context], Mapping[str, Any]]) -> Message:
        obj = super().__new__(cls, template)
        obj._fields = fields
        return obj

    def format(self, *args: Any, **kwargs: Any) -> str:
        ctx = kwargs.get("ctx") or Context()
        point = {k: v for k, v in kwargs.items() if k != "ctx"}
        return str.format(str(self), *args, **{**kwargs, **self._fields(point, ctx)})


# -- shared memory --------------------------------------------------------------
def align_up(nbytes: int, align: int = SMEM_ALIGN) -> int:
    return -(-nbytes // align) * align


def k_tile(in_bytes: int) -> int:
    """K elements per pipeline stage for the CuTe kernels: a 128-byte slice (64 bf16, 128 int8)."""
    return K_SLICE_BYTES // in_bytes


def operand_stage_bytes(a_rows: int, b_rows: int, tile_k: int, in_bytes: int) -> int:
    """Shared memory for one pipeline stage of A (``a_rows x tile_k``) and B (``b_rows x tile_k``)."""
    return align_up(a_rows * tile_k * in_bytes) + align_up(b_rows * tile_k * in_bytes)


def epilogue_bytes(rows: int, cols: int, out_bytes: int, stages: int) -> int:
    """Staging buffers for a TMA store of C: ``stages`` subtiles of ``rows x cols`` outputs."""
    return align_up(rows * cols * out_bytes * stages) if stages else 0


def smem_limit(name: str, need: Callable[[Point, Context], int], what: str = "") -> Constraint:
    """A hardware limit: ``need(point, ctx)`` bytes of shared memory must fit in one block's opt-in maximum."""

    def fits(p: Point, ctx: Context) -> bool:
        return ctx.hardware is None or need(p, ctx) <= ctx.hardware.smem_per_block

    suffix = f" ({what})" if what else ""
    message = Message(
        "needs {smem_need} B of shared memory" + suffix + ", {ctx.hardware.name} allows {ctx.hardware.smem_per_block}",
        lambda p, ctx: {"smem_need": need(p, ctx)},
    )
    return hardware_limit(name, fits, message)


# -- problem-level rules shared by the CuTe kernels --------------------------------
def misaligned(problem: Problem) -> list[str]:
    """Tensors whose contiguous extent is not a multiple of 16 bytes (C is taken as row-major, N contiguous)."""
    a_dim = ("K", problem.k) if problem.k_major("a") else ("M", problem.m)
    b_dim = ("K", problem.k) if problem.k_major("b") else ("N", problem.n)
    bad = []
    for tensor, (dim, extent), nbytes in (
        ("A", a_dim, problem.in_bytes), ("B", b_dim, problem.in_bytes), ("C", ("N", problem.n), problem.out_bytes),
    ):
        if (extent * nbytes) % TMA_ALIGN_BYTES:
            bad.append(f"{tensor} ({dim}={extent} x {nbytes} B = {extent * nbytes} B)")
    return bad


def tma_alignment_limit() -> Constraint:
    """TMA copies need the contiguous dimension of A, B and C to span a multiple of 16 bytes."""

    def aligned(p: Point, ctx: Context) -> bool:
        problem = gemm_problem(ctx)
        return problem is None or not misaligned(problem)

    message = Message(
        "TMA needs the contiguous dimension of each tensor to be a multiple of 16 bytes; not so for {bad}",
        lambda p, ctx: {"bad": ", ".join(misaligned(ctx.problem)) if ctx.problem else "?"},
    )
    return hardware_limit("alignment", aligned, message)


def dtype_rule(supported: tuple[str, ...], kernel: str, scalings: tuple[str, ...] = ("",)) -> Constraint:
    """The kernel family is only built for these input dtypes, and fp8 with these scalings ("": unscaled, the
    kernel called as ``kernel(a, b, c)``; a scaled fp8 problem passes the scales too)."""

    def ok(p: Point, ctx: Context) -> bool:
        problem = gemm_problem(ctx)
        return problem is None or (problem.dtype in supported and problem.scaling in scalings)

    def given(p: Point, ctx: Context) -> dict[str, str]:
        problem = gemm_problem(ctx)
        scaled = f" {problem.scaling}-scaled" if problem is not None and problem.scaling else ""
        return {"given": f"{problem.dtype if problem is not None else ''}{scaled}"}

    offered = "/".join(f"{s}-scaled" if s else "unscaled" for s in scalings)
    fp8 = f" (fp8 {offered})" if "fp8" in supported else ""
    return constraint("dtype", ok, Message(f"{kernel} takes {'/'.join(supported)} inputs{fp8}, not {{given}}",
                                           given))


# -- rules of the sm90 (WGMMA + TMA) kernels ---------------------------------------
def sm90_arch_limit() -> Constraint:
    """WGMMA and TMA: sm_90 only."""

    def has_sm90(p: Point, ctx: Context) -> bool:
        hw = ctx.hardware
        return hw is None or (hw.has("wgmma") and hw.has("tma"))

    return hardware_limit("arch", has_sm90, "needs sm_90 (WGMMA and TMA); {ctx.hardware.name} is {ctx.hardware.arch}")


def k_major_8bit_rule() -> Constraint:
    """WGMMA can only transpose 16-bit operands in shared memory; 8-bit A and B must be K-major, and the
    sm90 kernels do no transposing copy of their own."""

    def k_major(p: Point, ctx: Context) -> bool:
        problem = gemm_problem(ctx)
        return problem is None or problem.in_bytes != 1 or (problem.k_major("a") and problem.k_major("b"))

    return constraint("8bit-k-major", k_major, "8-bit WGMMA operands must be K-major (layout tn), not "
                      "{ctx.problem.layout}")


def portable_cluster_limit() -> Constraint:
    """A cluster no larger than the chip's portable cluster size."""

    def fits(p: Point, ctx: Context) -> bool:
        return ctx.hardware is None or math.prod(p["cluster"]) <= ctx.hardware.max_cluster_portable

    return hardware_limit("cluster-size", fits, "a {cluster[0]}x{cluster[1]} cluster exceeds the portable cluster "
                          "size {ctx.hardware.max_cluster_portable} of {ctx.hardware.name}")

"""Shared pieces of the built-in GEMM spaces: shared-memory sizing, TMA alignment, and a time estimate.

Not a space itself (the leading underscore keeps it out of ``builtin_names()``).
Each GEMM space turns a point into a :class:`Tiling` and calls :func:`estimate_ms`;
seeding ranks points by that number, so it has to order configurations sensibly,
not predict times to the microsecond.

Example::

    from evotune.core.hardware import get_hardware
    from evotune.core.problem import Problem
    from search_spaces._gemm_model import Tiling, estimate_ms

    t = Tiling(tile_m=128, tile_n=256, tile_k=64, stages=4, smem_bytes=230400, persistent=True)
    estimate_ms(t, Problem.gemm(8192, 8192, 8192, "bf16"), get_hardware("H100"))   # about 1.4 ms

Shared memory
    Operand stages hold a 128-byte K slice of A and B (``tile_k = 128 / in_bytes``
    elements: 64 for 16-bit inputs, 128 for 8-bit), the width of one 128-byte swizzle
    atom; the sm90 and sm100 CuTe kernels both pick ``tile_k`` this way (four MMA
    K-steps per stage).  Every kernel also reserves :data:`MBARRIER_RESERVE` bytes for
    pipeline mbarriers and the tile-scheduler bookkeeping, and each buffer is rounded up
    to the 1024-byte alignment that 128-byte swizzled layouts need.

The estimate (:func:`estimate_ms`), and what it assumes
    * Tiles: ``ceil(M / tile_m) * ceil(N / tile_n) * split_k`` CTAs of work.
    * Concurrency: a persistent kernel keeps one CTA per SM (``sm_count`` slots);
      otherwise CTAs per SM are limited by shared memory (1 KiB of it reserved per
      block by the driver), registers, 2048 threads and 32 blocks per SM.  Slots are
      rounded down to whole clusters.
    * Compute: wave quantisation at SM granularity.  The busiest SM runs
      ``ceil(tiles / SMs)`` tiles, each at the SM's share of the dense peak (CTAs
      sharing an SM share its tensor cores), so a partial last wave and ragged edge
      tiles (M, N, K padded up to the tile) cost as much as full ones.  For persistent
      kernels this is exactly ``waves = ceil(tiles / slots)`` with efficiency
      ``tiles / (waves * slots)``; with several CTAs per SM it does not overcharge the
      tail wave, which the remaining CTAs run at a larger share of their SMs.
      That time is divided by an MMA efficiency that falls with the perimeter/area
      ratio of the tile: each K-step moves ``tile_m + b_rows`` operand rows for
      ``tile_m * tile_n`` MACs, and staging, synchronisation and address arithmetic
      scale with the rows moved.  ``1 / (1 + TILE_OVERHEAD * (tile_m + b_rows) /
      (tile_m * tile_n))`` gives about 0.84 for 128x256 and 0.67 for 64x64.
      ``mma_rate`` scales the peak for MMA paths below the chip's full rate.
    * Memory, two levels.  L2 to SM: A is re-read once per tile column
      (``ceil(N / tile_n)`` times) and B once per tile row, divided by the cluster's
      TMA multicast factor (A is shared along the cluster's N extent, B along M), plus
      C.  The table has no L2 bandwidth, so L2 is taken as :data:`L2_BW_FACTOR` times
      HBM (H100's measured L2 read bandwidth is roughly 3x its HBM).  HBM: re-reads hit
      L2 when the CTAs of one wave share an operand tile, so DRAM traffic is, per
      wave, the A rows and B columns that wave touches (set by the raster band:
      CUTLASS swizzle or Triton GROUP_M), never less than each operand once and never
      more than the full L2 traffic.
    * Latency: both memory terms are slowed when too few bytes are in flight per SM
      to cover :data:`LATENCY_S` at the SM's share of the bandwidth (Little's law);
      ``(stages - 1)`` operand stages per resident CTA are in flight (the CTAs an SM holds, or fewer where
      the grid has fewer per SM; of A, the ``a_rows`` a stage reads from memory).
    * Split-K writes C with atomics: C is zeroed by a separate launch and written (2
      passes over HBM), and each split does a read-modify-write in L2 that costs
      :data:`ATOMIC_COST` times its bytes.
    * ``time = max(compute, HBM, L2) + launches * LAUNCH_US + waves * wave_overhead_us``
      with ``waves = ceil(tiles / slots)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from evotune.authoring import Constraint, Context, Hardware, Point, Problem, constraint, get_hardware, hardware_limit

KIB = 1024
K_SLICE_BYTES = 128  # bytes of K per operand row and stage: one 128-byte swizzle atom
MBARRIER_RESERVE = 1024  # mbarriers (full/empty per stage, accumulator, epilogue) and scheduler state
CUTE_STATIC_SMEM = 1024  # static shared memory every CuTe DSL GEMM binary declares (.nv.shared), on top
SMEM_ALIGN = 1024  # 128-byte swizzled buffers start on 1024-byte boundaries
TMA_ALIGN_BYTES = 16  # TMA needs every global stride (the contiguous extent) to be a multiple of 16 bytes

TILE_OVERHEAD = 16.0  # rows-moved cost per K-step, in units of one row of MACs (see module docstring)
L2_BW_FACTOR = 3.0  # L2 -> SM bandwidth as a multiple of HBM bandwidth
LATENCY_S = 1.0e-6  # loaded memory latency that the operand pipeline has to cover
LAUNCH_US = 2.0  # launch and first-wave ramp-up
MAX_BLOCKS_PER_SM = 32
MAX_THREADS_PER_SM = 2048
SMEM_RESERVED_PER_BLOCK = 1 * KIB  # the driver keeps 1 KiB of each block's shared memory
ATOMIC_COST = 4.0  # an atomic read-modify-write in L2 costs this many plain bytes of L2 bandwidth per byte
LEGACY_MMA_RATE = 0.6  # mma.sync throughput relative to wgmma/tcgen05 peak on sm_90 / sm_100

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


# -- the estimate ----------------------------------------------------------------
@dataclass(frozen=True)
class Tiling:
    """What the estimate needs to know about one configuration of a GEMM kernel.

    ``tile_m x tile_n`` is the output one CTA computes; ``b_rows`` the rows of B one
    CTA stages per K-step (``tile_n // 2`` for Blackwell 2-CTA MMAs, which split B
    across the CTA pair; None means ``tile_n``); ``a_rows`` the distinct rows of A a
    stage reads from memory (fewer than ``tile_m`` where the tile's rows past M are
    copies; None means ``tile_m``).  ``band`` is how many tiles wide the
    raster band is (CUTLASS swizzle, Triton GROUP_M) and ``band_along_m`` whether the
    band spans tile rows (M) while the walk sweeps along N.
    """

    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    smem_bytes: int
    cluster: tuple[int, int] = (1, 1)
    split_k: int = 1
    persistent: bool = False
    threads: int = 128
    regs_per_thread: int = 0
    b_rows: int | None = None
    a_rows: int | None = None
    mma_rate: float = 1.0
    band: int = 1
    band_along_m: bool = True
    wave_overhead_us: float = 1.0


def mma_efficiency(t: Tiling) -> float:
    """Fraction of peak the tensor cores reach on this tile shape (see module docstring)."""
    b_rows = t.tile_n if t.b_rows is None else t.b_rows
    return 1.0 / (1.0 + TILE_OVERHEAD * (t.tile_m + b_rows) / (t.tile_m * t.tile_n))


def ctas_per_sm(t: Tiling, hw: Hardware) -> int:
    """Resident CTAs per SM: 1 for persistent kernels, else the tightest of smem, registers, threads, blocks."""
    if t.persistent:
        return 1
    limits = [MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // max(t.threads, 1)]
    limits.append(hw.smem_per_sm // (t.smem_bytes + SMEM_RESERVED_PER_BLOCK))
    if t.regs_per_thread:
        regs = -(-t.regs_per_thread // 8) * 8  # allocated in units of 8 per thread
        limits.append(hw.regs_per_sm // (regs * t.threads))
    return max(1, min(limits))


def _wave_footprint(n_band: int, n_sweep: int, band: int, wave: int) -> tuple[int, int]:
    """Tile rows (banded dimension) and columns (swept dimension) that ``wave`` consecutive tiles touch."""
    band = max(1, min(band, n_band))
    per_band = band * n_sweep
    if wave >= per_band:
        full, rest = divmod(wave, per_band)
        return min(n_band, full * band + min(band, rest)), n_sweep
    return min(band, wave), min(n_sweep, math.ceil(wave / band))


def peak_tflops(hw: Hardware, dtype: str) -> float:
    """Dense peak for ``dtype``, falling back to the 16-bit peak (e.g. fp8 emulated on an A100)."""
    return hw.peak(dtype) or hw.peak("bf16") or hw.peak("fp16") or 100.0


def estimate_ms(t: Tiling, problem: Problem, hw: Hardware) -> float:
    """Predicted kernel time in milliseconds (lower is better); finite and positive for any tiling."""
    m, n, k = problem.m, problem.n, problem.k
    ib, ob = problem.in_bytes, problem.out_bytes
    split = max(1, t.split_k)
    cm, cn = t.cluster
    csize = max(1, cm * cn)

    tiles_m, tiles_n = math.ceil(m / t.tile_m), math.ceil(n / t.tile_n)
    tiles = tiles_m * tiles_n * split
    per_sm = ctas_per_sm(t, hw)
    sms = max(csize, hw.sm_count // csize * csize)  # SMs that whole clusters can occupy
    slots = sms * per_sm
    waves = math.ceil(tiles / slots)

    # compute: the busiest SM runs ceil(tiles / sms) (padded) tiles at its share of the peak;
    # CTAs sharing an SM split its tensor cores, so residency > 1 adds no throughput
    k_split = math.ceil(k / split)
    k_pad = math.ceil(k_split / t.tile_k) * t.tile_k
    sm_flops = peak_tflops(hw, problem.dtype) * 1e12 / hw.sm_count
    tile_flops = 2.0 * t.tile_m * t.tile_n * k_pad
    compute_s = math.ceil(tiles / sms) * tile_flops / (sm_flops * mma_efficiency(t) * t.mma_rate)

    # L2 -> SM traffic: operands re-read per tile row/column, shared by multicast within a cluster
    a_bytes, b_bytes = m * k * ib, n * k * ib
    l2_operands = a_bytes * tiles_n / cn + b_bytes * tiles_m / cm
    c_bytes = m * n * ob
    l2_c = c_bytes if split == 1 else ATOMIC_COST * c_bytes * split
    hbm_c = c_bytes if split == 1 else 2 * c_bytes

    # HBM traffic: what each wave touches once, between "everything once" and "every re-read misses"
    wave_tiles = min(slots, tiles_m * tiles_n)
    if t.band_along_m:
        rows, cols = _wave_footprint(tiles_m, tiles_n, t.band, wave_tiles)
    else:
        cols, rows = _wave_footprint(tiles_n, tiles_m, t.band, wave_tiles)
    wave_bytes = (rows * t.tile_m + cols * t.tile_n) * k_split * ib
    per_wave_count = tiles / wave_tiles
    hbm_operands = min(a_bytes * tiles_n + b_bytes * tiles_m, max(a_bytes + b_bytes, per_wave_count * wave_bytes))

    # latency hiding: bytes in flight per SM against what the SM's share of bandwidth needs
    b_rows = t.tile_n if t.b_rows is None else t.b_rows
    a_rows = t.tile_m if t.a_rows is None else t.a_rows
    stage_bytes = (a_rows + b_rows) * t.tile_k * ib
    resident = min(per_sm, math.ceil(tiles / sms))  # a grid smaller than the slots leaves some empty
    in_flight = max(1, t.stages - 1) * stage_bytes * resident
    l2_bw = hw.hbm_gbps * 1e9 * L2_BW_FACTOR
    needed = l2_bw / hw.sm_count * LATENCY_S
    hiding = min(1.0, in_flight / needed)

    hbm_s = (hbm_operands + hbm_c) / (hw.hbm_gbps * 1e9 * hiding)
    l2_s = (l2_operands + l2_c) / (l2_bw * hiding)
    launches = 1 if split == 1 else 2  # split-K zeroes C first
    seconds = max(compute_s, hbm_s, l2_s) + (launches * LAUNCH_US + waves * t.wave_overhead_us) * 1e-6
    return seconds * 1e3

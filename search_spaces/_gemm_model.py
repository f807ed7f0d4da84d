"""The time estimate the built-in GEMM spaces share (their shared constraints are in :mod:`_gemm_rules`).

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
from dataclasses import dataclass

from evotune.authoring import Hardware, Problem

KIB = 1024
TILE_OVERHEAD = 16.0  # rows-moved cost per K-step, in units of one row of MACs (see module docstring)
L2_BW_FACTOR = 3.0  # L2 -> SM bandwidth as a multiple of HBM bandwidth
LATENCY_S = 1.0e-6  # loaded memory latency that the operand pipeline has to cover
LAUNCH_US = 2.0  # launch and first-wave ramp-up
MAX_BLOCKS_PER_SM = 32
MAX_THREADS_PER_SM = 2048
SMEM_RESERVED_PER_BLOCK = 1 * KIB  # the driver keeps 1 KiB of each block's shared memory
ATOMIC_COST = 4.0  # an atomic read-modify-write in L2 costs this many plain bytes of L2 bandwidth per byte
LEGACY_MMA_RATE = 0.6  # mma.sync throughput relative to wgmma/tcgen05 peak on sm_90 / sm_100


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

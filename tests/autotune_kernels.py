"""Small Triton kernels for the evotune.autotune tests (run through TRITON_INTERPRET=1 on tiny shapes).

They call no ``triton.jit`` function of ``triton.language``'s standard library (``tl.cdiv``...): in a test
process that imported triton before TRITON_INTERPRET was set, those are compiled functions the interpreter
cannot call. The matmul example, which does, runs in a process of its own.
"""

from __future__ import annotations

import os
import time

import torch
import triton
import triton.language as tl

from evotune.core.space import SearchSpace, ordinal

ADD_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in [(16, 1), (32, 2), (64, 4)]]
#: ``add``'s candidates as a space (for ``tune-kernel --space``)
ADD_SPACE = SearchSpace("add_space", [ordinal("BLOCK", [16, 32, 64]), ordinal("num_warps", [1, 2]),
                                      ordinal("num_stages", [1])])
MOE_CONFIGS = [triton.Config({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": g},
                             num_warps=w, num_stages=s)
               for m, g, w, s in [(16, 1, 4, 2), (32, 16, 8, 3), (64, 1, 4, 4)]]


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def accumulate(x, out, n, BLOCK: tl.constexpr):
    """out += x: every launch changes the output, so timing must protect it (reset_to_zero, restore_value)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(out + offs, mask=m) + tl.load(x + offs, mask=m), mask=m)


@triton.jit
def bump(extra, dst, n, BLOCK: tl.constexpr):
    """Writes ones into ``extra``, or into ``dst`` when ``extra`` is None (an optional tensor argument)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if extra is not None:
        tl.store(extra + offs, tl.full([BLOCK], 1.0, tl.float32), mask=m)
    else:
        tl.store(dst + offs, tl.full([BLOCK], 1.0, tl.float32), mask=m)


@triton.jit
def moe_like(x, out, M, N, E, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
             BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """A copy of an M x N array keyed like vLLM's fused MoE (M, N, E), with its meta-parameters."""
    rows = tl.program_id(0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    cols = tl.arange(0, BLOCK_SIZE_N)
    for j in range(0, (N + BLOCK_SIZE_N - 1) // BLOCK_SIZE_N):
        c = j * BLOCK_SIZE_N + cols
        m = (rows[:, None] < M) & (c[None, :] < N)
        tl.store(out + rows[:, None] * N + c[None, :], tl.load(x + rows[:, None] * N + c[None, :], mask=m), mask=m)


def grid_1d(n: int):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def counting_bench(fn, quantiles=None):
    """A do_bench that counts its calls (in $AT_COUNT, a file, for other processes) and times one call."""
    counting_bench.calls += 1  # type: ignore[attr-defined]
    path = os.environ.get("AT_COUNT")
    if path:
        with open(path, "a") as f:
            f.write(".")
    pause = float(os.environ.get("AT_PAUSE", "0"))
    started = time.perf_counter()
    fn()
    time.sleep(pause)
    return [(time.perf_counter() - started) * 1e3] * 3


counting_bench.calls = 0  # type: ignore[attr-defined]


def make_add_args(n: int):
    """A key's launch for tune-kernel: (grid, args)."""
    x, y = torch.arange(n, dtype=torch.float32), torch.ones(n, dtype=torch.float32)
    return grid_1d(n), (x, y, torch.empty(n), n)


def make_add_launch_with_config(n: int):
    """A key's launch as serving code makes it for the plain kernel: (grid, args, kwargs), its configuration among
    the keyword arguments."""
    grid, args = make_add_args(n)
    return grid, args, {"BLOCK": 16, "num_warps": 1}


def make_moe_args(M: int, N: int, E: int):
    x = torch.randn(M, N)
    return (lambda meta: (triton.cdiv(M, meta["BLOCK_SIZE_M"]),)), (x, torch.empty_like(x), M, N, E)


def tuned_add(**options):
    """``add`` under evotune.autotune, keyed by n (its only use in the CLI test)."""
    import evotune

    return evotune.autotune(configs=ADD_CONFIGS, key=["n"], do_bench=counting_bench, **options)(add)


add_tuned = tuned_add()

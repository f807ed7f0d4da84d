"""The Triton kernel behind ``triton_block_fp8``: a block-scaled fp8 GEMM, ``C = (A x scale_a) @ (W x scale_b)^T``.

``A`` (M, K) e4m3 activations with one fp32 scale per row and 128-element group of K (``scale_a`` (M, K/128)),
``W`` (N, K) e4m3 weights with one fp32 scale per 128x128 block (``scale_b`` (N/128, K/128)), ``C`` (M, N)
bf16; both operands K-contiguous (layout ``tn``). Each program computes a ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile,
``BLOCK_SIZE_K`` of K per step (a divisor of the 128-element scale group, so that each step lies in one group):
the step's fp8 dot, accumulated by the tensor cores over that step only, is multiplied by the row's A scale and
the column's W scale of that group and added to an fp32 accumulator. Programs walk the tiles in bands of
``GROUP_SIZE_M`` tile rows, column by column, so that the programs running together share weight tiles in L2.
Rows and columns past the edges are wrapped copies (loads need no mask); the store is masked. K is a multiple
of 128 (the problem's rule), so no K step is partial.

``launcher(point, problem)`` is the seam the tests use: it takes tensors on any device, so the kernel runs on a
CPU under ``TRITON_INTERPRET=1``. ``build`` and ``precompile`` add the GPU inputs and the kernel cache.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import SCALE_BLOCK, Point, Problem


@triton.jit
def _block_scaled_gemm(a_ptr, w_ptr, sa_ptr, sw_ptr, c_ptr, M, N, K, s_am, s_wn, s_sam, s_sag, s_swn, s_swg,
                       s_cm, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                       GROUP_SIZE_M: tl.constexpr, SCALE_GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_SIZE_M)
    tiles_n = tl.cdiv(N, BLOCK_SIZE_N)
    per_band = GROUP_SIZE_M * tiles_n
    first_m = (pid // per_band) * GROUP_SIZE_M
    band_rows = tl.minimum(tiles_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % per_band) % band_rows
    pid_n = (pid % per_band) // band_rows
    rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    rk = tl.arange(0, BLOCK_SIZE_K)
    rows = rm % M
    cols = rn % N
    a_ptrs = a_ptr + rows[:, None] * s_am + rk[None, :]
    w_ptrs = w_ptr + cols[:, None] * s_wn + rk[None, :]
    sa_ptrs = sa_ptr + rows * s_sam  # this tile's rows of A's group scales
    sw_ptrs = sw_ptr + (cols // SCALE_GROUP) * s_swn  # the weight block row of each column
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for step in range(0, K // BLOCK_SIZE_K):
        a = tl.load(a_ptrs)
        w = tl.load(w_ptrs)
        group = (step * BLOCK_SIZE_K) // SCALE_GROUP
        scale_a = tl.load(sa_ptrs + group * s_sag)
        scale_w = tl.load(sw_ptrs + group * s_swg)
        acc += tl.dot(a, tl.trans(w)) * scale_a[:, None] * scale_w[None, :]
        a_ptrs += BLOCK_SIZE_K
        w_ptrs += BLOCK_SIZE_K
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=mask)


def launcher(point: Point, problem: Problem) -> tuple[Any, Any]:
    """``(launch, warmup)``: ``launch(a, b, scale_a, scale_b, c)`` writes ``c`` (the workload's inputs: ``b`` is
    the (K, N) view of the (N, K) weights); ``warmup`` with the same arguments only compiles."""
    m, n, k = problem.m, problem.n, problem.k
    grid = (triton.cdiv(m, point["BLOCK_SIZE_M"]) * triton.cdiv(n, point["BLOCK_SIZE_N"]),)
    meta = dict(BLOCK_SIZE_M=point["BLOCK_SIZE_M"], BLOCK_SIZE_N=point["BLOCK_SIZE_N"],
                BLOCK_SIZE_K=point["BLOCK_SIZE_K"], GROUP_SIZE_M=point["GROUP_SIZE_M"], SCALE_GROUP=SCALE_BLOCK,
                num_warps=point["num_warps"], num_stages=point["num_stages"])

    def args(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
             c: torch.Tensor) -> tuple[torch.Tensor | int, ...]:
        # b's stride along N is the weights' row stride; each scale tensor by its two strides, so a column-major
        # copy of scale_a reads the same
        return (a, b, scale_a, scale_b, c, m, n, k, a.stride(0), b.stride(1), scale_a.stride(0), scale_a.stride(1),
                scale_b.stride(0), scale_b.stride(1), c.stride(0))

    def launch(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               c: torch.Tensor) -> None:
        _block_scaled_gemm[grid](*args(a, b, scale_a, scale_b, c), **meta)

    def warmup(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               c: torch.Tensor) -> None:
        _block_scaled_gemm.warmup(*args(a, b, scale_a, scale_b, c), grid=grid, **meta)

    return launch, warmup


def specialization(problem: Problem) -> tuple[str, str, tuple[tuple[bool, bool], ...]]:
    """What of the shape a binary depends on: M, N, K and the strides (K for A and W, K/128 for the scales, N for
    C) are runtime integers, which Triton specialises only on divisibility by 16 and on being 1."""
    m, n, k = problem.m, problem.n, problem.k
    return problem.dtype, problem.scaling, tuple((x % 16 == 0, x == 1) for x in (m, n, k, k // SCALE_BLOCK))


def _key(point: Point, problem: Problem) -> str:
    from evotune.authoring import KernelCache

    return KernelCache.key("triton-block-fp8", triton.__version__, torch.cuda.get_device_name(0),
                           *specialization(problem), sorted(point.items()))


def precompile(point: Point, problem: Problem) -> bool:
    """Compile into Triton's on-disk cache without timing anything; True when it was there already."""
    from evotune.authoring import gemm_inputs
    from search_spaces._triton_kernel import fill_cache

    return fill_cache(_key(point, problem), f"triton-block-fp8 {problem.key} {point}",
                      lambda: launcher(point, problem)[1](*gemm_inputs(problem, seed=0, fill=False)))


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem`` (launching once on scratch data) and return ``fn(a, b, scale_a, scale_b,
    c)``; ``fn.cache_hit`` says whether a binary of the same :func:`specialization` was built before."""
    from search_spaces._triton_kernel import launched

    return launched(launcher(point, problem)[0], problem, _key(point, problem),
                    f"triton-block-fp8 {problem.key} {point}")

"""The Triton kernel behind ``triton_tma_matmul``: TMA loads and stores, one program per tile or persistent.

``C = A @ W^T`` with ``A`` (M, K) and ``W`` (N, K) both K-contiguous (layout ``tn``: the workload's ``b`` is the
(K, N) view of ``W``), ``C`` (M, N) row-major. The operands are read through tensor descriptors made on the host
(``triton.tools.tensor_descriptor.TensorDescriptor``, Triton 3.4 and newer): each K step's ``BLOCK_M x BLOCK_K``
and ``BLOCK_N x BLOCK_K`` tiles arrive by TMA, zero-filled past the edges, and ``C``'s tile leaves by a TMA store,
clipped at the edges. Tiles are ordered in bands of ``GROUP_M`` tile rows (L2 reuse of the weight tiles).

* ``GRID = "tiles"``: one program per output tile;
* ``GRID = "persistent"``: one program per SM, each walking the tiles ``SMs`` apart; with ``FLATTEN = 1`` Triton
  flattens the tile and K loops into one software pipeline, so the next tile's loads overlap this tile's
  epilogue.

fp8 (e4m3) in, bf16 out, unscaled or scaled per tensor (``launch(a, b, scale_a, scale_b, c)``: the fp32
accumulator multiplied by ``scale_a * scale_b`` before the store); bf16 and fp16 in, the same type out.

``launcher(point, problem, sms)`` is the seam the tests use: it takes tensors on any device, so the kernel runs
on a CPU under ``TRITON_INTERPRET=1``. ``build`` and ``precompile`` add the GPU inputs and the kernel cache.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import Point, Problem


@triton.jit
def _tma_matmul(a_desc, w_desc, c_desc, sa_ptr, sb_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, FLATTEN: tl.constexpr, SCALE: tl.constexpr):
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_steps = tl.cdiv(K, BLOCK_K)
    in_band = GROUP_M * num_n
    if SCALE:
        scale = tl.load(sa_ptr) * tl.load(sb_ptr)
    # this program's tiles, num_programs apart (a program per tile: its one tile)
    for tile in tl.range(tl.program_id(0), num_m * num_n, tl.num_programs(0), flatten=FLATTEN):
        first_m = (tile // in_band) * GROUP_M
        band_m = tl.minimum(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % in_band) % band_m) * BLOCK_M
        off_n = ((tile % in_band) // band_m) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ks in range(k_steps):
            a = a_desc.load([off_m, ks * BLOCK_K])
            w = w_desc.load([off_n, ks * BLOCK_K])
            acc = tl.dot(a, w.T, acc)
        if SCALE:
            acc = acc * scale
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


def programs(point: Point, problem: Problem, sms: int) -> int:
    """Programs of the launch: one per tile, or (persistent) one per SM, no more than there are tiles."""
    tiles = int(triton.cdiv(problem.m, int(point["BLOCK_M"])) * triton.cdiv(problem.n, int(point["BLOCK_N"])))
    return min(tiles, sms) if point["GRID"] == "persistent" else tiles


def launcher(point: Point, problem: Problem, sms: int | None = None) -> tuple[Any, Any]:
    """``(launch, warmup)``: ``launch(a, b, c)`` writes ``c = a @ b`` (``b`` the (K, N) view of the (N, K) weights),
    ``launch(a, b, scale_a, scale_b, c)`` the product of fp8 scaled per tensor; ``warmup`` with the same arguments
    only compiles. ``sms``: the persistent grid's width (the current GPU's SMs when None)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk = point["BLOCK_M"], point["BLOCK_N"], point["BLOCK_K"]
    if sms is None:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    grid = (programs(point, problem, sms),)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=point["GROUP_M"], FLATTEN=bool(point["FLATTEN"]),
                SCALE=problem.scaling == "tensor", num_warps=point["num_warps"], num_stages=point["num_stages"])

    def args(tensors: tuple[torch.Tensor, ...]) -> tuple[object, ...]:
        a, b, *scales, c = tensors
        scale_a, scale_b = scales or (c, c)  # unscaled: the kernel reads no scales
        return (TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b.t(), [bn, bk]),
                TensorDescriptor.from_tensor(c, [bm, bn]), scale_a, scale_b, problem.m, problem.n, problem.k)

    def launch(*tensors: torch.Tensor) -> None:
        _tma_matmul[grid](*args(tensors), **meta)

    def warmup(*tensors: torch.Tensor) -> None:
        _tma_matmul.warmup(*args(tensors), grid=grid, **meta)

    return launch, warmup


def specialization(problem: Problem) -> tuple[object, ...]:
    """What of the shape a binary depends on: M, N and K are runtime integers (specialised on divisibility by 16
    and on being 1), the descriptors' shapes and strides runtime values too, and so is the grid's width."""
    m, n, k = problem.m, problem.n, problem.k
    return problem.dtype, problem.layout, problem.scaling, tuple((x % 16 == 0, x == 1) for x in (m, n, k))


def _key(point: Point, problem: Problem) -> str:
    from evotune.authoring import KernelCache

    return KernelCache.key("triton-tma", triton.__version__, torch.cuda.get_device_name(0),
                           *specialization(problem), sorted(point.items()))


def precompile(point: Point, problem: Problem) -> bool:
    """Compile into Triton's on-disk cache without timing anything; True when it was there already."""
    from evotune.authoring import gemm_inputs
    from search_spaces._triton_kernel import fill_cache

    return fill_cache(_key(point, problem), f"triton-tma {problem.key} {point}",
                      lambda: launcher(point, problem)[1](*gemm_inputs(problem, seed=0, fill=False)))


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem`` (launching once on scratch data) and return ``fn(a, b, c)`` (``fn(a, b,
    scale_a, scale_b, c)`` for fp8 scaled per tensor); ``fn.cache_hit`` says whether a binary of the same
    :func:`specialization` was built before."""
    from search_spaces._triton_kernel import launched

    return launched(launcher(point, problem)[0], problem, _key(point, problem), f"triton-tma {problem.key} {point}")

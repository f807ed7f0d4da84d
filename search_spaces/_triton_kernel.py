"""The Triton kernel behind ``triton_matmul``: grouped program order, split-K, int8 with int32 output.

``build(point, problem)`` compiles the kernel for one configuration and returns
a launcher ``fn(a, b, c)`` that writes ``c = a @ b``; for fp8 scaled per tensor
``fn(a, b, scale_a, scale_b, c)``, the fp32 accumulator multiplied by the two
scalars in the epilogue (before any split-K add: the scale is constant along K)
and written as bf16. With ``SPLIT_K > 1`` the
partial products are added with atomics: straight into ``c`` for int32, into an
fp32 workspace (then cast into ``c``) for float outputs, whose own atomics
would round at every add. Both steps are plain launches, so the oracle can
capture them in one CUDA graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import Point, Problem


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, sa_ptr, sb_ptr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
            SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, INT_ACC: tl.constexpr, SCALE: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # bands of GROUP_M tile rows, so that consecutive programs share B tiles in L2
    in_band = GROUP_M * num_n
    first_m = (pid // in_band) * GROUP_M
    band_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_band) % band_m
    pid_n = (pid % in_band) // band_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    # wrap the edge rows and columns instead of masking the loads; the store is masked
    am = tl.max_contiguous(tl.multiple_of(rm % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(rn % N, BLOCK_N), BLOCK_N)
    a_ptrs = a_ptr + am[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + bn[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT_ACC else tl.float32)
    step = BLOCK_K * SPLIT_K
    for k in range(0, tl.cdiv(K, step)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            left = K - k * step
            a = tl.load(a_ptrs, mask=rk[None, :] < left, other=0)
            b = tl.load(b_ptrs, mask=rk[:, None] < left, other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32 if INT_ACC else tl.float32)
        a_ptrs += step * s_ak
        b_ptrs += step * s_bk
    if SCALE:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
    if SPLIT_K == 1:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# fp32 split-K accumulators, one per output shape and device, shared by every split-K kernel of this
# process: a buffer per kernel would hold M x N x 4 bytes for each of the thousands a recording builds.
_WORKSPACES: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}


def _workspace(c: torch.Tensor) -> torch.Tensor:
    key = (tuple(c.shape), str(c.device))
    if key not in _WORKSPACES:  # one per problem of the run; a captured CUDA graph may still point at it
        _WORKSPACES[key] = torch.empty(c.shape, dtype=torch.float32, device=c.device)
    return _WORKSPACES[key]


def launcher(point: Point, problem: Problem) -> tuple[Any, Any]:
    """``(launch, warmup)``: ``launch(a, b, c)`` runs (``launch(a, b, scale_a, scale_b, c)`` for fp8 scaled per
    tensor); ``warmup`` with the same arguments only compiles."""
    split = point["SPLIT_K"]
    int_acc = problem.dtype == "int8"
    even_k = problem.k % (point["BLOCK_K"] * split) == 0
    grid = (triton.cdiv(problem.m, point["BLOCK_M"]) * triton.cdiv(problem.n, point["BLOCK_N"]), split)
    meta = dict(BLOCK_M=point["BLOCK_M"], BLOCK_N=point["BLOCK_N"], BLOCK_K=point["BLOCK_K"],
                GROUP_M=point["GROUP_M"], SPLIT_K=split, EVEN_K=even_k, INT_ACC=int_acc,
                SCALE=problem.scaling == "tensor",
                num_warps=point["num_warps"], num_stages=point["num_stages"], num_ctas=point["num_ctas"])

    def target_of(c: torch.Tensor) -> torch.Tensor:
        return _workspace(c) if split > 1 and c.dtype.is_floating_point else c

    def args(tensors: tuple[torch.Tensor, ...], t: torch.Tensor) -> tuple[torch.Tensor | int, ...]:
        # unscaled, the kernel reads no scales and takes t in their places
        a, b, *scales, _ = tensors
        scale_a, scale_b = scales or (t, t)
        return (a, b, t, problem.m, problem.n, problem.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                t.stride(0), t.stride(1), scale_a, scale_b)

    def launch(*tensors: torch.Tensor) -> None:
        c = tensors[-1]
        target = target_of(c)
        if split > 1:
            target.zero_()
        _matmul[grid](*args(tensors, target), **meta)
        if target is not c:
            c.copy_(target)

    def warmup(*tensors: torch.Tensor) -> None:
        _matmul.warmup(*args(tensors, target_of(tensors[-1])), grid=grid, **meta)

    return launch, warmup


def _key(point: Point, problem: Problem) -> str:
    from evotune.authoring import KernelCache

    return KernelCache.key("triton", triton.__version__, torch.cuda.get_device_name(0), problem.dtype,
                           problem.layout, *((problem.scaling,) if problem.scaling else ()), problem.m, problem.n,
                           problem.k, sorted(point.items()))


def fill_cache(key: str, label: str, launch: Callable[[], object]) -> bool:
    """Compile into Triton's on-disk cache by ``launch`` on scratch data, recorded under ``key`` in evotune's
    kernel index; True when it was there already. Once per cache: another process needing it meanwhile waits."""
    from evotune.authoring import KernelCache

    cache = KernelCache()

    def build() -> None:
        started = time.perf_counter()
        launch()
        cache.add(key, label, time.perf_counter() - started)

    return cache.build_once(key, build)


def precompile(point: Point, problem: Problem) -> bool:
    """Compile into Triton's on-disk cache without timing anything; True when it was there already."""
    from evotune.authoring import gemm_inputs

    return fill_cache(_key(point, problem), f"triton {problem.key} {point}",
                      lambda: launcher(point, problem)[1](*gemm_inputs(problem, seed=0, fill=False)))


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem`` (launching once on scratch data) and return ``fn(a, b, c)``
    (``fn(a, b, scale_a, scale_b, c)`` for fp8 scaled per tensor)."""
    # Triton keeps binaries in its own cache (TRITON_CACHE_DIR, set by the GPU worker inside
    # evotune's kernel cache); the index only records what was built, to count hits.
    return launched(launcher(point, problem)[0], problem, _key(point, problem), f"triton {problem.key} {point}")


def launched(launch: Any, problem: Problem, key: str, label: str) -> Any:
    """``launch`` after one launch on scratch data (the problem's inputs: ``a, b, c``, or ``a, b, scale_a, scale_b,
    c`` for scaled fp8), which compiles it (recorded under ``key``) or loads its binary from Triton's cache;
    ``launch.cache_hit`` says which."""
    from evotune.authoring import gemm_inputs

    inputs = gemm_inputs(problem, seed=0)

    def first_launch() -> None:
        launch(*inputs)
        torch.cuda.synchronize()

    hit = fill_cache(key, label, first_launch)
    if hit:
        first_launch()
    launch.cache_hit = hit
    return launch

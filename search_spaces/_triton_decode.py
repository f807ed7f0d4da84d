"""The Triton kernels behind ``triton_decode_gemm``: split-K over the weight stream, then a reduction.

``y = x @ W^T`` with ``x`` (M, K) and ``W`` (N, K), both K-contiguous (layout ``tn``, as a linear
layer keeps its weights). Each program computes a ``BLOCK_M x BLOCK_N`` tile over its share of K,
``BLOCK_K`` at a time: the weight tile is a ``BLOCK_N x BLOCK_K`` slab read along K, so every thread
loads whole 16-byte vectors, and ``num_stages`` buffers keep that stream in flight. A ``BLOCK_M`` of 16 or more
multiplies with ``tl.dot`` (the tensor cores); a smaller one (M up to 8, every row in one tile) is a GEMV on the
CUDA cores: each weight tile converted to fp32 (int32 for int8) in registers, multiplied by each row of ``x``
and summed along K, its loads pipelined by a loop that asks for ``num_stages``. With ``SPLIT_K > 1`` the
programs write either

* ``REDUCE = "sum"``: fp32 (int32 for int8) partial tiles to a ``SPLIT_K x M x N`` workspace, which a
  second kernel sums and casts into ``c`` (deterministic, no zeroing); or
* ``REDUCE = "atomic"``: atomic adds into a zeroed fp32 workspace (then cast into ``c``), or straight
  into ``c`` for int32; or
* ``REDUCE = "last"``: partial tiles to the workspace, as ``"sum"``, and the last split of each tile to
  finish (a per-tile count, which it sets back to zero) sums them into ``c``: one launch, deterministic.

fp8 (e4m3) inputs take fp32 partials and a bf16 ``c``. Scaled fp8 (``scaling`` ``"tensor"`` or ``"row"``:
``launch(a, b, scale_a, scale_b, c)``, the workload's inputs) is scaled in the epilogue of each program: its
partial tile is multiplied by the product of the two scalars, or by its rows' ``scale_a`` and its columns'
``scale_b`` (both contiguous), before it is written. The scales are constant along K, so the scaled partials sum
to the scaled product in every REDUCE mode, and the reduction kernels stay as they are.

The workspace is allocated once per shape, on the first launch (which ``build`` makes, outside any
timing); every launch after that is plain kernel launches, which the oracle times as one unit in one
CUDA graph.

``launcher(point, problem)`` is the seam the tests use: it takes tensors on any device, so the
kernels run on a CPU under ``TRITON_INTERPRET=1``. ``build`` and ``precompile`` add the GPU inputs
and the kernel cache, whose key leaves the shape out where the binary does not depend on it
(:func:`specialization`).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from evotune.authoring import Point, Problem

# outputs per program of the reduction kernel: up to 1024, fewer where M x N is small, so that at M = 1 its
# SPLIT_K x N partials are read by many SMs (N = 4096 at SPLIT_K = 32 in blocks of 1024: 4 programs, each
# streaming 128 KiB through one SM)
REDUCE_BLOCK = 1024
REDUCE_MIN_BLOCK = 128
REDUCE_PROGRAMS = 128  # the programs it aims for before it widens its blocks
# the epilogue's scaling of a problem's fp8 inputs (SCALE in the kernel): none, one scalar each, per row of A
# and per column of C
SCALE_MODES = {"": 0, "tensor": 1, "row": 2}


def reduce_block(mn: int) -> int:
    """Outputs per program of the reduction kernel for ``mn`` outputs: a power of two from REDUCE_MIN_BLOCK to
    REDUCE_BLOCK, the largest that still gives REDUCE_PROGRAMS programs."""
    block = REDUCE_MIN_BLOCK
    while block < REDUCE_BLOCK and mn // (2 * block) >= REDUCE_PROGRAMS:
        block *= 2
    return block


@triton.jit
def _partial(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_bn, s_cs, s_cm, o_ptr, s_om, count_ptr, sa_ptr, sb_ptr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
             EVEN_K: tl.constexpr, INT_ACC: tl.constexpr, ATOMIC: tl.constexpr, LAST: tl.constexpr,
             SCALE: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # this program's K blocks: an even share, the last split taking what is left
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, k_blocks)
    # wrap the edge rows and columns instead of masking the loads; the store is masked
    a_ptrs = a_ptr + (rm % M)[:, None] * s_am + (first * BLOCK_K + rk)[None, :]
    b_ptrs = b_ptr + (rn % N)[:, None] * s_bn + (first * BLOCK_K + rk)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT_ACC else tl.float32)
    if BLOCK_M < 16:
        # GEMV: fewer rows than a tensor-core tile. Each weight tile, converted in registers, is multiplied by
        # each row of a and summed along K on the CUDA cores; the loop's own num_stages makes Triton pipeline
        # these loads, which it does for a loop without tl.dot only when the loop asks. The sums accumulate
        # N-major, laid out as the weight tile's rows are: adding a row's needs no layout change in the loop
        # (one transpose after it)
        rows = tl.arange(0, BLOCK_M)
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32 if INT_ACC else tl.float32)
        for kb in tl.range(first, last, num_stages=STAGES):
            if EVEN_K:
                b = tl.load(b_ptrs)
            else:
                b = tl.load(b_ptrs, mask=rk[None, :] < K - kb * BLOCK_K, other=0.0)
            b = b.to(tl.int32 if INT_ACC else tl.float32)
            for r in tl.static_range(BLOCK_M):
                a_row = a_ptr + ((pid_m * BLOCK_M + r) % M) * s_am + kb * BLOCK_K + rk
                if EVEN_K:
                    a = tl.load(a_row)
                else:
                    a = tl.load(a_row, mask=rk < K - kb * BLOCK_K, other=0.0)
                part = tl.sum(b * a.to(tl.int32 if INT_ACC else tl.float32)[None, :], axis=1)
                acc_t += tl.where(rows[None, :] == r, part[:, None], 0)
            b_ptrs += BLOCK_K
        acc = tl.trans(acc_t)
    else:
        for kb in range(first, last):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                left = K - kb * BLOCK_K
                # a float zero: Triton casts it to any operand type, e4m3 included (an integer zero it cannot)
                a = tl.load(a_ptrs, mask=rk[None, :] < left, other=0.0)
                b = tl.load(b_ptrs, mask=rk[None, :] < left, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc, out_dtype=tl.int32 if INT_ACC else tl.float32)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
    if SCALE == 1:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    elif SCALE == 2:
        acc = acc * tl.load(sa_ptr + rm % M)[:, None] * tl.load(sb_ptr + rn % N)[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    c_ptrs = c_ptr + pid_k * s_cs + rm[:, None] * s_cm + rn[None, :]
    if ATOMIC:
        tl.atomic_add(c_ptrs, acc, mask=mask)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    if LAST:
        # every thread's partial is stored before the tile's count of finished splits goes up (release); the
        # split that finds the others done (acquire) sums all of them, in split order (deterministic), from L2
        # (.cg: another SM wrote them), and sets the count back to 0 for the next launch: one launch, no zeroing
        tl.debug_barrier()
        count = count_ptr + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT_ACC else tl.float32)
            p_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :]
            for s in tl.static_range(SPLIT_K):
                total += tl.load(p_ptrs + s * s_cs, mask=mask, other=0, cache_modifier=".cg")
            o_ptrs = o_ptr + rm[:, None] * s_om + rn[None, :]
            tl.store(o_ptrs, total.to(o_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count, 0)


@triton.jit
def _reduce(p_ptr, c_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(p_ptr + offs, mask=mask, other=0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0)
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


# split-K workspaces, one per (shape, dtype, device), shared by every kernel of this process that needs one:
# a buffer per kernel would hold SPLIT_K x M x N x 4 bytes for each of the thousands a recording builds
_WORKSPACES: dict[tuple[tuple[int, ...], torch.dtype, str, bool], torch.Tensor] = {}


def _workspace(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, zeroed: bool = False) -> torch.Tensor:
    key = (shape, dtype, str(device), zeroed)
    if key not in _WORKSPACES:  # a captured CUDA graph may still point at it: never freed
        _WORKSPACES[key] = (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=device)
    return _WORKSPACES[key]


def _counts(tiles: int, device: torch.device) -> torch.Tensor:
    """The per-tile counts of finished splits of REDUCE=last, zero before the first launch: each launch sets
    the counts it raised back to zero, so one zeroed buffer serves every launch after it, graph replays too."""
    return _workspace((tiles,), torch.int32, device, zeroed=True)


def launcher(point: Point, problem: Problem) -> tuple[Any, Any]:
    """``(launch, warmup)``: ``launch(a, b, c)`` writes ``c = a @ b`` (``a`` (M, K) and ``b`` (K, N), both
    K-contiguous; ``c`` (M, N) contiguous), ``launch(a, b, scale_a, scale_b, c)`` the scaled product of a scaled
    fp8 problem; ``warmup`` with the same arguments only compiles the kernels it would launch."""
    m, n, k, split = problem.m, problem.n, problem.k, point["SPLIT_K"]
    atomic = split > 1 and point["REDUCE"] == "atomic"
    last = split > 1 and point["REDUCE"] == "last"
    int_acc = problem.dtype == "int8"
    grid = (triton.cdiv(n, point["BLOCK_N"]), triton.cdiv(m, point["BLOCK_M"]), split)
    meta = dict(BLOCK_M=point["BLOCK_M"], BLOCK_N=point["BLOCK_N"], BLOCK_K=point["BLOCK_K"], SPLIT_K=split,
                EVEN_K=k % point["BLOCK_K"] == 0, INT_ACC=int_acc, ATOMIC=atomic, LAST=last,
                SCALE=SCALE_MODES[problem.scaling], STAGES=point["num_stages"], num_warps=point["num_warps"],
                num_stages=point["num_stages"])
    acc_dtype = torch.int32 if int_acc else torch.float32
    block = reduce_block(m * n)
    reduce_grid = (triton.cdiv(m * n, block),)
    reduce_meta = dict(SPLIT_K=split, BLOCK=block, num_warps=max(1, min(4, block // 256)))

    def target(c: torch.Tensor) -> torch.Tensor:
        """Where the partial kernel writes: ``c`` itself, or a workspace."""
        if split == 1 or (atomic and not c.dtype.is_floating_point):
            return c
        return _workspace((m, n) if atomic else (split, m, n), acc_dtype, c.device)

    def args(tensors: tuple[torch.Tensor, ...], t: torch.Tensor) -> tuple[torch.Tensor | int, ...]:
        # b is the (K, N) view of the (N, K) weights: its stride along N is the weights' row stride; each split
        # has a partial tile of its own (stride M x N) unless they all add into one (atomics); with
        # REDUCE=last the kernel writes c itself, and counts each tile's finished splits; without scales the
        # kernel reads none, and takes t in their places
        a, b, *scales, c = tensors
        counts = _counts(grid[0] * grid[1], c.device) if last else t
        scale_a, scale_b = scales or (t, t)
        return (a, b, t, m, n, k, a.stride(0), b.stride(1), 0 if atomic else m * n, n, c, c.stride(0), counts,
                scale_a, scale_b)

    def launch(*tensors: torch.Tensor) -> None:
        c = tensors[-1]
        t = target(c)
        if atomic:
            t.zero_()
        _partial[grid](*args(tensors, t), **meta)
        if split > 1 and not atomic and not last:
            _reduce[reduce_grid](t, c, m * n, **reduce_meta)
        elif t is not c and not last:
            c.copy_(t)

    def warmup(*tensors: torch.Tensor) -> None:
        c = tensors[-1]
        t = target(c)
        _partial.warmup(*args(tensors, t), grid=grid, **meta)
        if split > 1 and not atomic and not last:
            _reduce.warmup(t, c, m * n, grid=reduce_grid, **reduce_meta)

    return launch, warmup


def specialization(problem: Problem) -> tuple[str, str, str, tuple[tuple[bool, bool], ...]]:
    """What of the shape a binary depends on: Triton compiles M, N, K, M x N (the workspace's split stride)
    and the row strides (K; N for the workspace and ``c``) as runtime integers, specialised only on
    divisibility by 16 and on being 1; the kernel also on whether K is a multiple of BLOCK_K (EVEN_K), and the
    reduction kernel, where a point launches it, on its block (:func:`reduce_block` of M x N); the cache key adds
    both."""
    m, n, k = problem.m, problem.n, problem.k
    return problem.dtype, problem.layout, problem.scaling, tuple((x % 16 == 0, x == 1) for x in (m, n, k, m * n))


def _key(point: Point, problem: Problem) -> str:
    from evotune.authoring import KernelCache

    even_k = problem.k % point["BLOCK_K"] == 0
    # the reduction kernel's block only where the point launches that kernel (split K, REDUCE=sum): the other
    # points' binaries serve every M x N
    reduces = point["SPLIT_K"] > 1 and point["REDUCE"] == "sum"
    return KernelCache.key("triton-decode", triton.__version__, torch.cuda.get_device_name(0),
                           *specialization(problem), even_k, reduce_block(problem.m * problem.n) if reduces else 0,
                           sorted(point.items()))


def precompile(point: Point, problem: Problem) -> bool:
    """Compile into Triton's on-disk cache without timing anything; True when it was there already."""
    from evotune.authoring import gemm_inputs
    from search_spaces._triton_kernel import fill_cache

    return fill_cache(_key(point, problem), f"triton-decode {problem.key} {point}",
                      lambda: launcher(point, problem)[1](*gemm_inputs(problem, seed=0, fill=False)))


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem`` (launching once on scratch data, which also allocates the split-K
    workspace) and return ``fn(a, b, c)`` (``fn(a, b, scale_a, scale_b, c)`` for scaled fp8); ``fn.cache_hit``
    says whether a binary of the same :func:`specialization` was built before."""
    from search_spaces._triton_kernel import launched

    return launched(launcher(point, problem)[0], problem, _key(point, problem), f"triton-decode {problem.key} {point}")

"""A user's own GPU search space: a small Triton GEMM with six knobs.

evotune loads this file by its path (``space = "tiled_matmul.py"`` in the
experiment beside it). It needs only ``SPACE``: the parameters, the constraints
that prune what the chip cannot run (with the message a pruned point gets), and
``build(point, problem)``, which compiles one configuration and returns a
launcher ``fn(a, b, c)`` writing ``c = a @ b``. evotune verifies every launcher
against cuBLAS on fresh random data before timing it, so a wrong configuration
can never win. Triton is imported inside ``build`` only: enumerating and pruning
the space needs no GPU.
"""

from __future__ import annotations

from typing import Any

from evotune.authoring import Context, Point, Problem, SearchSpace, constraint, hardware_limit, ordinal, power_of_two

BYTES = {"fp16": 2, "bf16": 2}


def smem_bytes(point: Point, problem: Problem) -> int:
    """The A and B tiles of every pipeline stage live in shared memory."""
    return point["num_stages"] * (point["BLOCK_M"] + point["BLOCK_N"]) * point["BLOCK_K"] * BYTES[problem.dtype]


def _fits_smem(point: Point, ctx: Context) -> bool:
    if ctx.hardware is None or ctx.problem is None:
        return True
    return smem_bytes(point, ctx.problem) <= ctx.hardware.smem_per_block


def _dtype_ok(point: Point, ctx: Context) -> bool:
    return ctx.problem is None or ctx.problem.dtype in BYTES


def _even_k(point: Point, ctx: Context) -> bool:
    return ctx.problem is None or ctx.problem.k % point["BLOCK_K"] == 0


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem`` and return ``fn(a, b, c)``."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        num_m, num_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        # bands of GROUP_M tile rows, so that programs running together share B tiles in L2
        band = GROUP_M * num_n
        first_m = (pid // band) * GROUP_M
        rows = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % band) % rows
        pid_n = (pid % band) // rows
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
        b_ptrs = b_ptr + rk[:, None] * s_bk + (rn % N)[None, :] * s_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K: the "even-k" constraint
            acc = tl.dot(tl.load(a_ptrs), tl.load(b_ptrs), acc)
            a_ptrs += BLOCK_K * s_ak
            b_ptrs += BLOCK_K * s_bk
        c_ptrs = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])

    grid = (triton.cdiv(problem.m, point["BLOCK_M"]) * triton.cdiv(problem.n, point["BLOCK_N"]),)

    def fn(a: Any, b: Any, c: Any) -> None:
        matmul[grid](a, b, c, problem.m, problem.n, problem.k, a.stride(0), a.stride(1), b.stride(0),
                     b.stride(1), c.stride(0), c.stride(1), BLOCK_M=point["BLOCK_M"], BLOCK_N=point["BLOCK_N"],
                     BLOCK_K=point["BLOCK_K"], GROUP_M=point["GROUP_M"], num_warps=point["num_warps"],
                     num_stages=point["num_stages"])

    return fn


SPACE = SearchSpace(
    name="tiled_matmul",
    params=[
        power_of_two("BLOCK_M", 16, 256, doc="tile rows per program"),
        power_of_two("BLOCK_N", 16, 256, doc="tile columns per program"),
        power_of_two("BLOCK_K", 16, 128, doc="K elements per step"),
        ordinal("GROUP_M", [1, 8], doc="tile rows per band of the program order"),
        ordinal("num_warps", [4, 8], doc="warps per program"),
        ordinal("num_stages", [2, 3, 4], doc="software-pipeline depth"),
    ],
    constraints=[
        constraint("dtype", _dtype_ok, "this kernel takes fp16 or bf16, not {ctx.problem.dtype}"),
        constraint("even-k", _even_k, "K={ctx.problem.k} is not a multiple of BLOCK_K={BLOCK_K}"),
        hardware_limit("smem", _fits_smem, "{num_stages} stages of ({BLOCK_M}+{BLOCK_N})x{BLOCK_K} tiles "
                       "exceed {ctx.hardware.name}'s shared memory per block"),
    ],
    description="a small Triton GEMM: tiles, grouped program order, warps, pipeline stages",
    build=build,
)

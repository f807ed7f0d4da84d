"""The seam between ``cute_blackwell_gemm`` and NVIDIA's ``cutlass.operators``: the sm100 persistent GEMM.

The operator registry (``PersistentDenseGemmOperator``) lists MMA tiles with N of
32, 64, 128 or 256 and always stores through TMA; its kernel class
(``PersistentDenseGemmKernel``) takes every N from 32 to 256 in steps of 32 and
a direct-store epilogue too. So, as for sm90 (``_cute_sm90.py``), this module
finds the operator for the problem's operands and swaps in a kernel built with
the point's MMA tile, cluster, 2-CTA choice and store path, on the static
persistent tile scheduler (one CTA per SM, six warps). The kernel chooses its
own A/B stage count: as many as fit in shared memory.

Only the compile-only half exists: no B200 is at hand to run what it builds.
"""

from __future__ import annotations

import functools
from typing import Any

from evotune.authoring import Point, Problem


@functools.cache
def _operator_for(dtype: str, layout: str) -> Any:
    """One sm100 persistent operator for these operands (its kernel is replaced per point); raises if none."""
    import cutlass.operators as ops
    from cutlass.operators.providers.cutedsl.gemm.sm100_persistent import PersistentDenseGemmOperator

    from search_spaces import _cute_aot as aot

    problem = Problem.gemm(256, 256, 256, dtype, layout)
    a, b, c, acc = aot.fake_operands(problem)
    args = ops.GemmArguments(a, b, c, accumulator_type=acc)
    found = ops.get_operators(args, target_sm="100a",
                              metadata_filter=lambda md: md.operator_class is PersistentDenseGemmOperator)
    if not found:
        raise RuntimeError(f"cutlass.operators has no sm100 persistent GEMM for {problem.describe()}")
    return found[0]


def kernel(point: Point, problem: Problem) -> Any:
    """The sm100 kernel object for ``point``."""
    import cutlass
    from cutlass.operators.providers.cutedsl.gemm.implementations.operator_helpers import (
        PersistentTileSchedulerType,
    )
    from cutlass.operators.providers.cutedsl.gemm.implementations.sm100_persistent_impl import (
        PersistentDenseGemmKernel,
    )

    return PersistentDenseGemmKernel(
        cutlass.Int32 if problem.dtype == "int8" else cutlass.Float32, bool(point["use_2cta_instrs"]),
        (point["mma_m"], point["mma_n"]), tuple(point["cluster"]), bool(point["use_tma_store"]),
        PersistentTileSchedulerType.STATIC_PERSISTENT, lambda x: x)


def compile_only(point: Point, problem: Problem, hardware: Any) -> dict[str, float | int | None]:
    """Compile ``point`` for ``hardware`` from meta tensors (no GPU); its resource use. Raises if it does not build."""
    from search_spaces import _cute_aot as aot

    aot.set_target(hardware)
    import cutlass.cute as cute
    import cutlass.operators as ops

    op = _operator_for(problem.dtype, problem.layout)
    op.impl = kernel(point, problem)
    a, b, c, acc = aot.fake_operands(problem)
    args = ops.GemmArguments(a, b, c, accumulator_type=acc)
    clusters = aot.max_active_clusters(hardware, tuple(point["cluster"]))
    return aot.compile_resources(op, args, hardware, (cute.runtime.make_fake_stream(), clusters, op.impl.epilogue_op),
                                 lambda impl: impl.num_ab_stage)

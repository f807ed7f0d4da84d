"""The seam between ``cute_hopper_gemm`` and NVIDIA's ``cutlass.operators``: one small adapter.

The operator registry exposes the sm90 persistent GEMM's CTA tile and cluster
shape. Swizzle, raster order and the pipeline depth are reachable only through
the kernel class it wraps (``Sm90StaticPersistentGemmKernel``): this module
picks the operator for the tile and cluster, swaps in a kernel instance built
with our swizzle and raster order, and pins the stage count by overriding the
kernel's own stage heuristic (which always takes the most that fit). Details
and sources: docs/notes/cutlass_operators_api.md.
"""

from __future__ import annotations

import os
from typing import Any

from evotune.problem import Problem
from evotune.space import Point

# tvm-ffi would otherwise try to build a C++ add-on for torch at import time
os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")


def _kernel_class(stages: int) -> Any:
    from cutlass.operators.providers.cutedsl.gemm.implementations.sm90_static_persistent_impl import (
        Sm90StaticPersistentGemmKernel,
    )

    class StagedKernel(Sm90StaticPersistentGemmKernel):
        """The operator's kernel with the A/B pipeline depth fixed instead of maximised."""

        def _compute_stages(self, *args: Any) -> tuple[int, int]:
            most, epilogue = Sm90StaticPersistentGemmKernel._compute_stages(*args)
            if stages > most:
                raise ValueError(f"{stages} stages do not fit in shared memory (at most {most})")
            return stages, epilogue

    return StagedKernel


def build(point: Point, problem: Problem) -> Any:
    """Compile ``point`` for ``problem``; returns ``fn(a, b, c)`` launching on the current torch stream."""
    import cutlass
    import cutlass.operators as ops
    import cutlass.torch as cutlass_torch
    import torch
    from cutlass.operators.providers.cutedsl.gemm.sm90_static_persistent import Sm90StaticPersistentGemmOperator

    from evotune.evaluation.gemm import make_inputs

    a, b, c = make_inputs(problem, seed=0)  # also creates the CUDA context the compiler queries
    int8 = problem.dtype == "int8"
    args = ops.GemmArguments(a, b, c, accumulator_type=torch.int32 if int8 else torch.float32)
    tile, cluster = (point["tile_m"], point["tile_n"]), tuple(point["cluster"])

    def wanted(md: Any) -> bool:
        return (md.operator_class is Sm90StaticPersistentGemmOperator
                and tuple(md.design.tile_shape[:2]) == tile and tuple(md.design.cluster_shape[:2]) == cluster)

    found = ops.get_operators(args, target_sm="90a", metadata_filter=wanted)
    if not found:
        raise RuntimeError(f"cutlass.operators has no sm90 persistent GEMM with tile {tile} and cluster {cluster} "
                           f"for {problem.describe()}")
    op = found[0]
    op.impl = _kernel_class(point["stages"])(
        cutlass.Int32 if int8 else cutlass.Float32, tile, cluster,
        swizzle_size=point["swizzle"], raster_along_m=point["raster"] == "m")
    compiled = op.compile(args, target_sm="90a").compiled_obj

    def launch(a: Any, b: Any, c: Any) -> None:
        compiled(a, b, c, cutlass_torch.current_stream())

    launch(a, b, c)
    torch.cuda.synchronize()
    return launch

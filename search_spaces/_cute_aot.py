"""Compiling the CuTe DSL GEMMs for a chip this machine does not have: meta tensors, no GPU, no launch.

``cutlass.operators`` compiles against whatever GPU is present: ``op.compile``
asks the driver for the number of clusters that fit (a value baked into the
persistent grid) and targets the current device. Here the operands are torch
meta tensors (shapes and strides, no storage), the target is the hardware
table's ``arch`` (``CUTE_DSL_ARCH`` is set before CuTe DSL is imported, since it
reads it then), and the cluster count is the table's SM count divided by the
cluster size. The binary is otherwise the one a GPU build makes: the same
operator, kernel class and symbolic shapes.

What a compile yields (:func:`compile_resources`): seconds, registers and stack
frame per thread and static shared memory read from the cubin, the dynamic
shared memory the host code launches with, and the A/B stage count the kernel
chose. A point that does not build raises; its message is the compiler's.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from evotune.authoring import Hardware, Problem

os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")


def set_target(hardware: Hardware) -> None:
    """Make CuTe DSL compile for ``hardware`` (call before cutlass is imported; later calls are ignored by it)."""
    os.environ["CUTE_DSL_ARCH"] = hardware.arch


def target_sm(hardware: Hardware) -> str:
    """``"90a"`` for sm_90a: the form ``cutlass.operators`` takes."""
    return hardware.arch.removeprefix("sm_")


def max_active_clusters(hardware: Hardware, cluster: tuple[int, int]) -> int:
    """Clusters resident at once, as the persistent grid assumes: whole clusters over the table's SMs."""
    return max(1, hardware.sm_count // (cluster[0] * cluster[1]))


def fake_operands(problem: Problem) -> tuple[Any, Any, Any, Any]:
    """``(a, b, c, accumulator dtype)`` as torch meta tensors in the problem's layout (no memory, no device).

    The compiled kernel sees only their dtypes, stride order and alignment (its shapes are symbolic): the
    binary is byte for byte the one real tensors give. Meta rather than fake tensors, because creating a
    ``FakeTensorMode`` imports TorchDynamo and SymPy, seconds of start-up in every compile process.
    """
    import torch

    from evotune.authoring import gemm_dtypes

    in_dt, out_dt = gemm_dtypes(problem)
    m, n, k = problem.m, problem.n, problem.k

    def empty(*shape: int, dtype: Any) -> Any:
        return torch.empty(*shape, dtype=dtype, device="meta")

    a = empty(m, k, dtype=in_dt) if problem.layout[0] == "t" else empty(k, m, dtype=in_dt).t()
    b = empty(n, k, dtype=in_dt).t() if problem.layout[1] == "n" else empty(k, n, dtype=in_dt)
    c = empty(m, n, dtype=out_dt)
    return a, b, c, torch.int32 if problem.dtype == "int8" else torch.float32


def compile_resources(op: Any, args: Any, hardware: Hardware, extra: tuple[Any, ...],
                      stages_of: Any) -> dict[str, float | int | None]:
    """Compile ``op.impl`` for ``hardware`` and read its resource use.

    ``extra`` follows the three tensors in the kernel's call (stream, cluster count, ...);
    ``stages_of(impl)`` reads the A/B stage count the traced kernel settled on.
    """
    from evotune.authoring import launch_smem_from_ir, read_object

    started = time.perf_counter()
    art = op.cute_compile(op.impl, args.A.tensor, args.B.tensor, args.out.tensor, *extra,
                          target_sm=target_sm(hardware))
    compile_s = time.perf_counter() - started
    compiled = art.compiled_obj
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.o")
        compiled.export_to_c(path, function_name="kernel")
        with open(path, "rb") as fh:
            obj = fh.read()
    res = read_object(obj)
    dynamic = launch_smem_from_ir(str(compiled.ir_module))
    return {
        "compile_s": round(compile_s, 3), "regs": res.regs, "frame_bytes": res.frame_bytes,
        "static_smem": res.static_smem, "dynamic_smem": dynamic,
        "smem": None if dynamic is None else dynamic + res.static_smem,
        "stages": int(stages_of(op.impl)), "sm": res.sm,
    }

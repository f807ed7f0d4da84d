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

import functools
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from evotune.authoring import Point, Problem

# tvm-ffi would otherwise try to build a C++ add-on for torch at import time
os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")

# Kernels loaded in this process, by cache key. Shapes are symbolic, so one loaded kernel serves
# every problem of its dtypes and layout: recording 20 shapes loads each kernel once, not 20 times.
_LOADED: dict[str, Any] = {}


def _kernel_class(stages: int, check: bool = True) -> Any:
    from cutlass.operators.providers.cutedsl.gemm.implementations.sm90_static_persistent_impl import (
        Sm90StaticPersistentGemmKernel,
    )

    class StagedKernel(Sm90StaticPersistentGemmKernel):
        """The operator's kernel with the A/B pipeline depth fixed instead of maximised."""

        def _compute_stages(self, *args: Any) -> tuple[int, int]:
            most, epilogue = Sm90StaticPersistentGemmKernel._compute_stages(*args)
            if check and stages > most:
                raise ValueError(f"{stages} stages do not fit in shared memory (at most {most})")
            return stages, epilogue

    return StagedKernel


@functools.cache
def _toolchain() -> tuple[str, str, int]:
    """(CuTe DSL version, device name, SM count), read without importing CuTe DSL or torch: a compile
    process finds most kernels in the cache, and should not pay seconds of imports to learn that."""
    from evotune.authoring import detect

    try:
        version = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        import cutlass

        version = cutlass.__version__
    device = detect()
    return version, device.name, device.sm_count


@functools.cache
def _kernel_source() -> tuple[str, str]:
    """What else a binary is built from: NVIDIA's operators package (the kernel's code) and this adapter (how
    it is configured), so that a cached binary is not taken for one that an upgrade would build otherwise."""
    try:
        operators = importlib.metadata.version("nvidia-cutlass-operators")
    except importlib.metadata.PackageNotFoundError:  # a source checkout of it: its code is not versioned here
        operators = "unversioned"
    return operators, hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def _cache_key(point: Point, problem: Problem) -> str:
    from evotune.authoring import KernelCache

    # Shapes are symbolic in the compiled kernel, so M, N and K stay out of the key: one binary
    # serves every problem of the same dtypes and layout. The persistent grid size is baked in,
    # hence the device and its SM count.
    version, device, sm_count = _toolchain()
    return KernelCache.key("cute_sm90", version, *_kernel_source(), device, sm_count, problem.dtype,
                           problem.layout, sorted(point.items()))


def _cached(key: str, suffix: str) -> Any:
    """The kernel's file with ``suffix`` in the on-disk cache, or None when it has not been built."""
    from evotune.authoring import KernelCache

    path = KernelCache().path("cute", key, suffix)
    return path if KernelCache().has(key) and path.is_file() else None


def _link(obj: Any, libraries: list[str]) -> None:
    """Link the exported object into a shared library beside it (``<key>.so``), where that can be done.

    The object's host code calls into CuTe DSL's runtime library and tvm-ffi's; linked against both (found
    by their paths), the library loads with ``tvm_ffi.load_module`` alone, so a GPU worker launches a cached
    kernel without importing CuTe DSL (seconds) or starting its JIT linker (a second for the first kernel).
    Without a C compiler (``$CC``, else ``cc``) there is only the object, which loads through CuTe DSL.
    """
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None or not libraries:
        return
    lib = obj.with_suffix(".so")
    tmp = obj.with_suffix(f".{os.getpid()}.so")  # several processes may build one kernel: the last rename wins
    dirs = sorted({os.path.dirname(path) for path in libraries})
    cmd = [compiler, "-shared", "-o", str(tmp), str(obj), *libraries, "-Wl,-rpath," + ":".join(dirs)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        os.replace(tmp, lib)
    except (OSError, subprocess.SubprocessError):
        tmp.unlink(missing_ok=True)


def operator(point: Point, problem: Problem, a: Any, b: Any, c: Any, check: bool = True) -> tuple[Any, Any]:
    """``(op, args)``: the cutlass.operators sm90 GEMM for ``point``'s tile and cluster, its kernel swapped for
    one with ``point``'s swizzle, raster order and stages; ``op.compile(args, target_sm="90a")`` builds it."""
    import cutlass
    import cutlass.operators as ops
    import torch
    from cutlass.operators.providers.cutedsl.gemm.sm90_static_persistent import Sm90StaticPersistentGemmOperator

    int8 = problem.dtype == "int8"
    args = ops.GemmArguments(a, b, c, accumulator_type=torch.int32 if int8 else torch.float32)
    tile, cluster = (point["tile_m"], point["tile_n"]), tuple(point["cluster"])

    def wanted(md: Any) -> bool:
        return (md.operator_class is Sm90StaticPersistentGemmOperator
                and tuple(md.design.tile_shape[:2]) == tile and tuple(md.design.cluster_shape[:2]) == cluster)

    found = ops.get_operators(args, target_sm="90a", metadata_filter=wanted)  # checks the arguments too
    if not found:
        raise RuntimeError(f"cutlass.operators has no sm90 persistent GEMM with tile {tile} and cluster {cluster} "
                           f"for {problem.describe()}")
    op = found[0]
    op.impl = _kernel_class(point["stages"], check)(
        cutlass.Int32 if int8 else cutlass.Float32, tile, cluster,
        swizzle_size=point["swizzle"], raster_along_m=point["raster"] == "m")
    return op, args


@functools.cache
def _max_active_clusters(cluster_size: int) -> int:
    """Clusters of ``cluster_size`` CTAs resident at once on this GPU, as the persistent grid is sized.

    Asked of the driver once per process and size: CuTe DSL's own query (``HardwareInfo``) compiles and
    loads an empty kernel every time it is called, and the operator's ``compile`` calls it for every
    kernel. A compile process has no torch CUDA context, so the device's primary context is made current.
    """
    from cuda.bindings import driver
    from cutlass.utils import HardwareInfo

    driver.cuInit(0)
    _, ctx = driver.cuCtxGetCurrent()
    if not int(ctx):
        _, device = driver.cuDeviceGet(0)
        _, ctx = driver.cuDevicePrimaryCtxRetain(device)
        driver.cuCtxSetCurrent(ctx)
    return int(HardwareInfo().get_max_active_clusters(cluster_size))


def _compile(point: Point, problem: Problem, key: str, a: Any, b: Any, c: Any, launch: bool = True) -> Any:
    """Compile ``point`` and export it to the on-disk cache; the compiled kernel, or None without ``launch``.

    What ``Sm90StaticPersistentGemmOperator.compile`` does, with the resident-cluster count asked once
    per process instead of once per kernel, and without ``launch`` no JIT engine (a compile process only
    exports the object: a fifth of a compile saved, the same bytes exported); ``a``, ``b`` and ``c`` may be
    torch meta tensors (only their dtypes, strides and alignment reach the binary: its shapes are symbolic).
    """
    import cutlass.cute as cute
    from cutlass.operators.config import GlobalOptions
    from cutlass.runtime import find_runtime_libraries

    from evotune.authoring import KernelCache

    op, args = operator(point, problem, a, b, c)
    started = time.perf_counter()
    clusters = _max_active_clusters(point["cluster"][0] * point["cluster"][1])
    compile_for = cute.compile[cute.GPUArch("sm_90a"), cute.EnableTVMFFI(GlobalOptions().use_tvm_ffi)]
    operands = (t.compile_time_tensor for t in (args.A.tensor, args.B.tensor, args.out.tensor))
    compiled = compile_for(op.impl, *operands, clusters, cute.runtime.make_fake_stream(), no_jit_engine=not launch)
    obj = KernelCache().path("cute", key, ".o")
    compiled.export_to_c(str(obj), function_name=f"k{key}")
    _link(obj, find_runtime_libraries(enable_tvm_ffi=True))
    KernelCache().add(key, f"cute_sm90 {problem.dtype} {problem.layout} {point}", time.perf_counter() - started)
    return compiled if launch else None


def _load(key: str) -> Any:
    """The cached kernel's launcher, or None when it is not cached: from its shared library through tvm-ffi
    alone where there is one, else from its object file through CuTe DSL."""
    library = _cached(key, ".so")
    if library is not None:
        import tvm_ffi

        return tvm_ffi.load_module(str(library)).get_function(f"k{key}")
    obj = _cached(key, ".o")
    if obj is not None:
        import cutlass.cute as cute

        return cute.runtime.load_module(str(obj), enable_tvm_ffi=True).__getattr__(f"k{key}")
    return None


def _compiled(point: Point, problem: Problem, a: Any, b: Any, c: Any) -> tuple[Any, bool]:
    """(kernel, hit): ``point`` loaded once per process, from the on-disk cache when it is there."""
    key = _cache_key(point, problem)
    if key in _LOADED:
        return _LOADED[key], True
    from evotune.authoring import KernelCache

    stale = False
    try:
        loaded = _load(key)
    except Exception:  # an unreadable or stale file (a moved runtime library, say): compile again, overwrite it
        loaded, stale = None, True
    if loaded is not None:
        _LOADED[key] = loaded
        return loaded, True
    built: list[Any] = []
    # compiled once per kernel cache: a process that needs it while another compiles it waits, then loads it
    present = (lambda: False) if stale else (lambda: _cached(key, ".o") is not None)
    if KernelCache().build_once(key, lambda: built.append(_compile(point, problem, key, a, b, c)), present):
        loaded = _load(key)
        if loaded is not None:
            _LOADED[key] = loaded
            return loaded, True
        built.append(_compile(point, problem, key, a, b, c))
    _LOADED[key] = built[-1]
    return _LOADED[key], False


def precompile(point: Point, problem: Problem) -> bool:
    """Compile into the on-disk cache without launching anything; True when it was there already.

    The operands are torch meta tensors: a compile process allocates nothing on the GPU."""
    from evotune.authoring import KernelCache

    key = _cache_key(point, problem)
    if _cached(key, ".o") is not None:  # before importing torch and CuTe DSL: most calls end here
        return True

    def build() -> None:
        from search_spaces._cute_aot import fake_operands

        _compile(point, problem, key, *fake_operands(problem)[:3], launch=False)

    return KernelCache().build_once(key, build, lambda: _cached(key, ".o") is not None)


def build(point: Point, problem: Problem) -> Any:
    """Compile (or load) ``point`` for ``problem``; returns ``fn(a, b, c)`` launching on the current torch stream."""
    import torch

    from evotune.authoring import gemm_inputs

    a, b, c = gemm_inputs(problem, fill=False)  # a trial launch's operands: their values do not matter
    compiled, hit = _compiled(point, problem, a, b, c)

    def launch(a: Any, b: Any, c: Any) -> None:
        compiled(a, b, c, torch.cuda.current_stream().cuda_stream)  # the stream as a handle (tvm-ffi takes ints)

    launch(a, b, c)
    torch.cuda.synchronize()
    launch.cache_hit = hit  # type: ignore[attr-defined]
    return launch


def compile_only(point: Point, problem: Problem, hardware: Any) -> dict[str, float | int | None]:
    """Compile ``point`` for ``hardware`` from meta tensors (no GPU, nothing cached or launched); its resource use.

    The stage count is not checked against the kernel's own estimate here: the compiler builds what it can,
    and the binary's shared memory says whether it could launch. Raises with the compiler's message."""
    from search_spaces import _cute_aot as aot

    aot.set_target(hardware)
    import cutlass.cute as cute

    a, b, c, _ = aot.fake_operands(problem)
    op, args = operator(point, problem, a, b, c, check=False)
    clusters = aot.max_active_clusters(hardware, tuple(point["cluster"]))
    return aot.compile_resources(op, args, hardware, (clusters, cute.runtime.make_fake_stream()),
                                 lambda impl: impl.ab_stage)

"""nvcc for CUTLASS C++ kernels: the header tree, the toolchain's versions, and the on-disk library cache.

Every CUTLASS C++ space generates one CUDA translation unit per compiled
configuration and builds it into a shared library with a few ``extern "C"``
functions, loaded with ctypes. This module owns what they share: where the
CUTLASS headers are (``$CUTLASS_PATH``, else the ``nvidia-cutlass`` package's
``cutlass_library/source``), the nvcc command line, compiling into
``KernelCache`` (``cutlass/<key>.so``, atomically renamed so that another
process never loads half a library) and loading each library once per process.

Example::

    from search_spaces import _cutlass_build as cb

    key = cb.cache_key("cutlass_conv2d", template_hash, dtype, compiled_knobs)
    lib, hit = cb.library(key, lambda: source_text, "cutlass_conv2d int8 ...", setup=declare_argtypes)
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

# Libraries loaded in this process, by cache key: one library serves every problem and launch argument.
_LOADED: dict[str, Any] = {}

# What the launchers' nonzero return codes mean (each space's C launcher returns these, or a subset of them).
LAUNCH_ERRORS = {1: "CUTLASS cannot implement this {subject} with this configuration (can_implement)",
                 2: "cudaFuncSetAttribute refused the kernel's shared memory", 3: "workspace initialisation failed",
                 4: "the launch failed", 5: "the launch reported a CUDA error"}


def launch_error(status: int, function: str, subject: str) -> str:
    """The message for ``function``'s return code ``status``; ``subject``: what it launches ("problem", ...)."""
    return LAUNCH_ERRORS.get(status, f"{function} returned {status}").format(subject=subject)


def cutlass_root() -> Path:
    """CUTLASS's C++ tree: ``$CUTLASS_PATH``, else the one inside the installed nvidia-cutlass package."""
    env = os.environ.get("CUTLASS_PATH")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        raise RuntimeError("CUTLASS C++ headers not found: pip install nvidia-cutlass, or set CUTLASS_PATH")
    return Path(spec.origin).parent / "source"


def headers_missing() -> list[str]:
    """What :func:`cutlass_root` would not find, in words (the space's ``Needs.check``); empty when it finds it."""
    if os.environ.get("CUTLASS_PATH") or importlib.util.find_spec("cutlass_library") is not None:
        return []
    return ["the CUTLASS C++ headers (pip install nvidia-cutlass, or set CUTLASS_PATH)"]


@cache
def toolchain() -> tuple[str, str]:
    """(nvcc's version line, CUTLASS's version): both go into every cache key."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH: the CUTLASS C++ spaces compile with the CUDA toolkit's nvcc")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    version_h = cutlass_root() / "include" / "cutlass" / "version.h"
    text = version_h.read_text() if version_h.is_file() else ""
    parts = [line.split()[-1] for line in text.splitlines()
             if line.startswith(("#define CUTLASS_MAJOR", "#define CUTLASS_MINOR", "#define CUTLASS_PATCH"))]
    return out.strip().splitlines()[-1], ".".join(parts) or "unknown"


def cache_key(*parts: Any) -> str:
    """A library's key: ``parts`` (backend, template hash, dtypes, layouts, compiled knobs) plus the toolchain."""
    from evotune.authoring import KernelCache

    nvcc, cutlass = toolchain()
    return KernelCache.key(parts[0], nvcc, cutlass, *parts[1:])


def nvcc_command(src: Path, out: Path, arch: str = "sm_90a", cubin: bool = False,
                 extra: tuple[str, ...] = ()) -> list[str]:
    """nvcc into a shared library (host launcher and kernel), or with ``cubin`` the device code alone."""
    root = cutlass_root()
    # TMA descriptors are made through the runtime's driver entry point, so no -lcuda is needed
    output = ["-cubin"] if cubin else ["-shared", "-Xcompiler", "-fPIC"]
    return ["nvcc", "-O3", "-DNDEBUG", "-std=c++17", f"-arch={arch}", "--expt-relaxed-constexpr", *output, *extra,
            f"-I{root / 'include'}", f"-I{root / 'tools' / 'util' / 'include'}", "-o", str(out), str(src)]


def library_path(key: str) -> Path:
    from evotune.authoring import KernelCache

    return KernelCache().path("cutlass", key, ".so")


def compile_library(key: str, source: str, what: str) -> Path:
    """nvcc ``source`` into the on-disk cache under ``key``; a compiler error is raised with its first lines."""
    from evotune.authoring import KernelCache

    out = library_path(key)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="evotune-cutlass-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        built = Path(tmp) / "kernel.so"
        proc = subprocess.run(nvcc_command(src, built), capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "error" in line][:3]
            raise RuntimeError("nvcc failed: " + (" | ".join(errors) or proc.stderr[-600:]))
        os.replace(built, out)  # atomic: another process never loads a half-written library
    KernelCache().add(key, what, time.perf_counter() - started)
    return out


def cached(key: str) -> bool:
    from evotune.authoring import KernelCache

    return KernelCache().has(key) and library_path(key).is_file()


def precompile(key: str, source: Callable[[], str], what: str) -> bool:
    """Compile into the on-disk cache without loading; True when it was there already (or another process
    compiled it while this one waited: a kernel is compiled once per cache)."""
    from evotune.authoring import KernelCache

    return KernelCache().build_once(key, lambda: compile_library(key, source(), what), lambda: cached(key))


def library(key: str, source: Callable[[], str], what: str, setup: Callable[[Any], None]) -> tuple[Any, bool]:
    """(the loaded library, whether it came from a cache); compiled first when the disk cache lacks it.
    ``setup(lib)`` declares the C functions' argument types, once per load."""
    if key in _LOADED:
        return _LOADED[key], True
    hit = precompile(key, source, what)
    lib = ctypes.CDLL(str(library_path(key)))
    setup(lib)
    _LOADED[key] = lib
    return lib, hit

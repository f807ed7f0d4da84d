"""A search space whose points misbehave on purpose: for testing that the tuner survives them.

A test fixture, not a space for users: experiments and tests name it by its
path (``tests/experiments/faults_cpu.toml`` has ``space = "../spaces/faults.py"``).

``mode`` picks the behaviour and ``size`` (1, 2, 3) gives the correct modes
several points with different times; the faulty modes exist at ``size = 1``
only (a named constraint prunes the rest), so the space has 12 feasible points:

==============  ==============================================  ===========================
mode            what the candidate does                         expected status
==============  ==============================================  ===========================
ok_fast         ``a @ b``, ``size`` times                       ok
ok_slow         the same after sleeping ``size`` ms             ok (slower)
abort           ``os.abort()``                                  crash (signal 6)
segfault        reads address 0 (``ctypes.string_at(0)``)       crash (signal 11)
hang            ``while True: pass``                            timeout
compile_error   raises while building                           compile_error
wrong           ``a @ b + 1``                                   wrong_result
oom             allocates 64 MiB blocks until MemoryError       runtime_error (or crash if
                                                                the process is killed)
==============  ==============================================  ===========================

Two flavours, chosen when the module is loaded by the environment variable
``EVOTUNE_FAULTS_FLAVOUR`` (a worker process started by the evaluator
inherits it, so it loads the same flavour):

* ``cpu`` (the default): ``build(point, problem)`` returns ``fn(a, b) -> c`` on
  numpy float64 arrays, for :class:`evotune.measurement.cpu.CpuEvaluator`.
  ``oom`` runs only under an address-space cap (``RLIMIT_AS``, which the CPU
  worker sets); without one it raises MemoryError at once rather than exhaust
  the machine.
* ``gpu``: :func:`gpu_build` returns ``fn(a, b, c)`` for
  :class:`evotune.measurement.gpu.GpuEvaluator`, delegating to the Triton
  kernels of ``gpu_faults.py`` beside this file (``ok``, ``wrong``, ``crash``: an
  illegal address, ``hang``, ``compile``); ``abort`` aborts the host process and
  ``oom`` allocates GPU memory until torch raises OutOfMemoryError.

Example::

    from evotune.core.plugins import load_space
    space = load_space("tests/spaces/faults.py")
    len(space.feasible(Context()))   # 12
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from evotune.authoring import Point, Problem, SearchSpace, categorical, constraint, ordinal

MODES = ("ok_fast", "ok_slow", "abort", "segfault", "hang", "compile_error", "wrong", "oom")
CHUNK = 64 * 2**20  # bytes per allocation of the oom mode
MAX_CAP = 16 * 2**30  # oom refuses to run under an address-space cap larger than this (or none)
FLAVOUR = os.environ.get("EVOTUNE_FAULTS_FLAVOUR", "cpu")


# -- the CPU flavour: numpy callables fn(a, b) -> c ----------------------------------
def build(point: Point, problem: Problem):
    mode, size = point["mode"], int(point["size"])
    if mode == "compile_error":
        raise RuntimeError("this configuration does not compile (on purpose)")
    if mode == "ok_fast":
        return lambda a, b: _repeat_matmul(a, b, size)
    if mode == "ok_slow":
        def slow(a, b):
            time.sleep(size * 1e-3)
            return _repeat_matmul(a, b, size)
        return slow
    if mode == "wrong":
        return lambda a, b: a @ b + 1.0
    if mode == "abort":
        return lambda a, b: os.abort()
    if mode == "segfault":
        def segfault(a, b):
            import ctypes

            return ctypes.string_at(0)
        return segfault
    if mode == "hang":
        def hang(a, b):
            while True:
                pass
        return hang
    if mode == "oom":
        return _exhaust_memory
    raise ValueError(f"unknown mode {mode!r}")


def _repeat_matmul(a: Any, b: Any, times: int) -> Any:
    c = a @ b
    for _ in range(times - 1):
        c = a @ b
    return c


def _exhaust_memory(a: Any, b: Any) -> Any:
    """Allocate until MemoryError, within the process's RLIMIT_AS; refuse without a cap."""
    import resource

    import numpy as np

    cap, _ = resource.getrlimit(resource.RLIMIT_AS)
    if cap == resource.RLIM_INFINITY or cap > MAX_CAP:
        raise MemoryError("oom: refusing to exhaust memory without an address-space cap (RLIMIT_AS)")
    held = []
    try:
        for _ in range(cap // CHUNK + 1):  # more than the cap allows: MemoryError comes first
            held.append(np.empty(CHUNK, dtype=np.uint8))  # address space, not pages: fast, and what the cap counts
    except MemoryError:
        blocks = len(held)
        held.clear()  # give it back before the error travels (its traceback keeps this frame alive)
        raise MemoryError(f"oom: out of memory after {blocks} blocks of {CHUNK >> 20} MiB") from None
    held.clear()
    raise RuntimeError(f"oom: allocated {cap // CHUNK + 1} blocks of {CHUNK >> 20} MiB past a cap of {cap} bytes")


# -- the GPU flavour: fn(a, b, c) on CUDA tensors ----------------------------------
GPU_MODES = {"ok_fast": "ok", "ok_slow": "ok", "wrong": "wrong", "segfault": "crash", "hang": "hang",
             "compile_error": "compile"}
GPU_FAULTS = Path(__file__).resolve().parent / "gpu_faults.py"


def gpu_build(point: Point, problem: Problem):
    """What ``gpu_faults.py`` builds for the same fault (``segfault`` is its illegal address).

    Not exercised without a GPU: ``tests/test_gpu.py`` covers the delegated modes.
    """
    mode = point["mode"]
    if mode == "abort":
        return lambda a, b, c: os.abort()
    if mode == "oom":
        def oom(a, b, c):
            import torch

            held = [torch.empty(2**30, dtype=torch.uint8, device="cuda") for _ in range(1 << 16)]
            raise RuntimeError(f"allocated {len(held)} GiB without running out")  # torch raises first
        return oom
    from evotune.authoring import load_space

    return load_space(str(GPU_FAULTS)).build({"mode": GPU_MODES[mode]}, problem)


def _make_space(flavour: str) -> SearchSpace:
    if flavour not in ("cpu", "gpu"):
        raise ValueError(f"EVOTUNE_FAULTS_FLAVOUR must be cpu or gpu, got {flavour!r}")
    return SearchSpace(
        "faults" if flavour == "cpu" else "faults_gpu",
        [categorical("mode", MODES, doc="how the candidate behaves"),
         ordinal("size", (1, 2, 3), doc="work per call of the correct modes")],
        constraints=[constraint("one-size-for-faults", lambda p, ctx: p["mode"].startswith("ok") or p["size"] == 1,
                                "mode {mode} exists at size 1 only")],
        description=f"points that crash, hang, abort, run out of memory or compute wrongly on purpose ({flavour})",
        build=build if flavour == "cpu" else gpu_build,
    )


SPACE = _make_space(FLAVOUR)

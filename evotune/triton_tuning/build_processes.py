"""A module-named kernel's configurations built in other processes while this one times the built ones.

``tune-kernel`` (and ``tune-model``, which tunes each key through it) names its kernel by reference
(``MODULE:KERNEL``) and makes each key's launch with the module's launch function, so another process that imports
the module can make the same launch and compile any configuration of it into the Triton cache every process of the
host shares (``TRITON_CACHE_DIR``). Triton's compiler holds the GIL for much of a build, so threads of one process
gain little past a few, where processes build on a core each. The measurement in this process then finds each
configuration built and loads it.

The processes (``spawn``: torch, Triton and the module imported once, CUDA on this process's device) start with the
first key and serve every key of the process's run (:func:`executor`); each makes a key's launch once (its tensors
on the GPU, as the launch function makes them: the same arguments, so the same specialisation) and keeps the
latest. A configuration that fails to build there is left to the measurement, which builds it again and records why.
What the processes built is counted (``compile_count.BUILT``), so that a count of this process's compiles adds it.

Example::

    pool = ProcessBuilds(LaunchRef(ref, None, None, "make_args", (("M", 16),)), space.key, depth=14)
    pool.submit(points); pool.ready(points[0]); pool.wait(points[0]); pool.close()
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from evotune.core.space import Point
from evotune.triton_tuning.compile_count import BUILT, CompileCount


@dataclass(frozen=True)
class LaunchRef:
    """How another process makes a key's launch: the kernel's reference and candidates (as ``tune-kernel`` takes
    them), the module's launch function and the key's values."""

    ref: str
    space: str | None
    key_names: str | None
    launch: str
    key: tuple[tuple[str, Any], ...]


_executors: dict[tuple[str, str | None, str | None], ProcessPoolExecutor] = {}
_lock = threading.Lock()


#: build processes by default at most: each holds a CUDA context and its key's launch on the GPU (about 1.7 GB for
#: a Mixtral expert GEMM's), and past a dozen or so the pool outruns the GPU's timing anyway
MAX_PROCESSES = 16


def processes() -> int:
    """Build processes: ``EVOTUNE_COMPILE_THREADS`` where set, else the host's cores less two (one times, one
    serves the run), at most :data:`MAX_PROCESSES`."""
    from evotune.triton_tuning.compile_ahead import pool_threads

    return pool_threads() or max(1, min(MAX_PROCESSES, (os.cpu_count() or 1) - 2))


def executor(ref: LaunchRef) -> ProcessPoolExecutor:
    """The processes that build ``ref``'s kernel, started on first use and shut down when this process exits."""
    name = (ref.ref, ref.space, ref.key_names)
    with _lock:
        pool = _executors.get(name)
        if pool is None:
            pool = ProcessPoolExecutor(processes(), mp_context=get_context("spawn"))
            _executors[name] = pool
            if len(_executors) == 1:
                atexit.register(shutdown)
        return pool


def shutdown() -> None:
    """Stop every pool's processes (builds not started are dropped)."""
    with _lock:
        for pool in _executors.values():
            pool.shutdown(wait=False, cancel_futures=True)
        _executors.clear()


class ProcessBuilds:
    """One key's proposals built by the pool's processes: :class:`~evotune.triton_tuning.compile_ahead.CompilePool`'s
    interface (``depth``, ``submit``, ``ready``, ``wait``, ``close``)."""

    def __init__(self, ref: LaunchRef, key_of: Callable[[Point], str], depth: int):
        self.ref, self.key_of, self.depth = ref, key_of, depth
        self._pool = executor(ref)
        self._futures: dict[str, Future[bool | None]] = {}

    def submit(self, points: list[Point]) -> None:
        for point in points:
            key = self.key_of(point)
            if key not in self._futures:
                self._futures[key] = self._pool.submit(build, self.ref, dict(point))

    def ready(self, point: Point) -> bool:
        future = self._futures.get(self.key_of(point))
        return future is None or future.done()

    def wait(self, point: Point) -> None:
        """Wait for ``point``'s build where a process has started it; one still queued (behind others, or while the
        processes start) is taken back, and the measurement builds it here, sooner."""
        future = self._futures.get(self.key_of(point))
        if future is None:
            return
        if future.cancel():
            self._futures[self.key_of(point)] = _done
            return
        try:
            built = future.result()
        except Exception:  # the process died, or could not make the launch: the measurement builds it here
            return
        finally:
            self._futures[self.key_of(point)] = _done
        if built:
            BUILT.add(1)

    def close(self) -> None:
        """Builds not started are dropped; those running finish on their own, into the shared cache."""
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


_done: Future[bool | None] = Future()
_done.set_result(None)

# in a pool process: the kernel of each reference, and the latest key's launch
_kernels: dict[tuple[str, str | None, str | None], Any] = {}
_launch: dict[str, Any] = {}


def build(ref: LaunchRef, point: Point) -> bool | None:
    """In a pool process: compile ``point``'s configuration for ``ref``'s launch. True: compiled; False: found in the
    cache; None: the launch could not be made or the configuration did not build (the measurement builds it again
    and records why)."""
    from evotune.triton_tuning.plain import without_config
    from evotune.triton_tuning.references import load_kernel
    from evotune.triton_tuning.resources import compile_config

    name = (ref.ref, ref.space, ref.key_names)
    try:
        if name not in _kernels:
            _kernels[name] = load_kernel(ref.ref, ref.space, ref.key_names)
        kernel, module = _kernels[name]
        if _launch.get("ref") != ref:
            _launch.clear()
            launch = getattr(module, ref.launch)(**dict(ref.key))
            grid, args, kwargs = (*launch, {}) if len(launch) == 2 else launch
            _launch.update(ref=ref, grid=grid, args=tuple(args), kwargs=without_config(kernel, dict(kwargs)))
        config = kernel.candidates.config(point)
        with CompileCount() as count:
            compile_config(kernel.fn, _launch["args"], {"grid": _launch["grid"], **_launch["kwargs"]}, config)
    except Exception:
        return None
    return count.built > 0


__all__ = ["BUILT", "MAX_PROCESSES", "LaunchRef", "ProcessBuilds", "build", "executor", "processes", "shutdown"]

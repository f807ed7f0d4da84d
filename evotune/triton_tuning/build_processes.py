"""A module-named kernel's configurations built in other processes while this one times the built ones.

``tune-kernel`` (and ``tune-model``, which tunes each key through it) names its kernel by reference
(``MODULE:KERNEL``) and makes each key's launch with the module's launch function, so another process that imports
the module can make the same launch and compile any configuration of it into the Triton cache every process of the
host shares (``TRITON_CACHE_DIR``). Triton's compiler holds the GIL for much of a build, so threads of one process
gain little past a few, where processes build on a core each. The measurement in this process then finds each
configuration built and loads it.

The processes are forked from a process that imported torch, Triton and the kernel's module once, rather than each
importing them side by side with the others, which holds a host's CPUs for seconds while the first keys are timed:
from this process itself when it starts them before CUDA and any thread of its own (:func:`start`, as a tune-model
worker does: it is a fork of a server that imported them), else from a server of their own
(:mod:`evotune.measurement.processes`), whose imports take seconds: a thread starts those, and until they are up a
key's builds are the measurement's (:func:`executor` is None). They compile for this process's GPU without a call to
CUDA (:func:`compile_only`). They serve every key of the process's run; each builds a key's configurations from the
launch's :func:`signature` (its tensors' dtypes and its other values, as the worker made them: the same
specialisation, and nothing of theirs on the GPU), or, for a launch without one, makes the key's launch once (its
tensors on the GPU, as the launch function makes them) and keeps the latest. A configuration that fails to build
there is left to the measurement, which builds it again and records why. What the processes built is counted
(``compile_count.BUILT``), so that a count of this process's compiles adds it.

Example::

    pool = ProcessBuilds(LaunchRef(ref, None, None, "make_args", (("M", 16),)), space.key, depth=14)
    pool.submit(points); pool.ready(points[0]); pool.wait(points[0]); pool.close()
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from evotune.core.space import Point
from evotune.measurement import gpu_turn
from evotune.measurement.processes import inherited_cuda, pool_initializer, start_method
from evotune.triton_tuning.compile_count import BUILT, CompileCount

#: a launch as Triton's compiler sees it: the positional arguments, each tensor as its dtype, and the keyword ones
Signature = tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]
_PLAIN = (int, float, bool, str, type(None))
PR_SET_PDEATHSIG = 1  # Linux prctl: the signal a process gets when the thread that started it (its parent) ends


@dataclass(frozen=True)
class LaunchRef:
    """How another process builds a key's launch: the kernel's reference and candidates (as ``tune-kernel`` takes
    them), the module's launch function and the key's values, and the launch's :func:`signature` where it has one
    (the process then builds from it without making the launch)."""

    ref: str
    space: str | None
    key_names: str | None
    launch: str
    key: tuple[tuple[str, Any], ...]
    signature: Signature | None = None


def signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature | None:
    """``args`` and ``kwargs`` as Triton specialises a build on them, for a process to build the same kernel
    without making the launch: Triton's ``warmup`` takes a tensor's dtype for the tensor (assumed 16-byte aligned,
    as Triton's specialisation asks) and every plain value as it is. Making the launch in each process would put
    its tensors on the GPU (gigabytes for a model's experts, drawn by kernels) beside the one being timed. None where
    the signature would not be the same build: a tensor not 16-byte aligned, a tensor passed by keyword, a value of
    another kind."""
    out: list[Any] = []
    for a in args:
        if hasattr(a, "data_ptr") and hasattr(a, "dtype"):
            if a.data_ptr() % 16:
                return None
            out.append(a.dtype)
        elif isinstance(a, _PLAIN):
            out.append(a)
        else:
            return None
    if not all(isinstance(v, _PLAIN) for v in kwargs.values()):
        return None
    return tuple(out), tuple(kwargs.items())


_executors: dict[tuple[str, str | None, str | None], ProcessPoolExecutor] = {}
_lock = threading.Lock()
#: the pools whose processes have all been started (each by a thread of its own, which waits for their server)
_up: set[ProcessPoolExecutor] = set()
#: the pools one of whose processes has returned a build: their processes are up (a pool's first builds wait for
#: its processes to start: seconds of imports, longer when several workers of a host start theirs at once)
_warm: set[ProcessPoolExecutor] = set()


#: what a process that builds imports (or computes) before its first build: torch, Triton, its code generator and
#: its key of its own build (a second of hashing in each process otherwise); a server that forks them preloads it
PRELOAD = ("torch", "triton", "triton.runtime.cache:triton_key", "triton.compiler.code_generator")
#: a begun build waited for at most this long (a Triton compile takes seconds): past it the measurement builds the
#: point itself, so that a process that hangs holds up one point, not the key
BUILD_WAIT_S = 300.0
#: the search's next-ranked points built on speculation, per process: a proposal was mostly ranked next only a few
#: evaluations before it came, less than a build's time; ranked deeper, more are built when proposed (a re-ranking
#: drops the builds not started: the extra depth costs idle processes' time)
SPECULATED = 2
#: processes kept free of background builds (:meth:`ProcessBuilds.background`), so that the search's next proposal
#: starts building at once instead of behind builds of a later key's configurations
RESERVED = 2
#: build processes by default at most: past a dozen or so the pool outruns the GPU's timing, and each holds torch,
#: Triton and the kernel (and, for a launch without a signature, a CUDA context and its key's tensors on the GPU)
MAX_PROCESSES = 16


def processes() -> int:
    """Build processes: ``EVOTUNE_COMPILE_THREADS`` where set, else :func:`for_cores` of the host's cores."""
    from evotune.triton_tuning.compile_ahead import pool_threads

    return pool_threads() or for_cores(os.cpu_count() or 1)


def for_cores(cores: int) -> int:
    """Build processes for ``cores`` cores: all less two (one times, one serves the run), at most
    :data:`MAX_PROCESSES`, at least one."""
    return max(1, min(MAX_PROCESSES, cores - 2))


def executor(ref: LaunchRef) -> ProcessPoolExecutor | None:
    """The processes that build ``ref``'s kernel, shut down when this process exits; started on first use, and None
    until they are (the measurement builds meanwhile)."""
    pool = _executor((ref.ref, ref.space, ref.key_names))
    return pool if pool in _up else None


def _executor(name: tuple[str, str | None, str | None], fork: bool = False) -> ProcessPoolExecutor:
    """The pool of kernel ``name``, made (and its processes started) if there is none or it broke: forked from this
    process itself with ``fork`` (:func:`start` says when that is safe), else from a server of its own."""
    with _lock:
        pool = _executors.get(name)
        # a pool whose processes died (killed, or ended with their server) takes no more builds: a new one replaces it
        if pool is None or getattr(pool, "_broken", False):
            if fork:
                ctx: Any = mp.get_context("fork")
            else:
                module = name[0].rpartition(":")[0]
                ctx = start_method((*PRELOAD, *(() if module.endswith(".py") else (module,))))
            pool = ProcessPoolExecutor(processes(), mp_context=ctx, initializer=pool_initializer,
                                       initargs=(dict(os.environ), _child))
            _executors[name] = pool
            if len(_executors) == 1:
                atexit.register(shutdown)
            if fork:  # the processes fork at the first task, in milliseconds: no thread waits for them
                _start_processes(pool, name)
            else:  # the first task waits for the server's imports, seconds
                threading.Thread(target=_start_processes, args=(pool, name), name="evotune-build-start",
                                 daemon=True).start()
        return pool


def _start_processes(pool: ProcessPoolExecutor, name: tuple[str, str | None, str | None]) -> None:
    """Start every process of ``pool``, each loading the kernel ahead of its first build: the pool starts a process
    for each task no started process is free for."""
    for _ in range(processes()):
        try:
            pool.submit(prepare, *name).add_done_callback(lambda f: _warmed(pool, f))
        except RuntimeError:  # broken or shut down meanwhile: the next key's builds start a new pool
            return
    _up.add(pool)


def start(ref: str, space: str | None = None, key_names: str | None = None) -> None:
    """Start the build processes of kernel ``ref`` (as ``tune-kernel`` names it) now, before its first key, so that
    its builds find them up sooner. Called before this process starts CUDA and any thread (a tune-model worker, a
    fork of a server that imported torch, Triton and the kernel), the processes are forked from it: up in well
    under a second, where a server of their own imports torch and Triton again for seconds. Nothing where builds
    do not run ahead (the interpreter, ``EVOTUNE_COMPILE_THREADS=0``)."""
    from evotune.triton_tuning.compile_ahead import CompilePool

    if CompilePool.available():
        _executor((ref, space, key_names), fork=fork_safe())


def fork_safe() -> bool:
    """Whether this process may fork build processes: one thread (no lock another holds is copied into them) and
    CUDA not started (a forked child could not use it; theirs never do, but a launch built without a signature
    would)."""
    return "fork" in mp.get_all_start_methods() and threading.active_count() == 1 and not inherited_cuda()


def _warmed(pool: ProcessPoolExecutor, future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        _warm.add(pool)


def shutdown() -> None:
    """Stop every pool's processes: builds not started are dropped, those running are cut (a build writes its
    cache entry whole or not at all), so that a run's end does not wait for builds no key will measure."""
    with _lock:
        for pool in _executors.values():
            pids = list(getattr(pool, "_processes", None) or {})  # the pool keeps no public list of them
            pool.shutdown(wait=False, cancel_futures=True)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass  # ended already
        _executors.clear()
        _warm.clear()
        _up.clear()


class ProcessBuilds:
    """One key's proposals built by the pool's processes: :class:`~evotune.triton_tuning.compile_ahead.CompilePool`'s
    interface (``depth``, ``submit``, ``ready``, ``wait``, ``close``)."""

    def __init__(self, ref: LaunchRef, key_of: Callable[[Point], str], depth: int):
        self.ref, self.key_of, self.depth = ref, key_of, depth
        self.ahead = SPECULATED * depth
        self._pool = executor(ref)
        self._futures: dict[str, Future[bool | None]] = {}
        self._later: list[Point] = []  # background builds not handed to the processes yet, next first
        self._background: dict[str, Future[bool | None]] = {}
        self._on_built: Callable[[str], None] = lambda key: None

    def submit(self, points: list[Point]) -> None:
        if self._pool is None:
            self._pool = executor(self.ref)
        pool = self._pool
        if pool is None:  # its processes are still being started: the measurement builds these
            return
        for point in points:
            key = self.key_of(point)
            if self._adopt(key):  # begun in the background: waited for as the search's own
                continue
            if key not in self._futures:
                try:
                    future = pool.submit(build, self.ref, dict(point), _gpu())
                except RuntimeError:  # the pool broke (its processes died): the measurement builds the rest
                    return
                future.add_done_callback(lambda f: _warmed(pool, f))
                self._futures[key] = future
        self._refill()

    def background(self, points: list[Point], on_built: Callable[[str], None]) -> None:
        """Build ``points`` (configurations later keys will search, next first) while the processes idle: only
        while none of the search's own builds is running or queued, and never on the last :data:`RESERVED`
        processes, so that its next proposal starts building at once. ``on_built(key)`` hears each one built (or
        found in the cache): a later key's search counts it as built, and its measurement as loaded, not compiled
        (a key's compiles are its own search's). The ones not begun when the key ends are dropped."""
        self._later = list(points)
        self._on_built = on_built
        self._refill()

    def _refill(self) -> None:
        """Hand background builds to the processes the search's own builds leave idle."""
        pool = self._pool
        if pool is None or pool not in _warm or not self._later:
            return  # processes still starting: the search's own builds come first
        if any(not f.done() for f in self._futures.values()):
            return
        room = self.depth - RESERVED - sum(not f.done() for f in self._background.values())
        while room > 0 and self._later:
            point = self._later.pop(0)
            key = self.key_of(point)
            if key in self._futures or key in self._background:
                continue
            try:
                future = pool.submit(build, self.ref, dict(point), _gpu())
            except RuntimeError:  # the pool broke: no more background builds for this key
                self._later = []
                return
            future.add_done_callback(functools.partial(self._heard, key))
            self._background[key] = future
            room -= 1

    def _heard(self, key: str, future: Future[bool | None]) -> None:
        """A background build's end (in the pool's thread)."""
        if not future.cancelled() and future.exception() is None and future.result() is not None:
            self._on_built(key)

    def _adopt(self, key: str) -> bool:
        """Whether ``key`` was a background build, now the search's own: one still running is waited for and
        counted as the key's compile (:meth:`wait`), one ended is a load."""
        future = self._background.pop(key, None)
        if future is None:
            return False
        self._futures[key] = _done if future.done() else future
        return True

    #: builds still queued are taken back: the tuner may hand the search's next-ranked points to build meanwhile
    speculates = True

    def speculate(self, points: list[Point]) -> None:
        """Build ``points`` (the one to measure next first); queued builds of points not among them are dropped,
        so that the queue holds what the search ranks highest now, not what it ranked before."""
        wanted = {self.key_of(p) for p in points}
        for key, future in list(self._futures.items()):
            if key not in wanted and future.cancel():  # a running build finishes into the shared cache
                del self._futures[key]
        self.submit(points)

    def ready(self, point: Point) -> bool:
        self._refill()
        key = self.key_of(point)
        future = self._futures.get(key, self._background.get(key))
        return future is None or future.done()

    def wait(self, point: Point) -> None:
        """Wait for ``point``'s build where a process has started it; one still queued (behind others), or handed
        out while the processes start (the pool marks the first few running before any process is up), is left
        to the measurement, which builds it here, sooner (a process that builds it too writes the same entry). While
        it waits, this process's GPU turn is given up (:mod:`evotune.measurement.gpu_turn`)."""
        self._adopt(self.key_of(point))
        future = self._futures.get(self.key_of(point))
        if future is None:
            return
        if future.cancel() or self._pool is None or self._pool not in _warm:
            self._futures[self.key_of(point)] = _done
            return
        try:
            with gpu_turn.away():  # a worker sharing this GPU times meanwhile
                built = future.result(timeout=BUILD_WAIT_S)
        except Exception:  # the process died, hung, or could not make the launch: the measurement builds it here
            return
        finally:
            self._futures[self.key_of(point)] = _done
        if built:
            BUILT.add(1)

    def close(self) -> None:
        """Builds not started are dropped; those running finish on their own, into the shared cache."""
        self._later = []
        for future in [*self._futures.values(), *self._background.values()]:
            future.cancel()
        self._futures.clear()
        self._background.clear()


_done: Future[bool | None] = Future()
_done.set_result(None)

# in a pool process: the kernel of each reference, and the latest key's launch
_kernels: dict[tuple[str, str | None, str | None], Any] = {}
_launch: dict[str, Any] = {}


#: the GPU a pool's processes compile for, as the timing process's Triton driver reports it: the driver's class,
#: then Triton's ``GPUTarget`` fields (backend, arch, warp size)
Target = tuple[type, str, Any, int]


_compiling_for: list[Target] = []  # in a pool process: the GPU its driver answers for


@functools.cache
def _gpu() -> Target | None:
    """This process's :func:`target`, asked once (with the first build handed out: its CUDA is started by then)."""
    return target()


def target() -> Target | None:
    """This process's GPU as Triton compiles for it, for its build processes; None under the interpreter or where
    Triton finds no GPU (the processes then ask Triton's driver themselves)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None
    try:
        from triton.runtime.driver import driver

        active = driver.active
        gpu = active.get_current_target()
    except Exception:  # no GPU, or no driver: the processes find out for themselves
        return None
    return type(active), gpu.backend, gpu.arch, gpu.warp_size


def _child() -> None:
    """A pool process's start: below the timing process's priority (its builds must not take the core the timed
    launches are issued from), and ended with its parent (this process, or the server, which ends with this
    process: a worker killed, SIGKILL included, leaves no build process behind holding the GPU)."""
    try:
        os.nice(5)
    except OSError:
        pass
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass  # no prctl here: the pool's own shutdown ends the processes


def compile_only(gpu: Target) -> None:
    """In a pool process: Triton's driver answers for ``gpu`` (device 0, the default stream, its target) without
    a call to CUDA. A build (``warmup``) asks the driver only for these, but through torch they would initialise
    CUDA in each process: NVML and the driver's start, about 6 s in each of 56 processes starting together on a
    four-GPU host, which the first key's first builds waited for. Nothing is launched or loaded here, so nothing
    needs a context. Left as it is where this Triton's driver cannot be set."""
    cls, backend, arch, warp_size = gpu
    try:
        from triton.backends.compiler import GPUTarget
        from triton.runtime.driver import driver

        answers = cls()  # torch's CUDA functions are kept, not called
        fixed = GPUTarget(backend, arch, warp_size)
        answers.get_current_device = lambda: 0
        answers.get_current_stream = lambda device=None: 0
        answers.get_current_target = lambda: fixed
        if isinstance(arch, int):
            answers.get_device_capability = lambda device=None: divmod(arch, 10)
        driver.set_active(answers)
    except Exception:
        return
    _compiling_for.append(gpu)


def prepare(ref: str, space: str | None, key_names: str | None) -> None:
    """In a pool process: load the kernel (its module's imports: torch, Triton), ahead of the first build."""
    try:
        _kernel((ref, space, key_names))
    except Exception:
        return  # the first build tries again, and leaves the point to the measurement if it fails


def _kernel(name: tuple[str, str | None, str | None]) -> Any:
    """In a pool process: the kernel ``name`` refers to, and its module, loaded once."""
    if name not in _kernels:
        from evotune.triton_tuning.references import load_kernel

        _kernels[name] = load_kernel(*name)
    return _kernels[name]


def build(ref: LaunchRef, point: Point, gpu: Target | None = None) -> bool | None:
    """In a pool process: compile ``point``'s configuration for ``ref``'s launch, for ``gpu`` (the timing process's,
    without CUDA here: :func:`compile_only`). True: compiled; False: found in the cache; None: the launch could not
    be made or the configuration did not build (the measurement builds it again and records why)."""
    from evotune.triton_tuning.plain import without_config
    from evotune.triton_tuning.resources import compile_config

    if gpu is not None and not _compiling_for:
        compile_only(gpu)
    try:
        kernel, module = _kernel((ref.ref, ref.space, ref.key_names))
        if ref.signature is not None:  # warmup compiles without launching: no grid is read
            args, kwargs = ref.signature
            _launch.update(ref=ref, grid=(1,), args=args, kwargs=dict(kwargs))
        elif _launch.get("ref") != ref:
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


__all__ = ["BUILT", "MAX_PROCESSES", "PRELOAD", "SPECULATED", "LaunchRef", "ProcessBuilds", "Target", "build",
           "compile_only", "executor", "for_cores", "fork_safe", "prepare", "processes", "shutdown", "signature",
           "start", "target"]

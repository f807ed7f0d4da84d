"""Where the GPU worker and the compile processes start from: a forkserver that imported the heavy modules once.

Each of those processes needs torch and the space's compiler (CuTe DSL and cutlass.operators, say): seconds
of imports on a GPU host, more with a dozen compile processes importing side by side, and paid again by every
GPU worker that replaces one after a crash. So they are forked from one server process instead. The server is
a fresh interpreter (started the way ``spawn`` starts one, so none of the tuner's threads, storage connections
or sockets are in it); it imports the modules it is given once, never initialises CUDA and runs no threads, so
forking it is safe, and a child starts in milliseconds with those modules imported.

What the server imports is fixed when it starts: the first caller's ``preload``, read with the environment and
``sys.path`` of that moment; a module that fails to import there is left for the child to import (and report).
A child runs with its parent's environment as it is when the child starts (:func:`as_child`,
:func:`pool_initializer`), as under ``spawn``, and on its parent's CPUs (:func:`as_child`): the server itself
keeps the CPUs of its own start, so that its imports can run beside the parent's start-up on cores the parent
then leaves (:mod:`evotune.measurement.host`); only what a preloaded module read at import time is the
server's. Processes that need other import-time settings (CuTe DSL's ``CUTE_DSL_ARCH``, to compile for
another GPU) use ``spawn``. Where the platform has no forkserver, :func:`start_method` is ``spawn``.

Example::

    ctx = start_method(("torch", "cutlass.cute"))
    proc = ctx.Process(target=as_child, args=(Inherited.here(), worker_main, conn), daemon=True)
    pool = ProcessPoolExecutor(8, mp_context=ctx, initializer=pool_initializer, initargs=(dict(os.environ),))
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

from evotune.measurement.host import own_cpus

INHERITED_CUDA = "started from a process that had initialised CUDA"  # how a child that must not go on says why
PRELOAD_ENV = "EVOTUNE_PRELOAD"  # the server reads its list of modules here (evotune.measurement._preload)
# the contexts evotune starts processes with (both have Process, Pipe, Queue...; BaseContext declares none)
StartContext = SpawnContext | ForkServerContext
_lock = threading.Lock()
_server_started = False


def start_method(preload: Iterable[str] = ()) -> StartContext:
    """The multiprocessing context to start processes with: the forkserver, importing ``preload`` when it
    starts (this call starts it unless it runs already; ``MODULE:FUNCTION`` also calls the function, with no
    arguments, a cache to compute once for every child), or ``spawn`` where there is no forkserver."""
    global _server_started
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    with _lock:
        if not _server_started:
            from multiprocessing import forkserver

            ctx.set_forkserver_preload(["evotune.measurement._preload"])
            before = os.environ.get(PRELOAD_ENV)
            os.environ[PRELOAD_ENV] = ",".join(dict.fromkeys(preload))
            try:
                forkserver.ensure_running()  # the server inherits the environment now; its imports start at once
            finally:
                if before is None:
                    os.environ.pop(PRELOAD_ENV, None)
                else:
                    os.environ[PRELOAD_ENV] = before
            _server_started = True
    return ctx


@dataclass(frozen=True)
class Inherited:
    """What a child of the server takes from the process that starts it, as a child of ``spawn`` would: that
    process's environment and the CPUs it may run on (None where the platform cannot say)."""

    env: dict[str, str]
    cpus: frozenset[int] | None

    @classmethod
    def here(cls) -> Inherited:
        """This process's environment and CPUs, now."""
        return cls(dict(os.environ), own_cpus())


def as_child(parent: Inherited, target: Callable[..., Any], *args: Any) -> Any:
    """A process's entry point: take ``parent``'s environment and CPUs (:class:`Inherited`), then run ``target``."""
    _replace_environment(parent.env)
    if parent.cpus is not None and parent.cpus != own_cpus():
        try:
            os.sched_setaffinity(0, parent.cpus)
        except OSError:  # none of them is this process's to take now (its CPU set changed): it runs where it is
            pass
    return target(*args)


def pool_initializer(env: dict[str, str], then: Callable[[], Any] | None = None) -> None:
    """A pool process's initializer: take ``env`` (the parent's when it made the pool), then run ``then``."""
    _replace_environment(env)
    if then is not None:
        then()


def _replace_environment(env: dict[str, str]) -> None:
    if env != dict(os.environ):
        os.environ.clear()
        os.environ.update(env)


def inherited_cuda() -> bool:
    """Whether this process, before any CUDA call of its own, finds the driver initialised: it was forked from a
    process that had initialised it, and its CUDA calls would fail. False where there is no driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    context = ctypes.c_void_p()
    not_initialized = 3  # CUDA_ERROR_NOT_INITIALIZED: what a process that has not called cuInit gets
    status = int(cuda.cuCtxGetCurrent(ctypes.byref(context)))  # a CUresult, ctypes' default int return
    return status != not_initialized


def refuse_inherited_cuda() -> None:
    """Raise (with :data:`INHERITED_CUDA` in the message) when :func:`inherited_cuda`: a process that needs the
    GPU says so at its start, and is started again with ``spawn``."""
    if inherited_cuda():
        raise RuntimeError(f"{INHERITED_CUDA} (one of the forkserver's preloaded modules did)")

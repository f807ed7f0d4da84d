"""The GPU evaluator: build -> verify -> time, in a worker process that may die.

A candidate that fails to compile, computes the wrong answer, crashes the CUDA
context (an illegal address), or hangs, fails only its own trial:

* the worker process owns the GPU; the tuner process never initialises CUDA;
* a compile error or a wrong result comes back as a failed result, and the
  worker carries on;
* an error that poisons the CUDA context makes the worker report ``crash``
  and exit; a worker that dies without a word (segfault, abort) is a
  ``crash`` too; one that does not answer within ``options.timeout_s`` is
  killed and the point is a ``timeout``. Either way a fresh worker takes over.

Compiling overlaps timing: when the space can ``precompile`` (fill its
on-disk kernel cache without launching), a pool of compile processes, sized
by CPU cores and memory (a CuTe DSL compile takes about 1 GB) and sharing the
host with the other workers on it (:mod:`evotune.measurement.host`), builds the
points the tuner will ask for next while the GPU worker times the current one;
the GPU worker then loads them from the cache. A compile process that dies
fails only the point it was compiling.

With a time budget (:meth:`Evaluator.bound`), waiting ends at the deadline:
a point whose compile or whose GPU worker is still busy then is dropped
(:class:`DeadlinePassed`; the worker is killed and started afresh), and
:meth:`abandon` kills the compiles in flight, so that the run ends when its
budget says and the confirmation stage finds the cores idle.

Spaces are loaded in each process by name (``SearchSpace.source``), so
nothing of the user's is pickled; the worker gets ``options.timing``, how its
oracle samples. The worker and the compile processes fork from a server that
imported torch and the space's ``preload`` once (:mod:`evotune.measurement.processes`).

Example::

    with GpuEvaluator(space, OracleOptions(timeout_s=60)) as ev:
        ev.evaluate(point, problem).time_ms
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterable
from concurrent.futures import wait
from dataclasses import dataclass, replace
from typing import Any

from evotune.core.problem import Problem
from evotune.core.result import EvalResult
from evotune.core.space import Point, SearchSpace
from evotune.measurement.base import DeadlinePassed, Evaluator
from evotune.measurement.gpu_worker import worker_main
from evotune.measurement.host import default_workers, place_pool, pool_cpus
from evotune.measurement.isolation import WorkerProcess
from evotune.measurement.kernel_cache import BuiltElsewhere, building, never_wait
from evotune.measurement.messages import Confirm, DeviceInfo, Evaluate, ReplyStatus, TimeBaselines
from evotune.measurement.options import OracleOptions
from evotune.measurement.processes import StartContext, pool_initializer, start_method
from evotune.measurement.space_worker import SpaceWorker


class GpuEvaluator(Evaluator):
    kind = "gpu"
    confirms = True
    shared_worker: SpaceWorker

    def __init__(self, space: SearchSpace, options: OracleOptions | None = None, worker: SpaceWorker | None = None):
        if not space.source or space.build is None:
            raise ValueError(f"space {space.name!r} cannot run on a GPU: it has no build function")
        options = options or OracleOptions()
        self.space, self.options = space, options
        self.timeout_s = float(options.timeout_s)
        # the GPU worker and the compile pool fork from a server that imported torch and the space's compiler
        start = start_processes([space])
        # another space's evaluator may lend its GPU worker: one process, one CUDA context for a run's spaces
        self.shared_worker = worker or SpaceWorker(WorkerProcess(worker_main, (self.space.source, options.timing),
                                                                 "GPU worker", self.timeout_s, start=start))
        self._worker = self.shared_worker.view(self.space.source, owner=worker is None)
        self._worker.spawn()  # its imports and CUDA start-up overlap the first compiles
        self._seed = 0
        self.cache_stats: dict[str, int] = {}  # compiled-kernel cache: hit / miss / memory -> count
        workers = default_workers() if options.workers is None else options.workers
        self.workers = workers if space.precompile else 0
        self.prefetch_depth = max(1, self.workers)
        self._pool: Any = None
        self._compiling: dict[tuple[str, str], Any] = {}  # (problem key, point key) -> future of its precompile

    @property
    def restarts(self) -> int:
        """GPU workers replaced after a crash or a timeout."""
        return self._worker.restarts

    def prefetch(self, points: list[Point], problem: Problem) -> None:
        """Start compiling ``points`` in the pool; ``evaluate`` picks them up from the kernel cache."""
        if not self.workers:
            return
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            # started as the GPU worker is now: with spawn too once a forked worker found CUDA initialised
            self._pool = ProcessPoolExecutor(self.workers, mp_context=self.shared_worker.process.start_context,
                                             initializer=pool_initializer,
                                             initargs=(dict(os.environ), functools.partial(_pool_init, pool_cpus())))
        for p in points:
            key = (problem.key, self.space.key(p))  # one evaluator may serve several problems (record)
            if key not in self._compiling:
                self._compiling[key] = self._pool.submit(_precompile, self.space.source, p, problem.to_dict())

    def ready(self, point: Point, problem: Problem) -> bool:
        """Not prefetched, or its kernel built: by the pool, or by another process (whose compile the pool did not
        wait for) that is done with it."""
        future = self._compiling.get((problem.key, self.space.key(point)))
        if future is None:
            return True
        if not future.done():
            return False
        try:
            elsewhere = future.result().elsewhere
        except Exception:  # the compile process died: the GPU worker compiles the point itself
            return True
        return elsewhere is None or not building(elsewhere)

    def _left(self) -> float | None:
        """Seconds to the run's deadline, when it is nearer than a point's own time limit; else None."""
        left = None if self.time_left is None else self.time_left()
        return None if left is None or left >= self.timeout_s else max(0.0, left)

    def _precompiled(self, point: Point, problem: Problem) -> tuple[float, str | None, bool | None]:
        """(seconds, error, cache hit) of a prefetched point; (0, None, None) when it was not prefetched.
        Raises :class:`DeadlinePassed` when its compile is still running at the run's deadline."""
        key = (problem.key, self.space.key(point))
        future = self._compiling.get(key)
        if future is None:
            return 0.0, None, None
        left = self._left()
        if left is not None and not wait([future], timeout=left).done:
            raise DeadlinePassed(f"{self.space.key(point)} was still compiling at the run's deadline")
        del self._compiling[key]
        try:
            done = future.result(timeout=self.timeout_s)
        except Exception as exc:  # the compile process died or hung: the GPU worker compiles it itself
            self.abandon()
            return 0.0, f"pool: {type(exc).__name__}: {exc}", None
        if done.elsewhere is not None:  # another process's compile: the GPU worker loads it (once that is done)
            return 0.0, None, None
        return done.seconds, done.error, done.hit

    def _settle(self) -> None:
        """Drop the compiles queued for points that will not be asked for, and wait for the running ones:
        compile processes busy on the same cores would slow the GPU worker's host side while it times."""
        for future in self._compiling.values():
            future.cancel()
        for future in self._compiling.values():
            if not future.cancelled():
                try:
                    future.result(timeout=self.timeout_s)
                except Exception:  # its point is not evaluated any more: nothing to report
                    pass
        self._compiling.clear()

    def abandon(self) -> None:
        """Kill the compiles in flight, the compilers they started included, and drop the queued ones: the run's
        time is spent, or a compile hung. A compiler left running would hold its kernel's cache lock, and the
        GPU worker would wait for it, and take the cores a later compile needs."""
        if self._pool is not None:
            processes = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                kill_group(process)
            self._pool = None
        self._compiling.clear()

    def close(self) -> None:
        self.abandon()  # nothing is compiling at a normal end; after an interrupt, nobody waits for a compile
        self._worker.close()

    # -- the interface -------------------------------------------------------
    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        self._seed += 1
        pool_s, pool_error, pool_hit = self._precompiled(point, problem)
        # The GPU worker builds the point whatever happened in the pool: a kernel cache hit when the
        # pool compiled it; otherwise it compiles itself, so an error is reported as the GPU sees it.
        left = self._left()
        called = time.perf_counter()
        reply = self._worker.call(Evaluate(point, problem.to_dict(), self._seed), timeout_s=left)
        if left is not None and reply.status is ReplyStatus.TIMEOUT:
            raise DeadlinePassed(f"{self.space.key(point)} was still being evaluated at the run's deadline")
        extra = reply.extra
        # worker_s: the GPU worker's time on the point (build, verify, time); served_s: of it, inside the GPU worker
        # (the rest: the pipe, this process's delays). Neither counts its wait for another process's compile of the
        # kernel (waited_s): a compile wait, as this process's wait for the pool is.
        waited = float(extra.get("waited_s", 0.0))
        extra["worker_s"] = time.perf_counter() - called - waited
        extra["served_s"] = reply.served_s - waited
        if pool_error:
            extra["pool_error"] = pool_error
        elif pool_hit is not None:  # prefetched: the pool found it in the cache, or compiled it there
            extra["build_s"] = reply.compile_s  # the GPU worker's own part: loading it
            reply.compile_s = pool_s + reply.compile_s
            extra["compiled_in"] = "pool"
            if "kernel_cache" in extra:
                extra["kernel_cache"] = "hit" if pool_hit else "miss"
        cached = extra.get("kernel_cache")
        if cached:
            self.cache_stats[cached] = self.cache_stats.get(cached, 0) + 1
        return reply.result()

    def baselines(self, problem: Problem) -> dict[str, dict[str, Any]]:
        """cuBLAS (through torch) timed by the same oracle in the same worker: name -> timing."""
        return self._worker.call(TimeBaselines(problem.to_dict())).baselines

    def device_info(self) -> dict[str, Any]:
        return self._worker.call(DeviceInfo()).info

    def confirm(self, points: list[Point], problem: Problem, search_ms: list[float],
                seconds: float | None = None) -> dict[str, Any] | None:
        """Re-time ``points`` (the best of a search, with the times it measured) and every baseline,
        interleaved in one GPU worker (see :mod:`evotune.measurement.retiming`); the stage's record.
        With ``seconds``, the warm-up and the rounds fit in them (at least a second of rounds).

        The record's ``items`` are keyed by each point's key and by each baseline's name; ``configs``
        maps each point's key to its parameters. None when the stage is off.
        """
        opts = self.options.confirm
        if opts.top_k <= 0 or not points:
            return None
        if seconds is not None:
            warmup = min(opts.warmup_s, seconds / 10)
            opts = replace(opts, warmup_s=warmup, max_seconds=max(1.0, min(opts.max_seconds, seconds - warmup)))
        self._settle()
        # After a resume, or on a host whose kernel cache is cold, the candidates are not built: build them side
        # by side in the pool first, not one after another in the GPU worker (a minute each for nvcc). A failed
        # build is left to the GPU worker, which reports it as it sees it.
        self.prefetch(points, problem)
        for point in points:
            self._precompiled(point, problem)
        budget = opts.max_seconds + opts.warmup_s + self.timeout_s * (len(points) + 1)
        reply = self._worker.call(Confirm(points, problem.to_dict(), search_ms, opts), timeout_s=budget)
        if not reply.ok or reply.confirmation is None:
            return {"error": reply.message or reply.status.value}
        return reply.confirmation


def kill_group(process: Any) -> None:
    """Kill a compile process and what it started (its process group, :func:`_pool_init`); the process alone
    where it does not lead a group (killed before its initializer ran)."""
    try:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
            return
    except (ProcessLookupError, PermissionError, TypeError):
        pass
    process.kill()


def start_processes(spaces: Iterable[SearchSpace]) -> StartContext:
    """Start the server that GPU workers and compile processes fork from (unless it runs), importing torch, the
    worker's modules and ``spaces``' preload; how to start processes from it. A run calls this before opening
    its storage and studies, so the server's imports overlap them."""
    modules = ["torch", "evotune.measurement.gpu_worker"]
    for space in spaces:
        modules += space.preload
    return start_method(modules)


def _pool_init(cpus: frozenset[int] | None) -> None:
    from evotune.measurement.kernel_cache import cache_root
    from evotune.measurement.processes import refuse_inherited_cuda

    refuse_inherited_cuda()  # the pool breaks: the GPU worker compiles its points, the next pool starts as it does
    # a compile process leads its own process group, so that killing the group (kill_group) ends the nvcc it runs
    # too: killed alone, it would leave nvcc compiling as an orphan
    os.setpgrp()
    # below the tuner and the GPU worker: where the host's cores are all busy (several workers on one host),
    # a compile waits, not the measuring process's launches and synchronisations, which every point waits on
    os.nice(5)
    place_pool(cpus)  # and off the cores the host's workers measure on
    never_wait()  # a kernel another process compiles is not this process's to wait for: it takes its next point

    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / "triton"))
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")


_POOL_SPACES: dict[str, SearchSpace] = {}  # in a compile process: the spaces it has loaded, by source


@dataclass(frozen=True)
class Precompiled:
    """What a compile process did for one point: its ``seconds``, the compile's ``error`` (None: built), whether
    the kernel was in the cache (``hit``), or ``elsewhere``: another process is compiling it (the lock it holds,
    :func:`evotune.measurement.kernel_cache.building`), and this one did not wait."""

    seconds: float
    error: str | None = None
    hit: bool = False
    elsewhere: str | None = None


def _precompile(space_source: str, point: Point, problem: dict[str, Any]) -> Precompiled:
    """In a compile process: fill the kernel cache for one point."""
    from evotune.core.plugins import load_space

    started = time.perf_counter()
    try:
        if space_source not in _POOL_SPACES:  # once per compile process: a .py space runs its module
            _POOL_SPACES[space_source] = load_space(space_source)
        precompile = _POOL_SPACES[space_source].precompile
        assert precompile is not None  # the pool exists only for a space that can precompile (GpuEvaluator.__init__)
        hit = bool(precompile(point, Problem.from_dict(problem)))
    except BuiltElsewhere as exc:
        return Precompiled(time.perf_counter() - started, elsewhere=str(exc.lock))
    except Exception as exc:
        return Precompiled(time.perf_counter() - started, f"{type(exc).__name__}: {exc}"[:2000])
    return Precompiled(time.perf_counter() - started, hit=hit)

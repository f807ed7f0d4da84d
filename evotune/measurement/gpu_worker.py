"""The GPU worker process: it owns the GPU, and builds, verifies and times what it is sent.

:class:`evotune.measurement.gpu.GpuEvaluator` starts it (through
:class:`evotune.measurement.isolation.WorkerProcess`) and talks to it over a pipe;
the requests (:mod:`evotune.measurement.messages`) are ``Evaluate`` (one point), ``TimeBaselines``,
``DeviceInfo`` (device, clocks, versions, copy bandwidth), ``Confirm`` (the confirmation stage) and
``UseSpace`` (serve another space from now on: :mod:`evotune.measurement.space_worker`). A candidate
that breaks the CUDA context makes the reply ``fatal``: the process exits and
the evaluator starts another. A point that runs the device out of memory is answered
``OUT_OF_MEMORY`` (recorded as a runtime error); the first time, when the worker holds kernels built
for earlier points, it lets them go and measures the point again.
"""

from __future__ import annotations

import os
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from evotune.core.problem import Problem, Workload, call_args
from evotune.core.space import Point
from evotune.measurement.isolation import answer_requests
from evotune.measurement.kernel_cache import waited_s
from evotune.measurement.messages import (
    Confirm,
    DeviceInfo,
    Evaluate,
    Reply,
    ReplyStatus,
    Request,
    TimeBaselines,
    UseSpace,
    unknown,
)
from evotune.measurement.options import ConfirmOptions, TimingOptions
from evotune.measurement.space_worker import use_space

KEEP_KERNELS = 64  # built kernels a GPU worker keeps, most recently used first


def worker_main(conn: Any, space_source: str, timing: TimingOptions) -> None:
    """The process's entry point: load the space and serve requests until told to stop."""
    from evotune.measurement.kernel_cache import cache_root

    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / "triton"))  # before triton is imported
    # a reply marked fatal (a CUDA context a candidate broke) ends this process; the parent starts another
    answer_requests(conn, lambda: _Worker(space_source, timing))


class _Worker:
    def __init__(self, space_source: str, timing: TimingOptions):
        from evotune.core.plugins import load_space
        from evotune.measurement.oracle import Oracle
        from evotune.measurement.processes import refuse_inherited_cuda

        refuse_inherited_cuda()  # before CUDA's first call here: the evaluator starts this worker again if so
        self.space = load_space(space_source)
        self.oracle = Oracle(timing)
        _first_blas_call()
        # (problem key, point key) -> built kernel, the most recent few: a built kernel may hold device
        # buffers, and a recording builds thousands (spaces keep their own cheaper caches of binaries)
        self.kernels: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.inputs: dict[str, tuple[Any, ...]] = {}

    def handle(self, request: Request) -> Reply:
        if isinstance(request, UseSpace):  # from now on, requests are for another space of the run
            return use_space(self, request.source)
        if isinstance(request, Evaluate):
            problem = Problem.from_dict(request.problem)
            reply = self.evaluate(request.point, problem, request.seed)
            if reply.status is ReplyStatus.OUT_OF_MEMORY and self.kernels and not reply.fatal:
                # memory this worker holds (kernels built earlier, their buffers) is not the point's fault:
                # let it all go and measure the point again; a second OOM is the point's own
                self.kernels.clear()
                self.inputs.clear()
                self._free()
                reply = self.evaluate(request.point, problem, request.seed)
                reply.extra["retried_after_oom"] = True
            return reply
        if isinstance(request, TimeBaselines):
            return Reply(ReplyStatus.OK, baselines=self.baselines(Problem.from_dict(request.problem)))
        if isinstance(request, Confirm):
            try:
                return self.confirm(request.points, Problem.from_dict(request.problem), request.search_ms,
                                    request.options)
            except Exception as exc:  # a launch that failed mid-race: the record says why, the worker lives on
                return self._failure(ReplyStatus.RUNTIME_ERROR, exc, 0.0, stage="confirm")
        if isinstance(request, DeviceInfo):
            info = device_info()
            info["copy_gbps"] = self.oracle.copy_bandwidth_gbps()
            info["read_gbps"] = self.oracle.read_bandwidth_gbps()  # what `best`'s % of read bandwidth is of
            info["flush"] = self.oracle.timing.flush
            return Reply(ReplyStatus.OK, info=info)
        return unknown(request)

    @staticmethod
    def _free() -> None:
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()

    def _inputs(self, problem: Problem) -> tuple[Any, ...]:
        if problem.key not in self.inputs:  # one problem's buffers at a time
            self.inputs = {problem.key: _workload(problem).make_inputs(problem, seed=12345)}
        return self.inputs[problem.key]

    def evaluate(self, point: Point, problem: Problem, seed: int) -> Reply:
        before = waited_s()
        reply = self._evaluate(point, problem, seed)
        waited = waited_s() - before
        if waited > 0:  # for another process's compile of the kernel: a compile wait, not this point's work
            reply.extra["waited_s"] = waited
        return reply

    def _evaluate(self, point: Point, problem: Problem, seed: int) -> Reply:
        workload = _workload(problem)
        kept = (problem.key, self.space.key(point)) in self.kernels
        started = time.perf_counter()
        kernel = self._kernel(point, problem)
        if isinstance(kernel, Reply):
            return kernel
        compile_s = 0.0 if kept else time.perf_counter() - started
        stage = "verify"
        checked = time.perf_counter()
        try:
            ok, err, why = _check(kernel, workload, problem, seed)  # fresh data for every check
            if not ok:
                return Reply(ReplyStatus.WRONG_RESULT, why, error=err, compile_s=compile_s)
            stage = "time"
            verify_s = time.perf_counter() - checked
            inputs = self._inputs(problem)
            workload.poison(inputs)
            args = call_args(kernel, inputs)
            timing = self.oracle.time(lambda: kernel(*args))
        except Exception as exc:
            return self._failure(ReplyStatus.RUNTIME_ERROR, exc, 0.0, compile_s, stage)
        # what the point cost beside compiling: verification and timing (preparing the graph included)
        extra: dict[str, Any] = {"ci95_ms": list(timing.ci95_ms), "graph": timing.graph, "trimmed": timing.trimmed,
                                 "verify_s": verify_s}
        if timing.notes:
            extra["notes"] = timing.notes
        hit = getattr(kernel, "cache_hit", None)  # set by builds that use the on-disk kernel cache
        if compile_s == 0.0:
            extra["kernel_cache"] = "memory"
        elif hit is not None:
            extra["kernel_cache"] = "hit" if hit else "miss"
        return Reply(ReplyStatus.OK, time_ms=timing.median_ms, samples_ms=timing.samples_ms, compile_s=compile_s,
                     bench_s=timing.bench_s, error=err, extra=extra)

    def _failure(self, status: ReplyStatus, exc: Exception, seconds: float, compile_s: float = 0.0,
                 stage: str = "compile") -> Reply:
        # compilers wrap the real error (Triton's CompilationError shows source, its cause says why)
        causes: list[str] = []
        e: BaseException | None = exc
        while e is not None and len(causes) < 4:
            causes.append(f"{type(e).__name__}: {e}".strip())
            e = e.__cause__ or e.__context__
        text = f"{stage}: " + " <- ".join(reversed(causes)) if len(causes) > 1 else f"{stage}: {causes[0]}"
        reply = Reply(out_of_memory_or(status, exc), text[:2000], compile_s=compile_s or seconds,
                      extra={"traceback": traceback.format_exc(limit=4)[-2000:]})
        if _context_poisoned():
            reply.status, reply.fatal = ReplyStatus.CRASH, True
        return reply

    def confirm(self, points: list[Point], problem: Problem, search_ms: list[float], opts: ConfirmOptions) -> Reply:
        """The confirmation stage in this worker: every point and baseline made ready once (verified on fresh
        data first), the GPU warmed up, then interleaved rounds of samples until the medians are tight.

        Each item's round is timed from a CUDA graph captured for that round only (:meth:`Oracle.round`)."""
        import time as _time

        import torch

        from evotune.measurement.retiming import confirm_rounds

        workload = _workload(problem)
        launches: dict[str, Any] = {}
        configs: dict[str, Point] = {}
        search: dict[str, float] = {}
        skipped: dict[str, str] = {}
        inputs = self._inputs(problem)
        for point, ms in zip(points, search_ms, strict=True):
            name = self.space.key(point)
            reply_or_kernel = self._kernel(point, problem)
            if isinstance(reply_or_kernel, Reply):
                skipped[name] = reply_or_kernel.message or "could not be built"
                continue
            why = self._prepare_checked(launches, name, reply_or_kernel, workload, problem, inputs)
            if why:
                skipped[name] = why
                continue
            configs[name], search[name] = point, float(ms)
        for name, point in self.space.named.items():  # a user's own configuration, timed like a baseline
            label = f"{self.space.name}: {name}"
            built = self._kernel(point, problem)
            why = ((built.message or "could not be built") if isinstance(built, Reply)
                   else self._prepare_checked(launches, label, built, workload, problem, inputs))
            if why:
                skipped[label] = why
        fns, failed = self._baseline_fns(problem)
        skipped.update(failed)
        for name, fn in fns.items():
            try:
                launch = _bound(fn, call_args(fn, inputs))
                self.oracle.warm(launch)  # and it launches
                launches[name] = launch
            except Exception as exc:  # a baseline the library does not support for this shape
                skipped[name] = f"{type(exc).__name__}: {exc}"[:500]
        names = list(launches)

        def warm(seconds: float) -> None:
            until = _time.perf_counter() + seconds
            while _time.perf_counter() < until:
                for n in names:
                    launches[n]()
                torch.cuda.synchronize()

        # warmed only as long as the GPU idled since the search's last samples here (none after a resume)
        opts = replace(opts, warmup_s=self.oracle.warmup_for(opts.warmup_s))
        result = confirm_rounds(names, lambda n, k: self.oracle.round(launches[n], k), opts, search, warm)
        doc = result.to_dict()
        doc.update(configs=configs, baselines=[n for n in names if n not in configs], skipped=skipped)
        return Reply(ReplyStatus.OK, confirmation=doc)

    def _prepare_checked(self, launches: dict[str, Any], name: str, kernel: Any, workload: Workload,
                         problem: Problem, inputs: tuple[Any, ...]) -> str:
        """Verify ``kernel`` on fresh data, then put its launch on ``inputs`` into ``launches[name]``, warmed up;
        returns why it was left out ("" when it was not)."""
        try:
            ok, _, why = _check(kernel, workload, problem, 4242)
            if ok:
                launch = _bound(kernel, call_args(kernel, inputs))
                self.oracle.warm(launch)  # and it launches
                launches[name] = launch
        except Exception as exc:  # it ran in the search; if it fails now, it is left out, not trusted
            ok, why = False, f"{type(exc).__name__}: {exc}"[:500]
        return "" if ok else why

    def _kernel(self, point: Point, problem: Problem) -> Any:
        """The built kernel of ``point`` (kept, or built now), or a failure reply when it cannot be built."""
        key = (problem.key, self.space.key(point))
        kernel = self.kernels.get(key)
        if kernel is not None:
            self.kernels.move_to_end(key)
            return kernel
        started = time.perf_counter()
        try:
            assert self.space.build is not None  # GpuEvaluator refuses a space without one
            kernel = self.space.build(point, problem)
        except Exception as exc:
            return self._failure(ReplyStatus.COMPILE_ERROR, exc, time.perf_counter() - started)
        self.kernels[key] = kernel
        if len(self.kernels) > KEEP_KERNELS:
            self.kernels.popitem(last=False)
        return kernel

    def _baseline_fns(self, problem: Problem) -> tuple[dict[str, Any], dict[str, str]]:
        """The workload's baselines and the space's own, and ``{label: why}`` when the space's could not be
        made (nvcc failed on another kernel, say): the run goes on without them."""
        fns = dict(_workload(problem).baselines(problem))
        if self.space.baselines is None:
            return fns, {}
        try:
            fns.update(self.space.baselines(problem))
        except Exception as exc:
            return fns, {f"{self.space.name}: baselines": f"{type(exc).__name__}: {exc}"[:500]}
        return fns, {}

    def baselines(self, problem: Problem) -> dict[str, dict[str, Any]]:
        """The workload's baselines, the space's own and its named configurations, each verified where it computes
        the problem itself (``verified`` is None for a baseline of another precision or layout) and timed."""
        workload = _workload(problem)
        fns: dict[str, Any] = {}
        out: dict[str, dict[str, Any]] = {}
        for name, point in self.space.named.items():
            built = self._kernel(point, problem)
            if isinstance(built, Reply):
                out[f"{self.space.name}: {name}"] = {"error": (built.message or "could not be built")[:500]}
            else:
                fns[f"{self.space.name}: {name}"] = built
        more, failed = self._baseline_fns(problem)
        fns.update(more)
        out.update({name: {"error": why} for name, why in failed.items()})
        for name, fn in fns.items():
            inputs = workload.make_inputs(problem, seed=777)
            try:
                args = call_args(fn, inputs)
                fn(*args)
                ok, err = (workload.verify(problem, inputs)[:2] if args[-1] is inputs[-1] else (None, None))
                t = self.oracle.time(_bound(fn, args))
            except Exception as exc:  # a baseline the library does not support for this shape
                out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            out[name] = {"time_ms": t.median_ms, "samples_ms": t.samples_ms, "ci95_ms": list(t.ci95_ms),
                         "verified": ok, "error_value": err}
        return out


def _bound(fn: Callable[..., Any], args: tuple[Any, ...]) -> Callable[[], Any]:
    """``fn(*args)`` as a callable of no arguments for the oracle, bound to these values (not to a loop's variables)."""
    return lambda: fn(*args)


def _first_blas_call() -> None:
    """Create cuBLAS's handle and workspace at start-up (about 0.4 s on an H100), not inside the first point's
    verification, whose time the point reports."""
    import torch

    x = torch.ones(64, 64, device="cuda")
    torch.matmul(x, x)
    torch.cuda.synchronize()


def _check(kernel: Any, workload: Workload, problem: Problem, seed: int) -> tuple[bool, float, str]:
    """Run ``kernel`` once on fresh inputs and verify its output: (passed, error, why not)."""
    import torch

    fresh = workload.make_inputs(problem, seed=seed)
    kernel(*call_args(kernel, fresh))
    torch.cuda.synchronize()
    return workload.verify(problem, fresh)


def _workload(problem: Problem) -> Workload:
    """The problem's workload: its inputs, reference and baselines (the kernel is called as ``kernel(*inputs)``)."""
    from evotune.core.problem import get_workload

    return get_workload(problem.kind)


def out_of_memory_or(status: ReplyStatus, exc: BaseException) -> ReplyStatus:
    """``OUT_OF_MEMORY`` when the device ran out of memory: ``exc`` or an exception it wraps (a compiler's error
    around it) is torch's ``OutOfMemoryError``; else ``status``."""
    oom = _out_of_memory_error()
    e: BaseException | None = exc
    for _ in range(4):  # as deep as a failure's message goes
        if e is None:
            break
        if isinstance(e, oom):
            return ReplyStatus.OUT_OF_MEMORY
        e = e.__cause__ or e.__context__
    return status


def _out_of_memory_error() -> type[BaseException]:
    """The exception torch raises when an allocation on the device fails."""
    import torch

    return torch.cuda.OutOfMemoryError


def _context_poisoned() -> bool:
    """True when the CUDA context is broken (sticky error): only a new process can use the GPU again."""
    try:
        import torch

        torch.cuda.synchronize()
        torch.empty(1, device="cuda").fill_(1.0).item()
        return False
    except Exception:
        return True


def device_info() -> dict[str, Any]:
    """What a recorded number depends on: device, clocks, driver and package versions."""
    import platform
    import subprocess

    import torch

    # plain strings only: the reply is unpickled in the tuner process, and torch's TorchVersion would import
    # torch there (seconds of every run's start-up, in a process that never uses it)
    info: dict[str, Any] = {"device": str(torch.cuda.get_device_name(0)), "torch": str(torch.__version__),
                            "cuda": str(torch.version.cuda), "python": platform.python_version()}
    for mod in ("triton", "cutlass", "cuda"):
        try:
            info[mod] = str(__import__(mod).__version__)
        except Exception:  # not installed, or no version attribute
            pass
    try:
        q = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu"
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()[0]
        info.update(dict(zip(q.split(","), (s.strip() for s in out.split(",")), strict=False)))
    except Exception:  # nvidia-smi missing or slow: the record says less, nothing fails
        pass
    return info

"""The CPU evaluator: build -> verify -> time on the CPU, in a worker process that may die.

The CPU twin of :mod:`evotune.measurement.gpu`, with the same isolation design,
for spaces whose ``build(point, problem)`` returns a numpy callable
``fn(*inputs) -> output`` (no GPU, no torch): the fault-injection space
(``tests/spaces/faults.py``), tests of the tuner's fault handling, and small
numpy kernels of any workload. The problem's workload
(:class:`evotune.core.problem.Workload`) makes the inputs and checks the output: a GEMM is
``fn(a, b) -> c`` checked against ``a @ b``.

* The worker is a spawned process that loads the space by name
  (``SearchSpace.source``); nothing of the user's is pickled.
* An exception while building is ``compile_error``; an exception while
  running is ``runtime_error`` (``MemoryError`` included: the worker's
  address space is capped with ``RLIMIT_AS``, so "allocate until memory runs
  out" fails inside the worker instead of hurting the machine); a result the
  workload's ``cpu_verify`` rejects (a GEMM: off ``a @ b`` by more than
  ``evotune.measurement.workloads.gemm.CPU_TOLERANCE``, relative Frobenius norm) is ``wrong_result``.
  The worker carries on after each of these.
* A worker that dies (abort, segfault, killed for memory) is a ``crash`` with
  its exit code or signal; one that does not answer within ``options.timeout_s``
  is killed and the point is a ``timeout``. Either way a fresh worker takes over.

Timing is a median of a few ``time.perf_counter`` runs: only a value to rank by.

Example::

    with CpuEvaluator(load_space("tests/spaces/faults.py"), OracleOptions(timeout_s=5)) as ev:
        ev.evaluate({"mode": "ok_fast", "size": 1}, problem).status   # Status.OK
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from evotune.core.problem import Problem
from evotune.core.result import EvalResult
from evotune.core.space import Point, SearchSpace
from evotune.measurement.base import Evaluator
from evotune.measurement.isolation import WorkerProcess, answer_requests
from evotune.measurement.messages import Evaluate, Reply, ReplyStatus, Request, UseSpace, unknown
from evotune.measurement.options import OracleOptions
from evotune.measurement.space_worker import SpaceWorker, use_space

MEMORY_LIMIT_MB = 2048  # address space the worker may add to what it holds once loaded


class CpuEvaluator(Evaluator):
    kind = "cpu"
    shared_worker: SpaceWorker

    def __init__(self, space: SearchSpace, options: OracleOptions | None = None,
                 repeats: int = 5, memory_limit_mb: int = MEMORY_LIMIT_MB, startup_timeout_s: float = 120.0,
                 worker: SpaceWorker | None = None):
        if not space.source or space.build is None:
            raise ValueError(f"space {space.name!r} cannot run on the CPU: it has no build function")
        options = options or OracleOptions()
        self.space = space
        self.timeout_s, self.startup_timeout_s = float(options.timeout_s), float(startup_timeout_s)
        self.repeats, self.memory_limit_mb = max(1, int(repeats)), int(memory_limit_mb)
        # another space's evaluator may lend its worker process: one process for a run's spaces
        self.shared_worker = worker or SpaceWorker(WorkerProcess(
            _worker_main, (self.space.source, self.memory_limit_mb), "CPU worker", self.timeout_s,
            self.startup_timeout_s))
        self._worker = self.shared_worker.view(self.space.source, owner=worker is None)
        self._seed = 0

    @property
    def restarts(self) -> int:
        """Workers replaced after a crash or a timeout."""
        return self._worker.restarts

    def close(self) -> None:
        self._worker.close()

    # -- the interface -------------------------------------------------------
    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        self._seed += 1
        return self._worker.call(Evaluate(point, problem.to_dict(), self._seed, self.repeats)).result()


# -- inside the worker process ----------------------------------------------
def _limit_resources(memory_limit_mb: int) -> None:
    """Cap the address space at what the worker holds now plus ``memory_limit_mb``; no core files."""
    import resource

    held = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    held = int(line.split()[1]) * 1024
    except OSError:  # not Linux: cap at the limit itself
        pass
    cap = held + memory_limit_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort or segfault on purpose leaves no core file
    except (ValueError, OSError):
        pass


def _worker_main(conn: Any, space_source: str, memory_limit_mb: int) -> None:
    answer_requests(conn, lambda: _Worker(space_source, memory_limit_mb))


class _Worker:
    def __init__(self, space_source: str, memory_limit_mb: int):
        from evotune.core.plugins import load_space

        self.space = load_space(space_source)
        import numpy  # noqa: F401 - loaded before the memory cap, so the cap is all for the candidates

        _limit_resources(memory_limit_mb)
        self.kernels: dict[tuple[str, str], Any] = {}

    def handle(self, request: Request) -> Reply:
        if isinstance(request, UseSpace):  # from now on, requests are for another space of the run
            return use_space(self, request.source)
        if not isinstance(request, Evaluate):
            return unknown(request)
        return _evaluate(self.space, self.kernels, request.point, Problem.from_dict(request.problem), request.seed,
                         request.repeats)


def _evaluate(space: SearchSpace, kernels: dict[tuple[str, str], Any], point: Point, problem: Problem, seed: int,
              repeats: int) -> Reply:
    key = (problem.key, space.key(point))
    compile_s = 0.0
    fn = kernels.get(key)
    if fn is None:
        started = time.perf_counter()
        try:
            assert space.build is not None  # CpuEvaluator refuses a space without one
            fn = space.build(point, problem)
        except Exception as exc:
            return _failure(ReplyStatus.COMPILE_ERROR, "compile", exc, time.perf_counter() - started)
        compile_s = time.perf_counter() - started
        kernels[key] = fn
    stage = "verify"
    try:
        workload = problem.workload
        if workload is None:
            raise ValueError(f"problem kind {problem.kind!r} is no workload: nothing to check its output against")
        inputs = workload.cpu_inputs(problem, seed)
        ok, err, why = workload.cpu_verify(problem, inputs, fn(*inputs))
        if not ok:
            return Reply(ReplyStatus.WRONG_RESULT, why, error=err, compile_s=compile_s)
        stage = "time"
        samples = []
        bench_started = time.perf_counter()
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*inputs)
            samples.append((time.perf_counter() - t0) * 1e3)
        bench_s = time.perf_counter() - bench_started
    except Exception as exc:  # MemoryError (the RLIMIT_AS cap) included
        return _failure(ReplyStatus.RUNTIME_ERROR, stage, exc, compile_s)
    median = sorted(samples)[len(samples) // 2]
    return Reply(ReplyStatus.OK, time_ms=median, samples_ms=samples, compile_s=compile_s, bench_s=bench_s,
                 error=err)


def _failure(status: ReplyStatus, stage: str, exc: BaseException, compile_s: float) -> Reply:
    text = f"{stage}: {type(exc).__name__}: {exc}".strip()
    return Reply(status, text[:2000], compile_s=compile_s,
                 extra={"traceback": traceback.format_exc(limit=4)[-2000:]})

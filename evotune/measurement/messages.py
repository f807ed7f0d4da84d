"""What the evaluators and their worker processes say to each other over the pipe.

Every request is a small frozen dataclass, every answer a :class:`Reply`; both are picklable (the worker
processes fork from a forkserver or are spawned, and only these cross the pipe). A worker answers each request
with one reply, whose :class:`ReplyStatus` says what became of it; the parent side
(:class:`evotune.measurement.isolation.WorkerProcess`) makes the ``crash`` and ``timeout`` replies of a worker
that died or did not answer.

Example::

    reply = worker.call(Evaluate(point, problem.to_dict(), seed=1))
    if reply.status is ReplyStatus.OK:
        reply.time_ms
    reply.result()   # the EvalResult it carries
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from evotune.core.result import EvalResult, Status
from evotune.core.space import Point
from evotune.measurement.options import ConfirmOptions


class ReplyStatus(StrEnum):
    """What became of a request. The values of an evaluation's outcomes are :class:`Status`'s own."""

    READY = "ready"  # the worker loaded what it needs and takes requests (its first message)
    START_FAILED = "start_failed"  # the worker could not load what it needs; it exits
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    RUNTIME_ERROR = "runtime_error"
    OUT_OF_MEMORY = "out_of_memory"  # the device ran out of memory (CUDA's OutOfMemoryError) while running
    CRASH = "crash"
    TIMEOUT = "timeout"

    @property
    def result_status(self) -> Status:
        """The status an evaluation with this reply is recorded with: running out of memory is a runtime error."""
        if self is ReplyStatus.OUT_OF_MEMORY:
            return Status.RUNTIME_ERROR
        if self in (ReplyStatus.READY, ReplyStatus.START_FAILED):
            raise ValueError(f"a {self.value!r} reply answers no evaluation")
        return Status(self.value)


# -- requests ---------------------------------------------------------------
@dataclass(frozen=True)
class Evaluate:
    """Build, verify and time one point; ``repeats``: the CPU worker's timed runs (the GPU worker's oracle decides
    its own)."""

    point: Point
    problem: dict[str, Any]  # Problem.to_dict()
    seed: int
    repeats: int = 1


@dataclass(frozen=True)
class TimeBaselines:
    """Time the workload's and the space's baselines and the space's named configurations on ``problem``."""

    problem: dict[str, Any]


@dataclass(frozen=True)
class DeviceInfo:
    """The device the worker measures on: its clocks, versions and copy bandwidth."""


@dataclass(frozen=True)
class Confirm:
    """The confirmation stage: re-time ``points`` (measured at ``search_ms`` in the search) beside the baselines."""

    points: list[Point]
    problem: dict[str, Any]
    search_ms: list[float]
    options: ConfirmOptions


@dataclass(frozen=True)
class UseSpace:
    """Serve the space loaded from ``source`` from now on (:mod:`evotune.measurement.space_worker`)."""

    source: str


@dataclass(frozen=True)
class CompileOnly:
    """Compile ``point`` for the sweep's GPU without launching it (``record --compile-only``); its reply's ``extra``
    holds the space's ``compile_only`` result (registers, stack frame, shared memory, stages)."""

    point: Point


@dataclass(frozen=True)
class Stop:
    """End the worker's loop; no reply."""


Request = Evaluate | TimeBaselines | DeviceInfo | Confirm | UseSpace | CompileOnly | Stop


# -- the reply --------------------------------------------------------------
@dataclass
class Reply:
    """A worker's answer. An evaluation's fields (``time_ms`` ... ``error``) are set by ``Evaluate``'s replies;
    ``baselines``, ``info`` and ``confirmation`` by the request of that name. ``fatal``: the worker found its own
    state unusable (a CUDA context a candidate broke) and exits after sending this; the next request starts
    another."""

    status: ReplyStatus
    message: str = ""
    time_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    bench_s: float = 0.0
    error: float | None = None  # the verification error (relative norm), when measured
    extra: dict[str, Any] = field(default_factory=dict)
    fatal: bool = False
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    confirmation: dict[str, Any] | None = None
    served_s: float = 0.0  # the worker's own seconds on the request, from reading it to answering (serve)

    @property
    def ok(self) -> bool:
        return self.status is ReplyStatus.OK

    def result(self) -> EvalResult:
        """The evaluation this reply carries."""
        return EvalResult(self.status.result_status, time_ms=self.time_ms, samples_ms=list(self.samples_ms),
                          compile_s=self.compile_s, bench_s=self.bench_s, error=self.error, message=self.message,
                          extra=self.extra)


def unknown(request: object) -> Reply:
    """The reply to a request the worker does not serve."""
    return Reply(ReplyStatus.RUNTIME_ERROR, message=f"unknown request {type(request).__name__}")

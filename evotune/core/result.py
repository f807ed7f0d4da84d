"""The record every evaluation returns, whatever happened to the candidate."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    INFEASIBLE = "infeasible"  # pruned, or absent from a recorded landscape: costs nothing
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    RUNTIME_ERROR = "runtime_error"
    CRASH = "crash"
    TIMEOUT = "timeout"

    @property
    def failed(self) -> bool:
        return self is not Status.OK


@dataclass
class EvalResult:
    """Outcome of build -> verify -> time for one point.

    ``time_ms`` is the summary (median of the trimmed samples) and is None
    unless ``status`` is OK. ``compile_s`` and ``bench_s`` are what the
    evaluation cost, which the tuning clock is charged with.
    """

    status: Status
    time_ms: float | None = None
    samples_ms: list[float] = field(default_factory=list)
    compile_s: float = 0.0
    bench_s: float = 0.0
    error: float | None = None  # verification error (relative norm), when measured
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        if self.status is Status.OK and self.time_ms is None:
            raise ValueError("an OK result needs time_ms")

    @property
    def cost_s(self) -> float:
        return self.compile_s + self.bench_s

    @property
    def value(self) -> float | None:
        """The objective (lower is better), or None for a failed point."""
        return self.time_ms if self.status is Status.OK else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

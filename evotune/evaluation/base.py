"""The evaluator interface: build -> verify -> time, one point at a time."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from evotune.evaluation.result import EvalResult
from evotune.problem import Problem
from evotune.space import Point


class Evaluator(ABC):
    """Turns a point into an :class:`EvalResult`. Never raises for a bad candidate:
    a candidate that fails to compile, crashes, hangs or computes the wrong
    answer comes back as a failed result with its reason."""

    kind: str = "base"
    #: how many upcoming points the tuner should hand to :meth:`prefetch` at once
    prefetch_depth: int = 1
    #: whether :meth:`confirm` re-times anything (measuring oracles with baselines)
    confirms: bool = False

    @abstractmethod
    def evaluate(self, point: Point, problem: Problem) -> EvalResult: ...

    def prefetch(self, points: list[Point], problem: Problem) -> None:  # noqa: B027 - optional hook
        """Start preparing (compiling) points that will be evaluated next; a no-op by default."""

    def confirm(self, points: list[Point], problem: Problem, search_ms: list[float]) -> dict[str, Any] | None:
        """Re-time the best ``points`` of a search beside the baselines (the confirmation stage); its record,
        or None for oracles whose answers do not vary between runs (replay) or that have no baselines."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release workers and devices; a no-op for oracles that hold none."""

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

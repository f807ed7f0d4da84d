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
    #: how many points the evaluator prepares side by side (its compile processes); :meth:`to_ask` says how many
    #: the tuner hands to :meth:`prefetch` ahead of the GPU
    prefetch_depth: int = 1
    #: whether :meth:`confirm` re-times anything (measuring oracles with baselines)
    confirms: bool = False

    @abstractmethod
    def evaluate(self, point: Point, problem: Problem) -> EvalResult: ...

    def to_ask(self, waiting: int) -> int:
        """How many proposals to ask for now, when ``waiting`` points handed to :meth:`prefetch` are not
        evaluated yet.

        Without a pool, one at a time. With a pool of ``prefetch_depth`` compile processes, at least that
        many points stay handed out, so no compile process sits idle while the GPU measures, and they are
        topped up half a pool at a time, so the strategy proposes a few points at once and hears every
        result before it proposes again. Example: with 14 processes, 21 are asked first, then 7 whenever
        14 are left.
        """
        depth = self.prefetch_depth
        if depth <= 1:
            return 0 if waiting else 1
        return 0 if waiting > depth else depth + max(1, depth // 2) - waiting

    def prefetch(self, points: list[Point], problem: Problem) -> None:  # noqa: B027 - optional hook
        """Start preparing (compiling) points that will be evaluated next; a no-op by default."""

    def ready(self, point: Point, problem: Problem) -> bool:
        """Whether ``point`` can be evaluated now, not after its compile in the pool (always, without one)."""
        return True

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

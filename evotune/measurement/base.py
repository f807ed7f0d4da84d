"""The evaluator interface: build -> verify -> time, one point at a time."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from evotune.core.problem import Problem
from evotune.core.result import EvalResult
from evotune.core.space import Point

if TYPE_CHECKING:
    from evotune.measurement.space_worker import SpaceWorker


#: epoch seconds at which this process began its first evaluation (empty before): where a tune-model worker's
#: start-up ends, whichever study or evaluator that evaluation was for
_FIRST_EVALUATION: list[float] = []


def first_evaluation() -> float | None:
    """When this process began its first real (not replayed) evaluation, in epoch seconds; None before."""
    return _FIRST_EVALUATION[0] if _FIRST_EVALUATION else None


def began_evaluating(at: float | None = None) -> None:
    """Note that this process begins an evaluation now (or at epoch seconds ``at``): the first one noted is
    :func:`first_evaluation`. The tuning loop (``running/tuner.py``) notes each it makes; a key tuner that measures
    with a loop of its own notes its own."""
    if not _FIRST_EVALUATION:
        _FIRST_EVALUATION.append(time.time() if at is None else at)


class DeadlinePassed(Exception):
    """The run's time ran out while an evaluation waited (for its compile, or in the measuring worker): the point
    is not evaluated, and there is nothing to record of it."""


class Evaluator(ABC):
    """Turns a point into an :class:`EvalResult`. Never raises for a bad candidate:
    a candidate that fails to compile, crashes, hangs or computes the wrong
    answer comes back as a failed result with its reason."""

    kind: str = "base"
    #: how many points the evaluator prepares side by side (its compile processes); :meth:`to_ask` says how many
    #: the tuner hands to :meth:`prefetch` ahead of the GPU
    prefetch_depth: int = 1
    #: whether it builds on speculation (:meth:`speculate`): the tuner then asks an adaptive strategy for one proposal
    #: at a time, each made knowing every result before it, and hands it the points the strategy ranks next to build
    #: while the GPU measures (with a few results per key, proposals made in batches ahead of a pool follow the
    #: first guesses, e.g. another key's winners, too long)
    speculates: bool = False
    #: whether :meth:`confirm` re-times anything (measuring oracles with baselines)
    confirms: bool = False
    #: the seconds left to the run being tuned, when it has a time budget (:meth:`bound`); None: no deadline
    time_left: Callable[[], float] | None = None
    #: the measuring process, which the evaluators of a run's other spaces may share; None: the oracle has none
    shared_worker: SpaceWorker | None = None
    #: the compiled-kernel cache's counts (hit / miss / memory -> count); empty where nothing is compiled
    cache_stats: Mapping[str, int] = MappingProxyType({})

    @abstractmethod
    def evaluate(self, point: Point, problem: Problem) -> EvalResult: ...

    @property
    def speculation_depth(self) -> int:
        """How many of the points the search ranks next :meth:`speculate` is handed with each proposal (an evaluator
        that builds on speculation): :attr:`prefetch_depth` unless it says otherwise."""
        return self.prefetch_depth

    def to_ask(self, waiting: int, wide: bool = False) -> int:
        """How many proposals to ask for now, when ``waiting`` points handed to :meth:`prefetch` are not
        evaluated yet.

        Without a pool, one at a time. With a pool of ``prefetch_depth`` compile processes, at least that
        many points stay handed out, so no compile process sits idle while the GPU measures, and they are
        topped up half a pool at a time, so the strategy proposes a few points at once and hears every
        result before it proposes again. Example: with 14 processes, 21 are asked first, then 7 whenever
        14 are left. ``wide`` (a strategy that does not adapt: it loses nothing by proposing early): twice
        that, so that a pool whose processes find some kernels being compiled elsewhere, and move on at
        once, still has a point for each of them.
        """
        if self.prefetch_depth <= 1:
            return 0 if waiting else 1
        depth = self.prefetch_depth * (2 if wide else 1)
        return 0 if waiting > depth else depth + max(1, depth // 2) - waiting

    def prefetch(self, points: list[Point], problem: Problem) -> None:  # noqa: B027 - optional hook
        """Start preparing (compiling) points that will be evaluated next; a no-op by default."""

    def speculate(self, points: list[Point], problem: Problem) -> None:  # noqa: B027 - optional hook
        """Build ``points`` (the next to measure first, then those the search ranks next, most likely first);
        builds asked for before and not started, of points not among them, are dropped. A no-op by default."""

    def ready(self, point: Point, problem: Problem) -> bool:
        """Whether ``point`` can be evaluated now, not after its compile in the pool (always, without one)."""
        return True

    def bound(self, time_left: Callable[[], float] | None) -> None:
        """Evaluate within the run's time: an evaluator that waits (for a compile, for its worker) stops waiting
        when ``time_left()`` reaches 0 and raises :class:`DeadlinePassed`; None lifts the bound."""
        self.time_left = time_left

    def abandon(self) -> None:  # noqa: B027 - optional hook
        """The run's time is spent: drop the work started ahead for it (compiles in a pool); a no-op by default."""

    def confirm(self, points: list[Point], problem: Problem, search_ms: list[float],
                seconds: float | None = None) -> dict[str, Any] | None:
        """Re-time the best ``points`` of a search beside the baselines (the confirmation stage), its rounds within
        ``seconds`` when given; its record, or None for oracles whose answers do not vary between runs (replay)
        or that have no baselines."""
        return None

    def baselines(self, problem: Problem) -> dict[str, dict[str, Any]]:
        """The library kernels (cuBLAS...) timed on ``problem`` by this oracle: label -> its timing, or
        ``{"error": why}``; {} for oracles that time none."""
        return {}

    def device_info(self) -> dict[str, Any]:
        """The device the measuring process runs on (its clocks, versions, copy bandwidth); {} for oracles that
        measure on none."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release workers and devices; a no-op for oracles that hold none."""

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

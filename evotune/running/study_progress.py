"""What the tuning loop (:mod:`evotune.running.tuner`) knows of a study and what it reports of a run on it.

:class:`StudyState`: the study's finished trials, whoever measured them (its count, best and tuning clock, as the
budget reads them); :func:`finished`: whether a study is done for every worker, read from its stored trials (a run
skips it); :class:`TuneResult`: what one run of the loop on a study did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from evotune.core.budget import Budget, stop_text
from evotune.core.space import Point
from evotune.storage.study import Record


@dataclass
class TuneResult:
    study_name: str
    trials: int  # finished trials in the study, resumed ones included
    new_trials: int  # measured by this call
    best_point: Point | None
    best_ms: float | None
    clock_s: float
    stopped: str  # trials | seconds | plateau | exhausted
    failures: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # proposals the oracle could not answer (absent from a landscape): cost nothing
    loop_s: float = 0.0  # wall seconds of the loop after resuming: asking, claiming, evaluating, storing
    store_s: float = 0.0  # of which waiting for the storage: claiming, and waiting for the trial writer
    write_s: float = 0.0  # the trial writer's time storing trials and marking their claims done, behind the loop
    busy_s: float = 0.0  # the measuring process's time on this study's points (evaluate's own where it says)
    first_eval: float | None = None  # epoch seconds: when the first evaluation began
    last_eval: float | None = None  # and when the last one ended
    #: the evaluator's calls: busy_s of them in the measuring process, the rest waiting for the points' compiles
    evaluate_s: float = 0.0
    startup_s: float = 0.0  # wall seconds of the run's first evaluation before it timed anything: off the clock
    budget_trials: int | None = None  # the trials budget the study ran to

    @property
    def stop_text(self) -> str:
        """'stopped on seconds', and after how many of its trials budget where that was under a fifth of it."""
        return stop_text(self.stopped, self.trials, self.budget_trials)


@dataclass
class StudyState:
    """What the loop knows of the study: its finished trials, whoever measured them."""

    numbers: set[int] = field(default_factory=set)
    done: set[str] = field(default_factory=set)
    trials: int = 0
    clock: float = 0.0
    best_ms: float | None = None
    best_point: Point | None = None
    since_best: int = 0
    new: int = 0
    skipped: int = 0
    store_s: float = 0.0
    busy_s: float = 0.0
    evaluate_s: float = 0.0
    first_eval: float | None = None
    last_eval: float | None = None
    synced: float = field(default_factory=time.monotonic)
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, number: int | None, key: str, point: Point, value: float | None, clock: float) -> None:
        if number is not None:  # None: this run's own, not stored yet
            self.numbers.add(number)
        self.done.add(key)
        self.trials += 1
        self.clock = max(self.clock, clock)
        self.since_best += 1
        if value is not None and (self.best_ms is None or value < self.best_ms):
            self.best_ms, self.best_point, self.since_best = value, point, 0


def finished(history: list[Record], budget: Budget, feasible: int) -> bool:
    """Whether a study holding ``history`` is done for every worker: its budget is spent (trials, tuning clock
    or plateau, counted as :func:`tune_study` counts them on resume) or every feasible point is stored."""
    state = StudyState()
    for r in history:
        state.add(r.number, r.key, r.point, r.value, r.clock_s)
    return state.trials >= feasible or budget.stop_reason(state.trials, state.clock, state.since_best) is not None

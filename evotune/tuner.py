"""The tuning loop for one study: ask -> check -> evaluate -> record -> tell.

Data moves one way: the strategy proposes, the evaluator measures, the study
records, and only then does the strategy hear the result. Resuming is the
same loop started on a study that already holds trials: they are told to the
strategy first, counted against the budget, and never measured again.

Example::

    result = tune(space, ctx, ReplayEvaluator(ls), make_strategy("ga", space, fs), store, Budget(trials=200))
    result.best_ms, result.stopped
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from evotune.claims import Claims, NoClaims
from evotune.evaluation.base import Evaluator
from evotune.evaluation.result import Status
from evotune.experiment import Budget
from evotune.space import Context, Point, SearchSpace
from evotune.strategies.base import Strategy
from evotune.study import StudyStore

OnTrial = Callable[[int, float | None], None]  # (trials so far, best so far)
NEAR_BUDGET = 8  # within this many trials of the budget, re-read the study before each point


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


def tune(space: SearchSpace, ctx: Context, evaluator: Evaluator, strategy: Strategy, store: StudyStore,
         budget: Budget, on_trial: OnTrial | None = None, claims: Claims | None = None,
         sync_s: float = 2.0) -> TuneResult:
    """Run one study to its budget. Every finished evaluation is in ``store`` before the strategy hears of it.

    With ``claims``, several workers (processes or hosts) can run this loop on the
    same study: each claims a point before measuring it, reads the others' trials
    back every ``sync_s`` seconds and tells them to its strategy (so a GA's
    generations mix every worker's children), and counts their points in flight
    against the budget.
    """
    assert ctx.problem is not None, "tune() needs a problem in its context"
    claims = claims or NoClaims(store.study.study_name, 0.0)
    state = _State()
    history = store.history()
    strategy.warm_start([(r.point, r.value) for r in history])
    for r in history:
        state.add(r.number, r.key, r.point, r.value, r.clock_s)
    simulated = evaluator.kind == "replay"
    if on_trial:
        on_trial(state.trials, state.best_ms)

    def sync() -> None:
        fresh = [r for r in store.history() if r.number not in state.numbers]
        strategy.tell([(r.point, r.value) for r in fresh])
        for r in fresh:
            state.add(r.number, r.key, r.point, r.value, r.clock_s)
        state.synced = time.monotonic()

    def counted() -> int:
        """Finished trials plus the points other live workers hold (their finished ones included)."""
        state.in_flight = len(claims.active() - state.done)
        return state.trials + state.in_flight

    # Evaluators that compile ahead (a pool) get a batch of proposals to start on; the rest get one.
    depth = evaluator.prefetch_depth
    queue: list[Point] = []
    while True:
        if claims.shared and time.monotonic() - state.synced > sync_s:
            sync()
        count = counted()
        if claims.shared and budget.trials is not None and count >= budget.trials - NEAR_BUDGET:
            sync()  # close to the end, look at the study itself before every point: others may have finished
            count = counted()
        stopped = _stop_reason(budget, count, state.clock, state.since_best)
        if stopped:
            break
        if not queue:
            queue = strategy.ask(depth)
            if not queue:
                stopped = "exhausted"
                break
            if depth > 1:
                evaluator.prefetch(queue, ctx.problem)
        point = queue.pop(0)
        key = space.key(point)
        if key in state.done or space.check(point, ctx) is not None:
            # strategies never hand these out; if one ever did, it must cost nothing and teach nothing wrong
            strategy.tell([(point, None)])
            continue
        claimed = claims.claim(key)
        if claimed == "takeover":
            sync()  # its last owner is gone: it may have finished the point after our last look
        if not claimed or key in state.done:
            continue  # another worker has it; its result reaches the strategy at the next sync
        began, started = _dt.datetime.now(), time.perf_counter()
        result = evaluator.evaluate(point, ctx.problem)
        elapsed = time.perf_counter() - started
        if result.status is Status.INFEASIBLE:
            state.skipped += 1
            strategy.tell([(point, None)])
            continue
        clock = state.clock + (result.cost_s if simulated else elapsed)
        number = store.record(point, result, clock, started=began, wall_s=elapsed)
        strategy.tell([(point, result.value)])
        state.add(number, key, point, result.value, clock)
        state.new += 1
        if result.status.failed:
            state.failures[result.status.value] = state.failures.get(result.status.value, 0) + 1
        if on_trial:
            on_trial(state.trials, state.best_ms)
    return TuneResult(store.study.study_name, state.trials, state.new, state.best_point, state.best_ms, state.clock,
                      stopped, state.failures, state.skipped)


@dataclass
class _State:
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
    in_flight: int = 0  # points other workers hold claims on and have not finished
    synced: float = field(default_factory=time.monotonic)
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, number: int, key: str, point: Point, value: float | None, clock: float) -> None:
        self.numbers.add(number)
        self.done.add(key)
        self.trials += 1
        self.clock = max(self.clock, clock)
        self.since_best += 1
        if value is not None and (self.best_ms is None or value < self.best_ms):
            self.best_ms, self.best_point, self.since_best = value, point, 0


def _stop_reason(budget: Budget, trials: int, clock: float, since_best: int) -> str | None:
    if budget.trials is not None and trials >= budget.trials:
        return "trials"
    if budget.seconds is not None and clock >= budget.seconds:
        return "seconds"
    if budget.plateau is not None and trials > 0 and since_best >= budget.plateau:
        return "plateau"
    return None

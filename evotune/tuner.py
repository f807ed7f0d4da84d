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

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from evotune.evaluation.base import Evaluator
from evotune.evaluation.result import Status
from evotune.experiment import Budget
from evotune.space import Context, Point, SearchSpace
from evotune.strategies.base import Strategy
from evotune.study import StudyStore

OnTrial = Callable[[int, float | None], None]  # (trials so far, best so far)


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
         budget: Budget, on_trial: OnTrial | None = None) -> TuneResult:
    """Run one study to its budget. Every finished evaluation is in ``store`` before the strategy hears of it."""
    assert ctx.problem is not None, "tune() needs a problem in its context"
    history = store.history()
    done = {r.key for r in history}
    strategy.warm_start([(r.point, r.value) for r in history])
    clock = max((r.clock_s for r in history), default=0.0)
    trials = len(history)
    best_ms, best_point, since_best = None, None, 0
    for r in history:
        since_best += 1
        if r.value is not None and (best_ms is None or r.value < best_ms):
            best_ms, best_point, since_best = r.value, r.point, 0
    failures: dict[str, int] = {}
    new, skipped = 0, 0
    simulated = evaluator.kind == "replay"
    if on_trial:
        on_trial(trials, best_ms)

    # Evaluators that compile ahead (a pool) get a batch of proposals to start on; the rest get one.
    depth = evaluator.prefetch_depth
    queue: list[Point] = []
    while True:
        stopped = _stop_reason(budget, trials, clock, since_best)
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
        reason = space.check(point, ctx)
        if key in done or reason is not None:
            # strategies never hand these out; if one ever did, it must cost nothing and teach nothing wrong
            strategy.tell([(point, None)])
            continue
        started = time.perf_counter()
        result = evaluator.evaluate(point, ctx.problem)
        elapsed = time.perf_counter() - started
        if result.status is Status.INFEASIBLE:
            skipped += 1
            strategy.tell([(point, None)])
            continue
        clock += result.cost_s if simulated else elapsed
        store.record(point, result, clock)
        done.add(key)
        strategy.tell([(point, result.value)])
        trials += 1
        new += 1
        since_best += 1
        if result.status.failed:
            failures[result.status.value] = failures.get(result.status.value, 0) + 1
        elif best_ms is None or result.time_ms < best_ms:
            best_ms, best_point, since_best = result.time_ms, point, 0
        if on_trial:
            on_trial(trials, best_ms)
    return TuneResult(store.study.study_name, trials, new, best_point, best_ms, clock, stopped, failures, skipped)


def _stop_reason(budget: Budget, trials: int, clock: float, since_best: int) -> str | None:
    if budget.trials is not None and trials >= budget.trials:
        return "trials"
    if budget.seconds is not None and clock >= budget.seconds:
        return "seconds"
    if budget.plateau is not None and trials > 0 and since_best >= budget.plateau:
        return "plateau"
    return None

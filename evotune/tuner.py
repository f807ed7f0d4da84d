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
from evotune.evaluation.result import EvalResult, Status
from evotune.experiment import Budget
from evotune.space import Context, Point, SearchSpace
from evotune.strategies.base import Strategy
from evotune.study import Record, StudyStore

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
    loop_s: float = 0.0  # wall seconds of the loop after resuming: asking, claiming, evaluating, storing
    store_s: float = 0.0  # of which writing the claims and the trials (on sqlite: under the database's one lock)


def tune(space: SearchSpace, ctx: Context, evaluator: Evaluator, strategy: Strategy, store: StudyStore,
         budget: Budget, on_trial: OnTrial | None = None, claims: Claims | None = None,
         sync_s: float = 2.0) -> TuneResult:
    """Run one study to its budget. Every finished evaluation is in ``store`` before the strategy hears of it.

    With ``claims``, several workers (processes or hosts) can run this loop on the
    same study: each claims a point before measuring it, reads the others' trials
    back every ``sync_s`` seconds and tells them to its strategy (so a GA's
    generations mix every worker's children), and the claims keep the trials
    budget for all of them together (see :mod:`evotune.claims`).
    """
    assert ctx.problem is not None, "tune() needs a problem in its context"
    claims = claims or NoClaims(store.study.study_name, 0.0)
    return _Run(space, ctx, evaluator, strategy, store, budget, on_trial, claims, sync_s).run()


class _Run:
    """One call of :func:`tune`. ``run`` reads in the order things happen: resume, then for each point
    sync, check the budget, take the next point, claim it, measure it, record it."""

    def __init__(self, space: SearchSpace, ctx: Context, evaluator: Evaluator, strategy: Strategy,
                 store: StudyStore, budget: Budget, on_trial: OnTrial | None, claims: Claims, sync_s: float):
        self.space, self.ctx, self.evaluator, self.strategy = space, ctx, evaluator, strategy
        self.store, self.budget, self.on_trial, self.claims, self.sync_s = store, budget, on_trial, claims, sync_s
        self.state = _State()
        self.simulated = evaluator.kind == "replay"  # the clock adds recorded costs instead of wall time
        self.queue: list[Point] = []  # proposals asked for and not yet taken

    def run(self) -> TuneResult:
        self.resume()
        began = time.perf_counter()
        while True:
            stopped = self.stop_reason()
            if stopped:
                break
            point = self.next_point()
            if point is None:
                stopped = "exhausted"
                break
            claimed = self.claim(point)
            if claimed == "full":
                self.sync()  # the study's own count, for the result
                stopped = "trials"
                break
            if not claimed:
                continue  # another worker has it; its result reaches the strategy at the next sync
            measured = self.measure(point)
            self.record(point, *measured)
        s = self.state
        return TuneResult(self.store.study.study_name, s.trials, s.new, s.best_point, s.best_ms, s.clock,
                          stopped, s.failures, s.skipped, time.perf_counter() - began, s.store_s)

    def resume(self) -> None:
        """Take in what the study holds: told to the strategy, counted, never measured again."""
        history = self.store.history()
        self.strategy.warm_start([(r.point, r.value) for r in history])
        for r in history:
            self.state.add(r.number, r.key, r.point, r.value, r.clock_s)
        self.claims.begin(self.state.done, self.sync)
        self.report()

    def sync(self) -> set[str]:
        """Tell the strategy the trials other workers stored since the last look; the keys of all stored trials."""
        fresh = [r for r in self.store.history() if r.number not in self.state.numbers]
        self.strategy.tell([(r.point, r.value) for r in fresh])
        for r in fresh:
            self.state.add(r.number, r.key, r.point, r.value, r.clock_s)
        self.state.synced = time.monotonic()
        return self.state.done

    def stop_reason(self) -> str | None:
        """Why to stop before the next point, as far as this worker knows (the claim has the last word on trials)."""
        if self.claims.shared and time.monotonic() - self.state.synced > self.sync_s:
            self.sync()
        s = self.state
        return _stop_reason(self.budget, s.trials, s.clock, s.since_best)

    def next_point(self) -> Point | None:
        """The strategy's next proposal that is feasible and not stored yet; None when it has nothing left.

        Evaluators that compile ahead (a pool) get proposals to start on before they are asked for them
        (:meth:`Evaluator.to_ask` says how many), so the pool compiles the next points while the GPU
        measures the ones it built; the rest get one proposal at a time. The first handed-out point that
        is ready (built) goes next: one whose compile takes a minute does not hold up the points behind it,
        such as new launch arguments of a kernel built already.
        """
        while True:
            wanted = self.evaluator.to_ask(len(self.queue))
            if wanted:
                more = self.strategy.ask(wanted)
                if more and self.evaluator.prefetch_depth > 1:
                    self.evaluator.prefetch(more, self.ctx.problem)
                self.queue += more
            if not self.queue:
                return None
            ready = (i for i, p in enumerate(self.queue) if self.evaluator.ready(p, self.ctx.problem))
            point = self.queue.pop(next(ready, 0))
            if self.space.key(point) in self.state.done or self.space.check(point, self.ctx) is not None:
                # strategies never hand these out; if one ever did, it must cost nothing and teach nothing wrong
                self.strategy.tell([(point, None)])
                continue
            return point

    def claim(self, point: Point) -> str:
        """Claim ``point`` within the budget: "new" or "takeover" to measure it, "" to leave it, "full" to stop."""
        key, started = self.space.key(point), time.perf_counter()
        claimed = self.claims.claim(key, self.budget.trials, self.state.done, self.sync)
        self.state.store_s += time.perf_counter() - started
        if claimed == "takeover":
            self.sync()  # its last owner is gone: it may have stored the point after our last look
        if claimed in ("new", "takeover") and key in self.state.done:
            self.claims.finish(key)  # stored after all: it counts, and nobody measures it again
            return ""
        return claimed

    def measure(self, point: Point) -> tuple[EvalResult, _dt.datetime, float]:
        """The evaluator's result, when it began and the wall seconds it took; an interrupted evaluation gives
        its claim back."""
        began, started = _dt.datetime.now(), time.perf_counter()
        try:
            result = self.evaluator.evaluate(point, self.ctx.problem)
        except BaseException:
            self.claims.release(self.space.key(point))
            raise
        return result, began, time.perf_counter() - started

    def record(self, point: Point, result: EvalResult, began: _dt.datetime, elapsed: float) -> None:
        """Store the trial, mark its claim done, then tell the strategy: the study hears first."""
        key, s = self.space.key(point), self.state
        if result.status is Status.INFEASIBLE:
            s.skipped += 1
            self.claims.finish(key, counted=False)
            self.strategy.tell([(point, None)])
            return
        clock = s.clock + (result.cost_s if self.simulated else elapsed)
        writing = time.perf_counter()
        number = self.store.record(point, result, clock, started=began, wall_s=elapsed)
        self.claims.finish(key)
        s.store_s += time.perf_counter() - writing
        self.strategy.tell([(point, result.value)])
        s.add(number, key, point, result.value, clock)
        s.new += 1
        if result.status.failed:
            s.failures[result.status.value] = s.failures.get(result.status.value, 0) + 1
        self.report()

    def report(self) -> None:
        if self.on_trial:
            self.on_trial(self.state.trials, self.state.best_ms)


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
    store_s: float = 0.0
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


def finished(history: list[Record], budget: Budget, feasible: int) -> bool:
    """Whether a study holding ``history`` is done for every worker: its budget is spent (trials, tuning clock
    or plateau, counted as :func:`tune` counts them on resume) or every feasible point is stored."""
    state = _State()
    for r in history:
        state.add(r.number, r.key, r.point, r.value, r.clock_s)
    return state.trials >= feasible or _stop_reason(budget, state.trials, state.clock, state.since_best) is not None


def _stop_reason(budget: Budget, trials: int, clock: float, since_best: int) -> str | None:
    if budget.trials is not None and trials >= budget.trials:
        return "trials"
    if budget.seconds is not None and clock >= budget.seconds:
        return "seconds"
    if budget.plateau is not None and trials > 0 and since_best >= budget.plateau:
        return "plateau"
    return None

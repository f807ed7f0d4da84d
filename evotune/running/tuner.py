"""The tuning loop for one study: ask -> check -> evaluate -> record -> tell.

Data moves one way: the strategy proposes, the evaluator measures, the study
records, and the strategy hears the result. The trial is written from a
thread behind the loop (:class:`evotune.storage.trial_writer.TrialWriter`), so the
next point is proposed and measured meanwhile; its claim stays held until it
is stored, so no other worker measures it and the budget counts it. Resuming
is the same loop started on a study that already holds trials: they are told
to the strategy first, counted against the budget, and never measured again.

The tuning clock: in replay, the recorded cost (compile and benchmark time)
of the points evaluated; on a measuring oracle (gpu, cpu), the run's wall time
added to what the study held (asking the strategy, compiling, measuring and
storing all count), from the moment its first evaluation has built its kernel
on. What that first evaluation waited for before it timed anything (the
measuring process's start-up and imports, the first compiles) is start-up: a
run pays it once, whatever its budget, so it is kept off the clock (the
trial's ``startup_s``) and out of the typical evaluation. There,
``budget.seconds`` is a deadline: no point is handed out once the time left is
less than the typical evaluation of the run so far (the median of its last
:data:`FIT_WINDOW`), an evaluation still waiting at the deadline (for its
compile) is dropped (:class:`DeadlinePassed`, nothing stored), and the
compiles started ahead are abandoned (:meth:`Evaluator.abandon`).

This is evotune's one claim-measure-store loop: ``run`` and ``record`` hand it the GPU worker pool as its
evaluator, ``evotune.autotune`` (and so ``tune-kernel``) an evaluator that launches the kernel in its own
process, each with its budget; what a trial holds besides its result is the caller's :class:`PerTrial`.

Example::

    result = tune_study(space, ctx, ReplayEvaluator(ls), make_strategy("ga", space, fs), store, Budget(trials=200))
    result.best_ms, result.stopped
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from evotune.core.budget import Budget
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, Point, SearchSpace
from evotune.measurement.base import DeadlinePassed, Evaluator, began_evaluating
from evotune.running.experiment import OracleKind
from evotune.running.study_progress import StudyState, TuneResult
from evotune.search.strategies.base import Strategy
from evotune.storage.claims import Claim, Claims, NoClaims
from evotune.storage.study import StudyStore
from evotune.storage.trial_writer import TrialWriter

OnTrial = Callable[[int, float | None], None]  # (trials so far, best so far)
FIT_WINDOW = 8  # the latest evaluations whose median wall time predicts the next one's (the deadline's fit rule)
wall_clock = time.monotonic  # the measuring oracles' tuning clock, unless tune_study() is given one


class Infeasible(Enum):
    """What an evaluator's INFEASIBLE result stands for, and so what the loop does with it."""

    #: the oracle has no answer for the point (absent from a recorded landscape): nothing is stored or counted, and
    #: it costs nothing
    UNANSWERED = "unanswered"
    #: the device refused the point when it was launched: a failed trial like any other, stored and counted
    REFUSED = "refused"


def _no_attrs(point: Point) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class PerTrial:
    """What the loop stores of each evaluation besides its result (the result's fields and its ``extra``)."""

    #: the point's attributes the caller knows of (a launch's program count, the timer that measured it)
    attrs: Callable[[Point], Mapping[str, Any]] = _no_attrs
    infeasible: Infeasible = Infeasible.UNANSWERED


def tune_study(space: SearchSpace, ctx: Context, evaluator: Evaluator, strategy: Strategy, store: StudyStore,
               budget: Budget, on_trial: OnTrial | None = None, claims: Claims | None = None,
               sync_s: float = 2.0, clock: Callable[[], float] | None = None,
               per_trial: PerTrial | None = None) -> TuneResult:
    """Run one study to its budget. Every finished evaluation is in ``store`` when this returns; its claim is
    held until it is stored.

    With ``claims``, several workers (processes or hosts) can run this loop on the
    same study: each claims a point before measuring it, reads the others' trials
    back every ``sync_s`` seconds and tells them to its strategy (so a GA's
    generations mix every worker's children), and the claims keep the trials
    budget for all of them together (see :mod:`evotune.storage.claims`).

    ``clock`` (seconds, monotonic; default :data:`wall_clock`) is what a measuring oracle's tuning clock reads.
    ``per_trial``: what each trial holds besides the evaluator's result, and what an INFEASIBLE one stands for
    (default: nothing more; a point the oracle could not answer).
    """
    assert ctx.problem is not None, "tune_study() needs a problem in its context"
    claims = claims or NoClaims(store.study.study_name, 0.0)
    return _Run(space, ctx, evaluator, strategy, store, budget, on_trial, claims, sync_s, clock or wall_clock,
                per_trial or PerTrial()).run()


class _Run:
    """One call of :func:`tune_study`. ``run`` reads in the order things happen: resume, then for each point
    sync, check the budget, take the next point, claim it, measure it, record it."""

    def __init__(self, space: SearchSpace, ctx: Context, evaluator: Evaluator, strategy: Strategy,
                 store: StudyStore, budget: Budget, on_trial: OnTrial | None, claims: Claims, sync_s: float,
                 clock: Callable[[], float], per_trial: PerTrial):
        self.space, self.ctx, self.evaluator, self.strategy = space, ctx, evaluator, strategy
        self.per_trial = per_trial
        assert ctx.problem is not None  # tune_study() checked it
        self.problem: Problem = ctx.problem
        self.store, self.budget, self.on_trial, self.claims, self.sync_s = store, budget, on_trial, claims, sync_s
        self.state = StudyState()
        self.simulated = evaluator.kind == OracleKind.REPLAY  # the clock adds recorded costs instead of wall time
        self.queue: list[Point] = []  # proposals asked for and not yet taken
        self.clock = clock
        self.base = 0.0  # the study's clock at resume
        self.began: float | None = None  # when this run's tuning clock started on self.clock (after start-up)
        self.startup_s = 0.0
        self.walls: list[float] = []  # this run's evaluation wall times: what the next one is predicted to take
        self.deadline = budget.seconds is not None and not self.simulated
        self.mine: set[str] = set()  # keys of the trials this run measured (stored, or queued to be)
        self.writer: TrialWriter | None = None

    def run(self) -> TuneResult:
        self.resume()
        began = time.perf_counter()
        self.base = self.state.clock
        self.writer = TrialWriter(self.store, self.claims)
        try:
            stopped = self.loop()
        except BaseException:
            try:
                self.writer.close()  # what was measured is stored, also when the loop was interrupted
            except Exception:  # the loop's own error is the one to raise; unstored points' claims lapse
                pass
            raise
        finally:
            if self.deadline:
                self.evaluator.bound(None)
        if stopped == "seconds" and self.deadline:
            self.evaluator.abandon()  # the compiles started for points that will not be asked for
        self.writer.close()
        self.report()
        s = self.state
        return TuneResult(self.store.study.study_name, s.trials, s.new, s.best_point, s.best_ms, s.clock,
                          stopped, s.failures, s.skipped, time.perf_counter() - began,
                          s.store_s + self.writer.waited_s, self.writer.busy_s, s.busy_s, s.first_eval, s.last_eval,
                          s.evaluate_s, self.startup_s, self.budget.trials)

    def loop(self) -> str:
        """Take, claim, measure and record points until the budget says stop; why it stopped."""
        while True:
            stopped = self.stop_reason()
            if stopped:
                return stopped
            point = self.next_point()
            if point is None:
                return "exhausted"
            claimed = self.claim(point)
            if claimed is Claim.FULL:
                self.sync()  # the study's own count, for the result
                return "trials"
            if not claimed.mine:
                continue  # another worker has it; its result reaches the strategy at the next sync
            measured = self.measure(point)
            if measured is None:
                return "seconds"  # the deadline came while it waited: nothing to record
            self.record(point, *measured)

    def now(self) -> float:
        """The tuning clock now: the recorded costs so far in replay, else the study's clock at resume plus this
        run's wall time (or a later clock another worker stored)."""
        if self.simulated or self.began is None:  # replay, or still starting up: nothing counted yet
            return self.state.clock
        return max(self.state.clock, self.base + self.clock() - self.began)

    def time_left(self) -> float:
        """Seconds of the budget left on the tuning clock (only asked when the budget has seconds)."""
        assert self.budget.seconds is not None
        return self.budget.seconds - self.now()

    def resume(self) -> None:
        """Take in what the study holds: told to the strategy, counted, never measured again."""
        history = self.store.history()
        self.strategy.warm_start([(r.point, r.value) for r in history])
        for r in history:
            self.state.add(r.number, r.key, r.point, r.value, r.clock_s)
        # the stored evaluations' wall times predict the next one's: a study resumed with less time left than
        # that ends at once, instead of handing points to a compile pool for a deadline that has come
        self.walls = [float(r.attrs["wall_s"]) for r in history
                      if r.attrs.get("wall_s") is not None and r.attrs.get("startup_s") is None]
        self.claims.begin(self.state.done, self.sync)
        self.report()

    def sync(self) -> set[str]:
        """Tell the strategy the trials other workers stored since the last look; the keys of all stored trials
        (this run's queued ones included)."""
        fresh = []
        for r in self.store.history():
            if r.number in self.state.numbers:
                continue
            if r.key in self.mine:  # this run's own, stored by its writer: known already
                self.state.numbers.add(r.number)
                continue
            fresh.append(r)
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
        reason = self.budget.stop_reason(s.trials, self.now(), s.since_best)
        if reason is None and self.deadline and self.walls:
            # the time left cannot fit a typical evaluation: the user would wait past the budget for it
            if self.time_left() < statistics.median(self.walls[-FIT_WINDOW:]):
                return "seconds"
        return reason

    def next_point(self) -> Point | None:
        """The strategy's next proposal that is feasible and not stored yet; None when it has nothing left.

        Evaluators that compile ahead (a pool) get proposals to start on before they are asked for them
        (:meth:`Evaluator.to_ask` says how many), so the pool compiles the next points while the GPU
        measures the ones it built; the rest get one proposal at a time. The first handed-out point that
        is ready (built) goes next: one whose compile takes a minute does not hold up the points behind it,
        such as new launch arguments of a kernel built already. An evaluator that builds on speculation
        (:attr:`Evaluator.speculates`) gets an adaptive strategy's proposals one at a time, each made knowing
        every result before it, and with each the points the strategy ranks next (:meth:`Strategy.ahead`), to
        build while the GPU measures.
        """
        speculating = self.evaluator.speculates and self.strategy.adapts
        while True:
            wanted = (0 if self.queue else 1) if speculating else \
                self.evaluator.to_ask(len(self.queue), wide=not self.strategy.adapts)
            left = None if self.budget.trials is None else \
                max(0, self.budget.trials - self.state.trials - len(self.queue))
            if left is not None:
                # a pool compiles what it is handed: no more than the budget can still measure
                wanted = min(wanted, left)
            if wanted:
                more = self.strategy.ask(wanted)
                if more and speculating:
                    depth = self.evaluator.speculation_depth
                    ahead = self.strategy.ahead(depth if left is None else min(depth, left - len(more)))
                    self.strategy.building(ahead)
                    self.evaluator.speculate(more + ahead, self.problem)
                elif more and self.evaluator.prefetch_depth > 1:
                    self.evaluator.prefetch(more, self.problem)
                self.queue += more
            if not self.queue:
                return None
            ready = (i for i, p in enumerate(self.queue) if self.evaluator.ready(p, self.problem))
            point = self.queue.pop(next(ready, 0))
            if self.space.key(point) in self.state.done or self.space.check(point, self.ctx) is not None:
                # strategies never hand these out; if one ever did, it must cost nothing and teach nothing wrong
                self.strategy.tell([(point, None)])
                continue
            return point

    def claim(self, point: Point) -> Claim:
        """Claim ``point`` within the budget: NEW or TAKEOVER to measure it, TAKEN to leave it, FULL to stop."""
        key, started = self.space.key(point), time.perf_counter()
        claimed = self.claims.claim(key, self.budget.trials, self.state.done, self.sync)
        self.state.store_s += time.perf_counter() - started
        if claimed is Claim.TAKEOVER:
            self.sync()  # its last owner is gone: it may have stored the point after our last look
        if claimed.mine and key in self.state.done:
            self.claims.finish(key)  # stored after all: it counts, and nobody measures it again
            return Claim.TAKEN
        return claimed

    def measure(self, point: Point) -> tuple[EvalResult, _dt.datetime, float] | None:
        """The evaluator's result, when it began and the wall seconds it took; None when the deadline came while
        it waited. An interrupted or dropped evaluation gives its claim back."""
        began, started = _dt.datetime.now(), self.clock()
        if not self.simulated:
            began_evaluating(began.timestamp())
        try:
            result = self.evaluator.evaluate(point, self.problem)
        except DeadlinePassed:
            self.claims.release(self.space.key(point))
            return None
        except BaseException:
            self.claims.release(self.space.key(point))
            raise
        elapsed, s = self.clock() - started, self.state
        if self.began is None and not self.simulated:
            self.start_clock(result, elapsed)
        else:
            self.walls.append(elapsed)
        s.busy_s += float(result.extra.get("worker_s", elapsed))
        s.evaluate_s += elapsed
        s.first_eval = began.timestamp() if s.first_eval is None else s.first_eval
        s.last_eval = began.timestamp() + elapsed
        return result, began, elapsed

    def start_clock(self, result: EvalResult, elapsed: float) -> None:
        """Start the tuning clock after the run's first evaluation: at the moment it began timing its kernel
        (built by then, by a measuring process that is up); what it waited for before is start-up. The
        deadline holds from now on."""
        timing = min(max(result.bench_s, 0.0), elapsed)
        self.began = self.clock() - timing
        self.startup_s = elapsed - timing
        if self.deadline:
            self.evaluator.bound(self.time_left)

    def record(self, point: Point, result: EvalResult, began: _dt.datetime, elapsed: float) -> None:
        """Queue the trial to be stored (its claim is marked done once it is), count it, tell the strategy."""
        key, s = self.space.key(point), self.state
        if result.status is Status.INFEASIBLE and self.per_trial.infeasible is Infeasible.UNANSWERED:
            s.skipped += 1
            self.claims.finish(key, counted=False)
            self.strategy.tell([(point, None)])
            return
        clock = s.clock + result.cost_s if self.simulated else self.now()
        assert self.writer is not None
        self.mine.add(key)
        first = not self.simulated and not (s.new or s.skipped)  # the evaluation the clock started after
        attrs = {**self.per_trial.attrs(point), **({"startup_s": self.startup_s} if first else {})}
        self.writer.put(key, self.store.trial(point, result, clock, attrs, started=began, wall_s=elapsed))
        self.strategy.tell([(point, result.value)])
        s.add(None, key, point, result.value, clock)
        s.new += 1
        if result.status.failed:
            s.failures[result.status.value] = s.failures.get(result.status.value, 0) + 1
        self.report()

    def report(self) -> None:
        """Tell ``on_trial`` (from this thread) the trials stored so far: queued ones are not, until they are."""
        if self.on_trial:
            self.on_trial(self.state.trials - (self.writer.pending if self.writer else 0), self.state.best_ms)

"""Tuning one key: measure configurations (shared with other processes through claims), then decide once.

1. **Measure** (:func:`measure_points`), in evotune's one tuning loop
   (:func:`evotune.running.tuner.tune_study`) with the kernel launched in this process as
   its evaluator (:class:`LaunchEvaluator`): a list no longer than the budget is timed
   whole, in its order, as ``triton.autotune`` does; a larger set is searched by
   evotune's ``default`` strategy for ``budget`` evaluations, with the trials of
   the nearest keys already tuned as its sources. Points the study holds (from an
   earlier run, another process, or a list since changed) are told, not timed. Each
   point is claimed before it is timed (:mod:`evotune.storage.claims`), so processes tuning
   the same key together time each point once and the budget holds for them all. A
   configuration the device refuses is stored as a failed trial, with the timer and the
   launch's program count beside each result.
2. **Decide** (:func:`decide_key`): once no other process is timing a point, one process
   (rank 0 under ``torch.distributed`` or a ``RANK`` variable; otherwise whoever takes
   the key's decision claim first; a rank that waits RANK_WAIT_S seconds with nobody else
   at work on the key, which rank 0 may never launch, decides itself) re-times the
   fastest ``confirm`` configurations side by side
   (:func:`~evotune.measurement.retiming.confirm_rounds`) and writes the decision into
   the study; every other process waits for it and reads it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from evotune.core.budget import Budget
from evotune.core.problem import Problem
from evotune.core.result import EvalResult
from evotune.core.space import Context, FeasibleSet, Point, SearchSpace
from evotune.measurement.base import Evaluator
from evotune.running.tuner import Infeasible, PerTrial, tune_study
from evotune.search import launch
from evotune.search.prior import Source
from evotune.search.strategies import Strategy, make_strategy
from evotune.search.strategies.exhaustive import Listed
from evotune.storage.claims import Claims, NoClaims, make_claims
from evotune.storage.claims.base import owner_id
from evotune.storage.study import StudyStore
from evotune.triton_tuning.cache import Decision, DecisionStore, candidates_hash, key_text, now
from evotune.triton_tuning.compile_ahead import PointBuilds
from evotune.triton_tuning.neighbours import sources
from evotune.triton_tuning.timers import Call, Timer

log = logging.getLogger("evotune.autotune")
POLL_S = 0.1
#: a rank other than 0 decides a key itself once no other process has worked on it for this long
RANK_WAIT_S = 60.0


class TuningError(RuntimeError):
    """No configuration could be chosen for a key (all pruned, or every one failed)."""


@dataclass
class KeyJob:
    """Everything the tuning of one key needs."""

    cache: DecisionStore
    key: dict[str, Any]
    space: SearchSpace
    feasible: FeasibleSet  # the candidates left after every pruning
    listed: list[Point] | None  # their order when they are a list (timed in it)
    budget: int
    measure: Callable[[Point], EvalResult]
    make_call: Callable[[Point], Call]
    timer: Timer
    confirm: int
    seed: int = 0
    #: builds a list's configurations before they are timed (None: each is built when first timed)
    compile_ahead: Callable[[list[Point]], object] | None = None
    #: a pool that builds a search's proposals while others are timed (None: each is built when first timed)
    pool: Callable[[], PointBuilds] | None = None
    #: the number of programs a point's launch runs at this key (None: the grid is not known)
    programs: Callable[[Point], int] | None = None
    #: the GPU's multiprocessors, for the launch features (None: not known)
    sms: int | None = None
    #: what the space's constraints read of the launch (a :class:`~evotune.triton_tuning.configs.LaunchContext`)
    ctx: Context = field(default_factory=Context)
    #: what compiling a configuration costs, in evaluations' worth of time; above 0, the search weighs a point not
    #: in ``built`` by it (:mod:`evotune.search.compile_cost`)
    compile_cost: float = 0.0
    #: the points built already (``space.key``): measured for another key of the same specialisation
    built: frozenset[str] = frozenset()

    @property
    def points(self) -> list[Point]:
        if self.listed is not None:
            return [p for p in self.listed if p in self.feasible]
        return [self.feasible.point(r) for r in range(len(self.feasible))]

    @property
    def candidates_hash(self) -> str:
        return candidates_hash([self.space.key(p) for p in self.points])


def rank() -> int | None:
    """This process's rank among several (torch.distributed, else the RANK variable), None when alone."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except ImportError:
        pass
    text = os.environ.get("RANK")
    world = os.environ.get("WORLD_SIZE", "2")
    return int(text) if text is not None and text.isdigit() and world != "1" else None


def claims_of(job: KeyJob, study: str) -> Claims:
    url = job.cache.url
    return make_claims(url, study) if url else NoClaims(study, 3600.0)


def tune_key(job: KeyJob) -> Decision:
    """The decision for ``job``'s key: the stored one when it was made among the same candidates, else a new one."""
    if not len(job.feasible):
        raise TuningError(f"no configuration of {job.space.name} is left for key {job.key} after pruning")
    store = job.cache.study(job.key, job.space)
    decision = job.cache.decision(store)
    if decision is not None and decision.candidates == job.candidates_hash:
        return decision
    if len(job.feasible) == 1:  # one candidate: nothing to time, as triton.autotune does
        decision = Decision(job.space.to_storage(job.points[0]), None, job.candidates_hash, "single", owner_id(),
                            now())
        job.cache.write_decision(store, decision)
        return decision
    measure_points(job, store)
    return decide_key(job, store)


def _measured(store: StudyStore) -> dict[str, tuple[Point, float | None]]:
    return {r.key: (r.point, r.value) for r in store.history()}


class LaunchEvaluator(Evaluator):
    """A key's configurations measured in this process, by launching the kernel (``measure``: build, check
    against the device, time with the hooks around each launch). With a pool (:class:`PointBuilds`), the tuner
    hands it the next proposals to build while the GPU times the built ones."""

    kind = "launch"

    def __init__(self, measure: Callable[[Point], EvalResult], pool: PointBuilds | None = None):
        self.measure, self.pool = measure, pool
        self.prefetch_depth = 1 if pool is None else pool.depth
        self.speculates = pool is not None and pool.speculates
        self._ahead = self.prefetch_depth if pool is None else pool.ahead

    @property
    def speculation_depth(self) -> int:
        return self._ahead

    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        if self.pool is not None:
            self.pool.wait(point)
        return self.measure(point)

    def prefetch(self, points: list[Point], problem: Problem) -> None:
        if self.pool is not None:
            self.pool.submit(points)

    def speculate(self, points: list[Point], problem: Problem) -> None:
        if self.pool is not None:
            self.pool.speculate(points)

    def ready(self, point: Point, problem: Problem) -> bool:
        return self.pool is None or self.pool.ready(point)


def measure_points(job: KeyJob, store: StudyStore) -> int:
    """Time the key's points this process claims until the budget is spent, in evotune's one tuning loop
    (:func:`evotune.running.tuner.tune_study`); how many it timed. Returns once no other process is timing a point."""
    space, points = job.space, job.points
    wanted = {space.key(p) for p in points}
    stored = {r.key for r in store.history()}
    outside = len(stored - wanted)  # trials of points no longer offered: the study and the claims count them
    strategy: Strategy
    if len(points) <= job.budget:
        strategy = Listed(space, job.feasible, rows=[r for r in map(job.feasible.row, points) if r is not None])
        if job.compile_ahead is not None:
            job.compile_ahead([p for p in points if space.key(p) not in stored])
    else:
        srcs = sources(job.cache, job.key, job.space, job.sms)
        if srcs:
            log.info("tuning %s: transfer from %s", job.key, ", ".join(s.name for s in srcs))
        # which keys this search started from, in the study: a pick is read against the keys it learned from
        job.cache.storage.set_study_user_attr(store.study_id, "sources", [s.name for s in srcs])
        strategy = _search(job, srcs)
    claims = claims_of(job, store.study.study_name)

    def attrs(point: Point) -> dict[str, Any]:
        # the launch's shape goes with the timer, for the keys that transfer from this one
        return {"timer": job.timer.kind, **({} if job.programs is None else {"programs": job.programs(point)})}

    ctx = replace(job.ctx, problem=Problem(kind="triton", label=key_text(job.key)))
    pool = job.pool() if job.pool is not None and not isinstance(strategy, Listed) else None
    try:
        result = tune_study(space, ctx, LaunchEvaluator(job.measure, pool), strategy, store,
                            Budget(trials=outside + min(job.budget, len(points))), claims=claims,
                            per_trial=PerTrial(attrs, Infeasible.REFUSED))
    finally:
        if pool is not None:
            pool.close()
    while claims.active():  # points other processes are timing: the decision waits for them
        time.sleep(POLL_S)
    return result.new_trials


def _search(job: KeyJob, srcs: list[Source]) -> Strategy:
    """``default`` over the key's candidates, ``srcs`` (the trials of the nearest keys tuned) as its sources."""
    counts = None if job.programs is None else [job.programs(job.feasible.point(r)) for r in range(len(job.feasible))]
    # the sources are this kernel's own keys tuned on this GPU: a lone nearest key is kept while its ranking
    # weighs, as several are (dropping it after its first own result, as `default` does, cost the large space's
    # replay at the default budget 32 x 4096 x 4096: 9 -> 30 evaluations to 0.99, 256 x 4096 x 4096: 8 -> 31,
    # 4096^3: 8 -> 26; docs/STRATEGY_DESIGN.md)
    table = None if counts is None else launch.table(counts, job.sms)
    # the space's named configurations (what a server launches untuned) are measured first: the pick is never
    # slower than what the user would deploy anyway, and the search looks around it (the fastest configurations
    # of a kernel are often a parameter or two away from its hand-picked default)
    first = list(job.space.named.values())
    if job.compile_cost <= 0:
        return make_strategy("default", job.space, job.feasible, seed=job.seed, sources=srcs, lone_patience=0,
                             launch=table, first=first)
    # every configuration is its own kernel: the space says which are built, so the search weighs the others'
    # compile (and draws its first points among the built ones where there are enough)
    space = replace(job.space, built=lambda point, problem: job.space.key(point) in job.built)
    ctx = replace(job.ctx, problem=Problem(kind="triton", label=key_text(job.key)))
    return make_strategy("default", space, job.feasible, seed=job.seed, ctx=ctx, sources=srcs, lone_patience=0,
                         launch=table, compile_cost=job.compile_cost, first=first)


def decide_key(job: KeyJob, store: StudyStore) -> Decision:
    """The key's decision: rank 0's under ranks (waited for), else made here under the key's decision claim."""
    mine = rank()
    if mine is not None and mine != 0:
        decision = wait_for_decision(job, store)
        if decision is not None:
            return decision
        log.warning("key %s: no other process worked on it for %.0f s (rank 0 may never launch this key, e.g. "
                    "another batch size): rank %d decides", job.key, RANK_WAIT_S, mine)
    lock = claims_of(job, store.study.study_name + "#decide")
    with lock.holding("decide", poll_s=POLL_S):
        decision = job.cache.decision(store)
        if decision is not None and decision.candidates == job.candidates_hash:
            return decision  # another process decided while this one waited
        decision = choose(job, store)
        if decision.confirmation is not None:
            job.cache.storage.set_study_user_attr(store.study_id, "confirmation", decision.confirmation)
        job.cache.write_decision(store, decision)
        return decision


def wait_for_decision(job: KeyJob, store: StudyStore) -> Decision | None:
    """The decision another process makes, or None once no other process has been timing a point of the key
    or holding its decision claim for RANK_WAIT_S seconds."""
    name = store.study.study_name
    points, lock = claims_of(job, name), claims_of(job, name + "#decide")
    log.info("key %s: waiting for rank 0's decision", job.key)
    idle_since = time.monotonic()
    while True:
        decision = job.cache.decision(store)
        if decision is not None and decision.candidates == job.candidates_hash:
            return decision
        if points.active() or lock.active():
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > RANK_WAIT_S:
            return None
        time.sleep(POLL_S)


def choose(job: KeyJob, store: StudyStore) -> Decision:
    """The fastest of the measured candidates, the best ``confirm`` of them re-timed side by side."""
    wanted = {job.space.key(p) for p in job.points}
    timed = sorted((v, k, p) for k, (p, v) in _measured(store).items() if k in wanted and v is not None)
    if not timed:
        failed = [r for r in store.history() if r.key in wanted]
        why = f" (the first: {failed[0].attrs.get('message', failed[0].status.value)})" if failed else ""
        raise TuningError(f"every configuration of {job.space.name} failed for key {job.key}{why}; see the study "
                          f"{store.study.study_name}")
    top = timed[: max(1, job.confirm)]
    if len(top) < 2:
        v, _, p = top[0]
        return Decision(job.space.to_storage(p), v, job.candidates_hash, "timed", owner_id(), now())
    result = job.timer.confirm({k: job.make_call(p) for _, k, p in top}, search_ms={k: v for v, k, _ in top})
    for w in result.warnings:
        log.info("key %s: %s", job.key, w)
    best = min(result.items, key=lambda k: result.items[k].median_ms)
    point = next(p for _, k, p in top if k == best)
    # the record ``python -m evotune best`` reads (see report.py): the items, their configurations, no baselines
    record = {**result.to_dict(), "configs": {k: job.space.to_storage(p) for _, k, p in top}, "baselines": [],
              "date": now()}
    return Decision(job.space.to_storage(point), result.items[best].median_ms, job.candidates_hash, "confirmed",
                    owner_id(), now(), record)

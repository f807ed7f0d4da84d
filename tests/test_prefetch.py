"""Handing points to a compile pool ahead of the GPU: the pool never runs short, the strategy is asked in chunks."""

from __future__ import annotations

import pytest

from evotune.core.budget import Budget
from evotune.core.space import Context
from evotune.measurement.base import Evaluator
from evotune.measurement.replay import ReplayEvaluator
from evotune.running.tuner import tune_study
from evotune.search.strategies import make_strategy
from evotune.storage.study import StudyStore


class _Pool(Evaluator):
    def __init__(self, depth: int):
        self.prefetch_depth = depth

    def evaluate(self, point, problem):  # pragma: no cover - never called here
        raise AssertionError


@pytest.mark.parametrize(("depth", "waiting", "asked"), [
    (1, 0, 1), (1, 1, 0),  # no pool: one at a time
    (14, 0, 21), (14, 20, 0), (14, 15, 0), (14, 14, 7), (14, 9, 12),  # at least a pool's worth handed out
    (2, 0, 3), (2, 2, 1), (2, 3, 0),
])
def test_the_evaluator_asks_for_enough_to_keep_its_pool_busy(depth, waiting, asked):
    assert _Pool(depth).to_ask(waiting) == asked


@pytest.mark.parametrize(("depth", "waiting", "asked"), [(1, 0, 1), (1, 1, 0), (14, 0, 42), (14, 28, 14), (14, 29, 0)])
def test_an_order_fixed_beforehand_is_handed_out_twice_as_far(depth, waiting, asked):
    """A strategy that does not adapt (a recording's order) loses nothing by proposing early; without a pool,
    still one point at a time."""
    assert _Pool(depth).to_ask(waiting, wide=True) == asked


class _RecordingReplay(ReplayEvaluator):
    """A replay oracle that says it has a pool, and records what it was handed and when."""

    def __init__(self, landscape, depth: int):
        super().__init__(landscape)
        self.prefetch_depth = depth
        self.batches: list[int] = []
        self.handed: set[str] = set()
        self.evaluated: set[str] = set()
        self.ahead: list[int] = []  # handed out and not evaluated yet, at each evaluation (itself included)
        self.key = landscape.space().key

    def prefetch(self, points, problem):
        self.batches.append(len(points))
        self.handed.update(self.key(p) for p in points)

    def evaluate(self, point, problem):
        assert self.key(point) in self.handed, "a point was evaluated without being handed to the pool first"
        self.ahead.append(len(self.handed - self.evaluated))
        self.evaluated.add(self.key(point))
        return super().evaluate(point, problem)


def test_the_tuner_keeps_a_pools_worth_of_points_ahead_of_the_gpu(gemm_landscape, tmp_path):
    space = gemm_landscape.space()
    ctx = Context(problem=gemm_landscape.problem)
    ev = _RecordingReplay(gemm_landscape, depth=4)
    store = StudyStore.open(f"sqlite:///{tmp_path / 'p.db'}", "prefetch", space)
    strategy = make_strategy("random", space, space.feasible(ctx), seed=3, ctx=ctx)
    result = tune_study(space, ctx, ev, strategy, store, Budget(trials=30))
    assert result.trials == 30
    assert ev.batches[:4] == [6, 2, 2, 2]  # 1.5 pools first, then half a pool whenever only a pool is left
    # the compile processes always had something to work on, until the budget had fewer points left than them;
    # nothing was handed out past the budget (it would be compiled for nothing)
    assert all(ahead >= min(4, 30 - i) for i, ahead in enumerate(ev.ahead))
    assert len(ev.handed) == 30


class _SlowCompile(_RecordingReplay):
    """Every fifth point handed out takes eight evaluations' time to compile."""

    def __init__(self, landscape, depth: int):
        super().__init__(landscape, depth)
        self.until: dict[str, int] = {}

    def prefetch(self, points, problem):
        super().prefetch(points, problem)
        for p in points:
            if len(self.handed) % 5 == 0:
                self.until[self.key(p)] = len(self.evaluated) + 8

    def ready(self, point, problem):
        return len(self.evaluated) >= self.until.get(self.key(point), 0)

    def evaluate(self, point, problem):
        self.order.append((self.key(point), self.ready(point, problem)))
        return super().evaluate(point, problem)


def test_points_still_compiling_wait_while_built_ones_are_measured(gemm_landscape, tmp_path):
    space = gemm_landscape.space()
    ctx = Context(problem=gemm_landscape.problem)
    ev = _SlowCompile(gemm_landscape, depth=4)
    ev.order = []
    store = StudyStore.open(f"sqlite:///{tmp_path / 'p.db'}", "slow", space)
    strategy = make_strategy("random", space, space.feasible(ctx), seed=3, ctx=ctx)
    result = tune_study(space, ctx, ev, strategy, store, Budget(trials=40))
    assert result.trials == 40 and ev.until
    # in the order handed out, the slow points would be measured two evaluations after their compile began;
    # there is a built point to measure meanwhile, so none waits for its compile, except in the budget's last
    # eight evaluations (a compile's time), when nothing past the budget is handed out to measure instead
    assert any(key in ev.until for key, _ in ev.order)
    assert [i for i, (_, ready) in enumerate(ev.order) if not ready and i < 40 - 8] == []


class _Speculating(ReplayEvaluator):
    """A replay oracle that builds on speculation: records each hand-over and what was measured before it."""

    speculates = True

    def __init__(self, landscape, depth: int, ahead: int | None = None):
        super().__init__(landscape)
        self.prefetch_depth = depth
        self.ahead = depth if ahead is None else ahead
        self.key = landscape.space().key
        self.calls: list[tuple[list[str], int]] = []  # (the points handed, evaluations made before)
        self.evaluated: list[str] = []

    @property
    def speculation_depth(self) -> int:
        return self.ahead

    def speculate(self, points, problem):
        self.calls.append(([self.key(p) for p in points], len(self.evaluated)))

    def evaluate(self, point, problem):
        self.evaluated.append(self.key(point))
        return super().evaluate(point, problem)


def _run(landscape, tmp_path, name, evaluator, budget):
    space = landscape.space()
    ctx = Context(problem=landscape.problem)
    store = StudyStore.open(f"sqlite:///{tmp_path / f'{name}.db'}", name, space)
    strategy = make_strategy("default", space, space.feasible(ctx), seed=5, ctx=ctx)
    tune_study(space, ctx, evaluator, strategy, store, Budget(trials=budget))
    return [r.key for r in sorted(store.history(), key=lambda r: r.number)]


@pytest.mark.parametrize("ahead", [4, 8])
def test_a_pool_that_builds_on_speculation_gets_one_proposal_at_a_time_and_changes_none(gemm_landscape, tmp_path,
                                                                                        ahead):
    """Each proposal is made knowing every result before it, so the search proposes what it would without a pool;
    with each, the pool gets the points the search ranks next (as many as its speculation depth, which may be
    deeper than its processes, none past the budget)."""
    budget = 24
    alone = _run(gemm_landscape, tmp_path, "alone", ReplayEvaluator(gemm_landscape), budget)
    ev = _Speculating(gemm_landscape, depth=4, ahead=ahead)
    assert _run(gemm_landscape, tmp_path, "pool", ev, budget) == alone == ev.evaluated
    assert [handed[0] for handed, _ in ev.calls] == ev.evaluated  # the proposal first, then the ranked ones
    assert [before for _, before in ev.calls] == list(range(budget))  # asked once the previous one was measured
    for i, (handed, _) in enumerate(ev.calls):
        assert len(handed[1:]) <= min(ahead, budget - i - 1) and not set(handed[1:]) & set(ev.evaluated[: i + 1])
    assert sum(len(h) > 1 for h, _ in ev.calls) > budget // 2  # the search ranked points ahead for most of them
    assert max(len(h) - 1 for h, _ in ev.calls) == ahead  # as deep as the evaluator asks, not its processes

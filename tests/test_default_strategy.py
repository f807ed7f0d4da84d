"""The ``default`` strategy on the shipped GEMM landscape: budget, no repeats, feasibility, seeds."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from conftest import GEMM

from evotune.core.space import Context
from evotune.reporting.compare import Case
from evotune.search.strategies import make_strategy
from evotune.search.strategies.base import OptionError


@pytest.fixture(scope="module")
def gemm():
    target = Case.load(str(GEMM), 400)
    space, fs, row_times = target.replay()
    return space, fs, row_times, Context(problem=target.landscape.problem)


def drive(gemm, seed, budget, batch=1, **options):
    """Ask/tell up to ``budget``; the rows handed out in order and the mean ask() time in ms."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=seed, ctx=ctx, **options)
    rows: list[int] = []
    spent = 0.0
    while len(rows) < budget:
        t0 = time.perf_counter()
        points = s.ask(min(batch, budget - len(rows)))
        spent += time.perf_counter() - t0
        if not points:
            break
        told = []
        for p in points:
            row = fs.row(p)
            assert row is not None, "an infeasible point was handed out"
            assert space.check(p, ctx) is None
            rows.append(row)
            t = float(row_times[row])
            told.append((p, None if math.isnan(t) else t))
        s.tell(told)
    return rows, spent / max(len(rows), 1) * 1e3


def test_runs_to_its_budget_without_repeats_and_is_reproducible(gemm):
    rows, _ = drive(gemm, seed=3, budget=50, batch=3)
    assert len(rows) == 50
    assert len(set(rows)) == len(rows), "a point was handed out twice"
    assert drive(gemm, seed=3, budget=50, batch=3)[0] == rows
    assert drive(gemm, seed=4, budget=50, batch=3)[0] != rows


def test_failed_points_are_learnt_from(gemm):
    space, fs, _, ctx = gemm
    s = make_strategy("default", space, fs, seed=0, ctx=ctx)
    for _ in range(30):  # every point fails: the strategy must still hand out fresh feasible ones
        (p,) = s.ask(1)
        s.tell([(p, None)])
    assert s.remaining == len(fs) - 30


def test_options_are_checked(gemm):
    space, fs, _, ctx = gemm
    with pytest.raises(OptionError):
        make_strategy("default", space, fs, ctx=ctx, pool=0)
    with pytest.raises(OptionError):
        make_strategy("default", space, fs, ctx=ctx, relevance="yes")
    with pytest.raises(OptionError):
        make_strategy("default", space, fs, ctx=ctx, screened=0.5)  # an option of the earlier default


def test_ask_after_390_evaluations_hands_out_fresh_feasible_points(gemm):
    """ask() once 390 points are told (told directly: a full 400-evaluation run is too slow for the suite)
    still hands out fresh feasible points; its time is benchmarks/ask_overhead.py's to measure."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=0, ctx=ctx)
    rng = np.random.default_rng(0)
    told = {int(r) for r in rng.choice(len(fs), size=390, replace=False)}
    for row in told:
        t = float(row_times[row])
        s.tell([(fs.point(row), None if math.isnan(t) else t)])
    for _ in range(10):
        (p,) = s.ask(1)
        row = fs.row(p)
        assert row is not None and row not in told and space.check(p, ctx) is None
        told.add(row)
        t = float(row_times[row])
        s.tell([(p, None if math.isnan(t) else t)])
    assert s.remaining == len(fs) - 400


def test_local_steps_stay_one_parameter_from_the_best_then_two(gemm):
    """With local = 1 and patience = 0 every proposal after the start is a fresh neighbour of the best point:
    one parameter away while the best has such neighbours left, else two."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=0, ctx=ctx, local=1.0, patience=0, startup=10)
    told: dict[int, float] = {}
    taken: set[int] = set()
    seen = []
    for i in range(80):
        if i >= 10:
            best = min(told, key=told.get)
            differ = (fs.codes != fs.codes[best]).sum(1)
            near = {int(r) for r in np.flatnonzero(differ == 1)} - taken
        (p,) = s.ask(1)
        row = fs.row(p)
        taken.add(row)
        if i >= 10:
            distance = int((fs.codes[row] != fs.codes[best]).sum())
            assert distance == (1 if near else 2), (i, distance, len(near))
            seen.append(distance)
        t = float(row_times[row])
        s.tell([(p, None if math.isnan(t) else t)])
        if not math.isnan(t):
            told[row] = t
    assert {1, 2} <= set(seen), "the walk never used up the best point's one-parameter neighbours"


def _ranked_with_one_length_scale(s, fs, row_times, n: int) -> list[bool]:
    """Run ``n`` proposals; for each after the 10-point start (ranked by a fitted GP), whether its model had one
    length-scale for all features."""
    uniform = []
    for i in range(n):
        (p,) = s.ask(1)
        if i >= 10:
            scale = s.model._scale
            uniform.append(bool(np.all(scale == scale[0])))
        t = float(row_times[fs.row(p)])
        s.tell([(p, None if math.isnan(t) else t)])
    return uniform


def test_early_proposals_alternate_with_one_shared_length_scale(gemm):
    """Until ``shared`` results, every other proposal is ranked by the GP with one length-scale for all features."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=1, ctx=ctx, shared=20)
    uniform = _ranked_with_one_length_scale(s, fs, row_times, 40)
    # proposals 11..20 alternate (the even ones use the shared scale); from 20 results on, per-feature scales
    assert uniform[:10] == [i % 2 == 1 for i in range(10)]
    assert not any(uniform[10:])


@pytest.mark.parametrize("stall_shared", [True, False])
def test_stalled_proposals_alternate_with_one_shared_length_scale_only_when_asked(gemm, stall_shared):
    """With ``stall_shared`` a stalled search (patience 0: always) ranks every other proposal with one length-scale."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=1, ctx=ctx, shared=0, patience=0, stall_shared=stall_shared)
    uniform = _ranked_with_one_length_scale(s, fs, row_times, 24)
    assert uniform == [stall_shared and i % 2 == 1 for i in range(14)]

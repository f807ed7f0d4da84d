"""The CPU side of benchmarks/oracle_check.py: which points it times, and how it scores two timers."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import PNPOLY, ROOT

from evotune.core.landscape import load_landscape
from evotune.core.result import Status


@pytest.fixture(scope="module")
def oracle_check():
    spec = importlib.util.spec_from_file_location("oracle_check", ROOT / "benchmarks" / "oracle_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_times_the_fastest_points_and_a_seeded_sample_of_the_other_valid_ones(oracle_check):
    ls = load_landscape(PNPOLY)
    chosen = oracle_check.choose_points(ls, top=5, random=7, seed=3)
    assert [g for g, _ in chosen] == ["top"] * 5 + ["random"] * 7
    times = [ls.lookup(p).time_ms for _, p in chosen]
    assert times[:5] == sorted(ls.ok_times)[:5]
    assert all(ls.lookup(p).status is Status.OK for _, p in chosen)  # failed points are never chosen
    assert len({tuple(sorted(map(str, p.items()))) for _, p in chosen}) == 12
    assert chosen == oracle_check.choose_points(ls, top=5, random=7, seed=3)


def test_two_timers_are_scored_by_rank_correlation_and_median_ratio(oracle_check):
    rows = [{"oracle_ms": t, "do_bench_ms": t * 1.02, "recorded_ms": t} for t in (1.0, 2.0, 3.0, 4.0)]
    rows.append({"error": "wrong result"})
    s = oracle_check.summary(rows)
    assert s["points"] == 4 and s["failed_verification"] == 1
    assert s["spearman_oracle_do_bench"] == pytest.approx(1.0)
    assert s["median_ratio_do_bench_over_oracle"] == pytest.approx(1.02)
    assert oracle_check.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)

"""Points a strategy proposes before its own choices (``make_strategy(..., first=...)``): every strategy hands out
the feasible ones first, in order, skipping those told already; a searched ``evotune.autotune`` key measures its
space's named configurations (what a server launches untuned) first."""

from __future__ import annotations

from pathlib import Path

import pytest

from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, FeasibleSet, Point, SearchSpace, ordinal
from evotune.search.strategies import make_strategy, strategy_names
from evotune.triton_tuning.cache import DecisionStore, KernelId
from evotune.triton_tuning.search import KeyJob, tune_key
from evotune.triton_tuning.timers import WallClockTimer

SPACE = SearchSpace("grid", [ordinal("a", (1, 2, 4, 8, 16)), ordinal("b", (1, 2, 4, 8))])


def feasible() -> FeasibleSet:
    return SPACE.feasible(Context())


@pytest.mark.parametrize("name", [n for n in strategy_names() if n != "exhaustive"])
def test_every_strategy_proposes_the_first_points_before_its_own(name: str) -> None:
    first: list[Point] = [{"a": 16, "b": 1}, {"a": 3, "b": 1}, {"a": 1, "b": 8}]  # a = 3 is not a choice
    s = make_strategy(name, SPACE, feasible(), seed=1, first=first)
    assert s.ask(2) == [{"a": 16, "b": 1}, {"a": 1, "b": 8}]
    assert len({tuple(p.values()) for p in s.ask(5)} & {(16, 1), (1, 8)}) == 0  # not proposed again


def test_a_first_point_told_already_is_not_proposed() -> None:
    s = make_strategy("default", SPACE, feasible(), seed=0, first=[{"a": 16, "b": 1}, {"a": 8, "b": 2}])
    s.tell([({"a": 16, "b": 1}, 1.0)])
    assert s.ask(1) == [{"a": 8, "b": 2}]


def test_a_searched_key_measures_its_spaces_named_configuration_first(tmp_path: Path) -> None:
    space = SearchSpace("grid", SPACE.params, named={"vendor default": {"a": 4, "b": 8}})
    fs = space.feasible(Context())
    timed: list[Point] = []

    def measure(p: Point) -> EvalResult:
        timed.append(p)
        return EvalResult(Status.OK, 1.0 + p["a"] / 100 + p["b"] / 1000)

    cache = DecisionStore(f"sqlite:///{tmp_path}/c.db", KernelId("k", "0" * 16, "3", "cpu"))
    tune_key(KeyJob(cache, {"M": 8}, space, fs, None, 6, measure, lambda p: lambda: None, WallClockTimer(), 1))
    assert timed[0] == {"a": 4, "b": 8} and len(timed) == 6

"""What the tuning loop stores of each evaluation besides its result (``PerTrial``): the caller's attributes, and
whether an INFEASIBLE result is a point the oracle could not answer (skipped) or one the device refused (stored)."""

from __future__ import annotations

from pathlib import Path

from evotune.core.budget import Budget
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, Point, SearchSpace, ordinal
from evotune.measurement.base import Evaluator
from evotune.running.tuner import Infeasible, PerTrial, tune_study
from evotune.search.strategies.exhaustive import Listed
from evotune.storage.study import StudyStore

SPACE = SearchSpace("blocks", [ordinal("BLOCK", (16, 32, 64, 128))])
CTX = Context(problem=Problem(kind="stand-in", label="n=64"))


class _Refuses64(Evaluator):
    """BLOCK 64 comes back INFEASIBLE; the others take BLOCK / 16 ms."""

    kind = "stand-in"

    def __init__(self) -> None:
        self.evaluated: list[int] = []

    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        self.evaluated.append(point["BLOCK"])
        if point["BLOCK"] == 64:
            return EvalResult(Status.INFEASIBLE, message="out of resource: shared memory")
        return EvalResult(Status.OK, point["BLOCK"] / 16, bench_s=0.001)


def _run(tmp_path: Path, per_trial: PerTrial | None, trials: int) -> tuple[list, int, _Refuses64]:
    fs = SPACE.feasible(CTX)
    store = StudyStore.open(f"sqlite:///{tmp_path / 's.db'}", "s", SPACE)
    ev = _Refuses64()
    result = tune_study(SPACE, CTX, ev, Listed(SPACE, fs, rows=list(range(len(fs)))), store, Budget(trials=trials),
                        per_trial=per_trial)
    return store.history(), result.skipped, ev


def test_a_refused_point_is_a_stored_failure_that_counts_with_the_callers_attributes(tmp_path: Path) -> None:
    per_trial = PerTrial(lambda p: {"programs": 64 // p["BLOCK"]}, Infeasible.REFUSED)
    history, skipped, ev = _run(tmp_path, per_trial, trials=3)
    assert ev.evaluated == [16, 32, 64] and skipped == 0  # the refusal is the third of three trials
    assert [(r.point["BLOCK"], r.status) for r in history] == [(16, Status.OK), (32, Status.OK),
                                                               (64, Status.INFEASIBLE)]
    assert history[2].attrs["message"] == "out of resource: shared memory"
    assert [r.attrs["programs"] for r in history] == [4, 2, 1]


def test_an_unanswered_point_costs_nothing_and_is_not_stored(tmp_path: Path) -> None:
    history, skipped, ev = _run(tmp_path, None, trials=3)
    assert ev.evaluated == [16, 32, 64, 128] and skipped == 1
    assert [r.point["BLOCK"] for r in history] == [16, 32, 128] and "programs" not in history[0].attrs

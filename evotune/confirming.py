"""The confirmation stage of a target, run by one worker once the target's studies are finished.

After a search, the fastest configurations of a target (over every strategy and
seed) are re-timed beside the baselines in interleaved rounds
(:mod:`evotune.evaluation.confirm` does the rounds, in the measuring worker).
With several workers, the one that finishes the target's last study confirms
it, after the points other workers are still measuring are stored, and only
once for a given number of trials (see :class:`evotune.schedule.Schedule`).

Its time comes out of the runs' ``budget.seconds``: on an oracle whose clock is
the wall clock (not replay), each run of a target searches for
``1 - CONFIRM_SHARE`` of its seconds (:func:`search_budget`), and the stage's
rounds get the rest, ``CONFIRM_SHARE`` of the seconds of all the target's runs
(:func:`confirmation_seconds`). So the stage always runs, and a target takes
no more than its runs' seconds in all.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import optuna
from rich.console import Console

from evotune.claims import wait_for_others
from evotune.evaluation.base import Evaluator
from evotune.evaluation.options import ConfirmOptions
from evotune.experiment import Budget, Experiment
from evotune.schedule import Schedule
from evotune.study import StudyStore
from evotune.target import Target
from evotune.tuner import finished

CONFIRM_SHARE = 0.2  # of a run's seconds, held back for its target's confirmation stage


def reserves(exp: Experiment, evaluator: Evaluator) -> bool:
    """Whether the runs of ``exp`` on ``evaluator`` hold time back for a confirmation stage: it confirms, the stage
    is on, the budget has seconds and the clock is the wall clock (not replay's recorded costs)."""
    return (evaluator.confirms and exp.oracle_options.confirm.top_k > 0 and exp.budget.seconds is not None
            and evaluator.kind != "replay")


def search_budget(exp: Experiment, evaluator: Evaluator) -> Budget:
    """The budget each run's search gets: ``exp.budget`` less the confirmation's share of its seconds."""
    if not reserves(exp, evaluator):
        return exp.budget
    assert exp.budget.seconds is not None
    return replace(exp.budget, seconds=exp.budget.seconds * (1.0 - CONFIRM_SHARE))


def confirmation_seconds(exp: Experiment, evaluator: Evaluator, runs: int) -> float | None:
    """What the confirmation stage of a target with ``runs`` runs may take; None: its own limits only."""
    if not reserves(exp, evaluator):
        return None
    assert exp.budget.seconds is not None
    return exp.budget.seconds * CONFIRM_SHARE * runs


@contextmanager
def confirmation_turn(exp: Experiment, target: Target, evaluator: Evaluator, storage: optuna.storages.BaseStorage,
                      schedule: Schedule, group: int, ended: set[str]) -> Iterator[list[StudyStore] | None]:
    """The studies of ``target`` (group ``group`` of ``schedule``) when this worker is to confirm it, else None.

    It is this worker's turn when every study of the target is finished (ended by this worker, ``ended`` being
    study names, or spent as the study says), the points others are measuring are stored, and no worker has
    confirmed the target at this number of trials. The turn is kept once the block ends, given back if it raises.
    """
    if not evaluator.confirms or exp.oracle_options.confirm.top_k <= 0:
        yield None
        return
    names = schedule.groups[group][1]
    feasible = len(target.space.feasible(target.ctx))
    stores = []
    for name in names:
        store = StudyStore.load(storage, name, target.space)
        if store is None:
            break  # not started yet: whoever runs it confirms
        stores.append(store)
        if name not in ended and not finished(stores[-1].history(), search_budget(exp, evaluator), feasible):
            break  # another worker is at it: the last to finish confirms
    else:
        wait_for_others(schedule.url, names)  # their last points stored, so the count below is final
        with schedule.confirming(group, sum(len(s.history()) for s in stores)) as mine:
            yield stores if mine else None
        return
    yield None


def confirm_target(exp: Experiment, target: Target, evaluator: Evaluator, stores: list[StudyStore],
                   console: Console) -> dict | None:
    """The confirmation stage for one problem and space: its best configurations over ``stores`` (every study of
    the experiment for it), re-timed beside the baselines within the runs' share
    (:func:`confirmation_seconds`); the record is kept in each of those studies."""
    best: dict[str, tuple[float, dict]] = {}
    for store in stores:
        for r in store.history():
            if r.value is not None and (r.key not in best or r.value < best[r.key][0]):
                best[r.key] = (r.value, r.point)
    record = confirm_best(exp, target, evaluator, list(best.values()), target.space.to_storage, console,
                          confirmation_seconds(exp, evaluator, len(stores)))
    for store in stores if record is not None else []:
        store.study.set_user_attr("confirmation", record)
    return record


def confirm_best(exp: Experiment, target: Target, evaluator: Evaluator, measured: list[tuple[float, dict]],
                 config_form: Callable[[dict], Any], console: Console, seconds: float | None = None) -> dict | None:
    """Confirm the fastest of ``measured`` (search time, point) on ``evaluator``: the ``confirm.top_k`` fastest
    and the others within ``confirm.screen`` of the fastest (at most ``confirm.screen_max``), raced down to
    ``top_k``, within ``seconds`` when given. The record, dated, its configurations written by ``config_form``,
    its warnings printed; None when off."""
    top = screened(measured, exp.oracle_options.confirm)
    record = evaluator.confirm([p for _, p in top], target.problem, [t for t, _ in top], seconds=seconds)
    if record is None:
        return None
    record["configs"] = {k: config_form(p) for k, p in record.get("configs", {}).items()}
    record["date"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    if exp.oracle == "gpu":
        record["flush"] = exp.oracle_options.timing.flush  # the L2 flush before each of its samples
    if "error" in record:
        console.print(f"  [yellow]confirmation of {target.problem.key} failed:[/] {record['error']}")
    for warning in record.get("warnings", []):
        console.print(f"  [yellow]{target.problem.key}:[/] {warning}")
    return record


def screened(measured: list[tuple[float, Any]], opts: ConfirmOptions) -> list[tuple[float, Any]]:
    """The candidates of the confirmation stage, fastest first: the ``top_k`` fastest of ``measured``
    (search time, point) and every other within ``screen`` of the fastest, ``screen_max`` at most."""
    ranked = sorted(measured, key=lambda t: t[0])
    if not ranked or opts.top_k <= 0:
        return []
    near = [t for t in ranked if t[0] <= ranked[0][0] * (1.0 + opts.screen)]
    return ranked[:max(opts.top_k, min(len(near), opts.screen_max))]

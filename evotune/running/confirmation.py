"""The confirmation stage of a target, run by one worker once the target's studies are finished.

After a search, the fastest configurations of a target (over every strategy and
seed) are re-timed beside the baselines in interleaved rounds
(:mod:`evotune.measurement.retiming` does the rounds, in the measuring worker).
With several workers, the one that finishes the target's last study confirms
it, after the points other workers are still measuring are stored, and only
once for a given number of trials (see :class:`evotune.running.schedule.Schedule`).

Its time comes out of the runs' ``budget.seconds``: on an oracle whose clock is
the wall clock (not replay), each run of a target searches for
``1 - CONFIRM_SHARE`` of its seconds (:func:`search_budget`), and the stage's
rounds get the rest, ``CONFIRM_SHARE`` of the seconds of all the target's runs
(:func:`confirmation_seconds`). So the stage always runs, and a target takes
no more than its runs' seconds in all.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import optuna
from rich.console import Console

from evotune.core.budget import Budget
from evotune.core.problem import Problem
from evotune.core.space import Point
from evotune.measurement.base import Evaluator
from evotune.measurement.options import ConfirmOptions
from evotune.running.experiment import OracleKind
from evotune.running.schedule import Schedule
from evotune.running.study_progress import finished
from evotune.running.targets import Target
from evotune.storage.claims import wait_for_others
from evotune.storage.study import StudyStore

CONFIRM_SHARE = 0.2  # of a run's seconds, held back for its target's confirmation stage


def reserves(budget: Budget, opts: ConfirmOptions, evaluator: Evaluator) -> bool:
    """Whether runs with ``budget`` on ``evaluator`` hold time back for a confirmation stage: it confirms, the stage
    is on (``opts``), the budget has seconds and the clock is the wall clock (not replay's recorded costs)."""
    return (evaluator.confirms and opts.top_k > 0 and budget.seconds is not None
            and evaluator.kind != OracleKind.REPLAY)


def search_budget(budget: Budget, opts: ConfirmOptions, evaluator: Evaluator) -> Budget:
    """The budget each run's search gets: ``budget`` less the confirmation's share of its seconds."""
    if not reserves(budget, opts, evaluator):
        return budget
    assert budget.seconds is not None
    return replace(budget, seconds=budget.seconds * (1.0 - CONFIRM_SHARE))


def confirmation_seconds(budget: Budget, opts: ConfirmOptions, evaluator: Evaluator, runs: int) -> float | None:
    """What the confirmation stage of a target with ``runs`` runs of ``budget`` may take; None: its own limits
    only."""
    if not reserves(budget, opts, evaluator):
        return None
    assert budget.seconds is not None
    return budget.seconds * CONFIRM_SHARE * runs


@contextmanager
def confirmation_turn(target: Target, evaluator: Evaluator, storage: optuna.storages.BaseStorage,
                      schedule: Schedule, group: int, ended: set[str], budget: Budget,
                      opts: ConfirmOptions) -> Iterator[list[StudyStore] | None]:
    """The studies of ``target`` (group ``group`` of ``schedule``) when this worker is to confirm it, else None.

    It is this worker's turn when every study of the target is finished (ended by this worker, ``ended`` being
    study names, or spent as the study says), the points others are measuring are stored, and no worker has
    confirmed the target at this number of trials (the studies' ``budget`` and the stage's ``opts`` as the run
    has them). The turn is kept once the block ends, given back if it raises.
    """
    if not evaluator.confirms or opts.top_k <= 0:
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
        if name not in ended and not finished(stores[-1].history(), search_budget(budget, opts, evaluator), feasible):
            break  # another worker is at it: the last to finish confirms
    else:
        wait_for_others(schedule.url, names)  # their last points stored, so the count below is final
        with schedule.confirming(group, sum(len(s.history()) for s in stores)) as mine:
            yield stores if mine else None
        return
    yield None


@dataclass(frozen=True)
class ConfirmationRecord:
    """A confirmation stage's record, as each study of its target keeps it (its ``confirmation`` attribute,
    :meth:`to_attr`): what the evaluator timed, its configurations as the caller writes them, when, and after
    which L2 flush."""

    #: the evaluator's record (:meth:`evotune.measurement.base.Evaluator.confirm`): ``items`` and ``raced_out``
    #: (key -> median and interval), ``rounds``, ``warnings``, ``configs`` (key -> point), ``baselines``...; or
    #: ``{"error": why}``
    timed: Mapping[str, Any]
    configs: dict[str, Any]  # point key -> its configuration, written by the caller's form (``timed`` has points)
    date: str  # UTC, ISO 8601 to the second
    flush: str | None = None  # the L2 flush before each of its samples (a GPU's)

    @property
    def error(self) -> str | None:
        """Why the stage failed, or None."""
        return str(self.timed["error"]) if "error" in self.timed else None

    @property
    def warnings(self) -> list[str]:
        return [str(w) for w in self.timed.get("warnings", [])]

    def to_attr(self) -> dict[str, Any]:
        """The record as a study attribute: the evaluator's, its ``configs`` in their written form, then ``date``
        and (when there is one) ``flush``."""
        out = {**self.timed, "configs": self.configs, "date": self.date}
        if self.flush is not None:
            out["flush"] = self.flush
        return out


def confirm_best(problem: Problem, evaluator: Evaluator, measured: list[tuple[float, Point]],
                 config_form: Callable[[Point], Any], console: Console, opts: ConfirmOptions,
                 seconds: float | None = None, flush: str | None = None) -> ConfirmationRecord | None:
    """Confirm the fastest of ``measured`` (search time, point) on ``evaluator``: the ``confirm.top_k`` fastest
    and the others within ``confirm.screen`` of the fastest (at most ``confirm.screen_max``), raced down to
    ``top_k``, within ``seconds`` when given. The record, dated, naming the L2 ``flush`` of its samples when
    given (a GPU's), its configurations written by ``config_form``, its warnings printed; None when off."""
    top = screened(measured, opts)
    timed = evaluator.confirm([p for _, p in top], problem, [t for t, _ in top], seconds=seconds)
    if timed is None:
        return None
    points: dict[str, Point] = timed.get("configs", {})
    record = ConfirmationRecord(timed, {k: config_form(p) for k, p in points.items()},
                                _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), flush)
    if record.error is not None:
        console.print(f"  [yellow]confirmation of {problem.key} failed:[/] {record.error}")
    for warning in record.warnings:
        console.print(f"  [yellow]{problem.key}:[/] {warning}")
    return record


def screened(measured: list[tuple[float, Any]], opts: ConfirmOptions) -> list[tuple[float, Any]]:
    """The candidates of the confirmation stage, fastest first: the ``top_k`` fastest of ``measured``
    (search time, point) and every other within ``screen`` of the fastest, ``screen_max`` at most."""
    ranked = sorted(measured, key=lambda t: t[0])
    if not ranked or opts.top_k <= 0:
        return []
    near = [t for t in ranked if t[0] <= ranked[0][0] * (1.0 + opts.screen)]
    return ranked[:max(opts.top_k, min(len(near), opts.screen_max))]

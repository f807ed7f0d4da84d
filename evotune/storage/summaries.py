"""The studies of a storage, listed: each one's name, attributes, trial count and (when asked) fastest trial, read
without copying every trial (``best``, ``plot``, the report, transfer sources and the autotune cache list studies
through it)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import optuna
from optuna.trial import TrialState

from evotune.storage.study import make_storage


@dataclass(frozen=True)
class StudySummary:
    """What evotune reads of a study's summary: optuna's StudySummary fields that it uses. Its trial count is read
    when first asked for: a storage counts a study's trials by loading every one of them, and most readers
    (transfer sources, the autotune cache's listing) look at the attributes of every study but count few."""

    study_name: str
    user_attrs: dict[str, Any]
    count: Callable[[], int] = field(repr=False, compare=False)
    best_trial: optuna.trial.FrozenTrial | None = None  # with ``best``: its fastest complete trial

    @functools.cached_property
    def n_trials(self) -> int:
        return self.count()


def study_summaries(storage: optuna.storages.BaseStorage, best: bool = False) -> list[StudySummary]:
    """Every study of ``storage`` in storage order, as optuna.get_all_study_summaries lists them, without that
    function's deep copy of every trial of every study: the copy was most of the time a run spent finding its
    sources and writing its report and plots (seconds for the quickstart's 1,800 trials, again at a resume)."""
    out = []
    for s in storage.get_all_studies():
        study_id = storage.get_study_id_from_name(s.study_name)
        best_trial = None
        if best and len(s.directions) == 1:  # as optuna: a multi-objective study has no best trial
            done = storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,))
            if done:
                pick = max if s.direction == optuna.study.StudyDirection.MAXIMIZE else min
                best_trial = pick(done, key=lambda t: cast(float, t.value))  # a complete trial has a value
        out.append(StudySummary(s.study_name, s.user_attrs, functools.partial(storage.get_n_trials, study_id),
                                best_trial))
    return out


def finished_trials(storage: optuna.storages.BaseStorage, name: str) -> tuple[optuna.trial.FrozenTrial, ...]:
    """Study ``name``'s complete and failed trials (what a later search learns from: its transfer sources, the
    configurations built for it), without copying them."""
    return tuple(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False,
                                        states=(TrialState.COMPLETE, TrialState.FAIL)))


def study_names(storage: str | optuna.storages.BaseStorage) -> list[str]:
    st = make_storage(storage) if isinstance(storage, str) else storage
    return [s.study_name for s in st.get_all_studies()]

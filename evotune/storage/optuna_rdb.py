"""Finished trials written into an Optuna storage: straight into Optuna's RDB tables where that is known to be safe.

:func:`write_trials` is the one way evotune stores trials. On an RDB storage (sqlite, PostgreSQL, MySQL) it writes
each batch as one transaction of a few statements: the trials' rows, their parameters, values and user attributes,
each table in one multi-row insert. Optuna's own ``create_new_trial`` issues several queries per parameter and per
attribute (about 47 statements for a trial of six parameters and nine attributes). The rows written are the same,
in Optuna's own tables, so every reader of the study sees an ordinary trial.

Those tables are described only by Optuna's private ``optuna.storages._rdb.models``, which may change in any
release. This module is the one place in evotune that reads it, and only when the installed Optuna's version is one
it was checked against (:data:`VERIFIED`, decided once at import as :data:`FAST_WRITES`). With any other version,
and on every other storage (a journal file, in memory), each trial goes through Optuna's public
``storage.create_new_trial(study_id, template_trial=trial)``: slower, the same trials.

Example::

    numbers = write_trials(storage, study_id, [store.trial(point, result, clock_s=1.5)])
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.trial import FrozenTrial

# Optuna releases (major, minor) whose RDB tables the fast write was tested against, those setup.cfg allows (.ci/run
# tests the oldest and the newest); a patch release keeps its minor's tables.
VERIFIED = frozenset({(4, 6), (4, 7), (4, 8), (4, 9), (5, 0)})


def verified(version: str) -> bool:
    """Whether Optuna ``version`` (``"4.6.1"``, ``"5.0.0.dev0"``) is a release in :data:`VERIFIED`."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) in VERIFIED
    except (IndexError, ValueError):
        return False


FAST_WRITES = verified(optuna.__version__)  # the installed Optuna's tables are written directly


def write_trials(storage: optuna.storages.BaseStorage, study_id: int, trials: list[FrozenTrial]) -> list[int]:
    """Store the finished ``trials`` into study ``study_id`` of ``storage``, in order; their numbers."""
    if FAST_WRITES and isinstance(storage, optuna.storages.RDBStorage):
        return _insert_trials(storage, study_id, trials)
    # Study.add_trial does not say which number a trial got; the storage's own call does
    return [storage.get_trial_number_from_id(storage.create_new_trial(study_id, template_trial=t)) for t in trials]


def _insert_trials(storage: optuna.storages.RDBStorage, study_id: int, trials: list[FrozenTrial]) -> list[int]:
    """Write the finished ``trials`` into study ``study_id`` of ``storage`` in one transaction; their numbers.

    A trial's number is the count of the study's trials before it, as Optuna counts it, under the lock
    Optuna takes: on sqlite the database's write lock (the transaction's first statement writes, so it
    waits for the lock before it reads anything), elsewhere the study's row ``FOR UPDATE``.
    """
    from optuna.distributions import distribution_to_json

    sql = _statements()
    params: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    attrs: list[dict[str, Any]] = []
    with storage.engine.begin() as conn:
        if conn.dialect.name != "sqlite":
            conn.execute(sql.lock_study, {"s": study_id})
        ids = []
        for trial in trials:
            inserted = conn.execute(sql.trial, {
                "number": None, "study_id": study_id, "state": trial.state,
                "datetime_start": _utc(trial.datetime_start),
                "datetime_complete": _utc(trial.datetime_complete)}).inserted_primary_key
            assert inserted is not None
            trial_id = inserted[0]
            ids.append(trial_id)
            params += [{"trial_id": trial_id, "param_name": name, "distribution_json": distribution_to_json(dist),
                        "param_value": dist.to_internal_repr(trial.params[name])}
                       for name, dist in trial.distributions.items()]
            for objective, v in enumerate(trial.values or []):
                stored, kind = sql.value_repr(v)
                values.append({"trial_id": trial_id, "objective": objective, "value": stored, "value_type": kind})
            attrs += [{"trial_id": trial_id, "key": k, "value_json": json.dumps(v)}
                      for k, v in trial.user_attrs.items()]
        # under the lock the study's new trials are these, in order of their ids
        first = conn.execute(sql.count, {"s": study_id, "t": ids[0]}).scalar_one()
        numbers = [first + i for i in range(len(ids))]
        conn.execute(sql.number, [{"t": t, "n": n} for t, n in zip(ids, numbers, strict=True)])
        for statement, rows in ((sql.params, params), (sql.values, values), (sql.attrs, attrs)):
            if rows:
                conn.execute(statement, rows)
    return numbers


@functools.cache
def _statements() -> Any:
    """The statements of :func:`_insert_trials` on Optuna's tables, built once (SQLAlchemy then compiles each
    once per database and reuses it)."""
    import sqlalchemy as sa
    from optuna.storages._rdb import models

    trials, studies = models.TrialModel.__table__, models.StudyModel.__table__
    return SimpleNamespace(
        lock_study=sa.select(studies.c.study_id).where(studies.c.study_id == sa.bindparam("s")).with_for_update(),
        trial=sa.insert(trials),
        count=sa.select(sa.func.count(trials.c.trial_id)).where(trials.c.study_id == sa.bindparam("s"),
                                                               trials.c.trial_id < sa.bindparam("t")),
        number=sa.update(trials).where(trials.c.trial_id == sa.bindparam("t")).values(number=sa.bindparam("n")),
        params=sa.insert(models.TrialParamModel.__table__),
        values=sa.insert(models.TrialValueModel.__table__),
        attrs=sa.insert(models.TrialUserAttributeModel.__table__),
        value_repr=models.TrialValueModel.value_to_stored_repr,
    )


def _utc(when: _dt.datetime | None) -> _dt.datetime | None:
    """Optuna keeps an RDB trial's times as naive UTC (a naive time is local, as Optuna reads it)."""
    return None if when is None else when.astimezone(_dt.UTC).replace(tzinfo=None)

"""Trials are written cheaply (one transaction of a few statements) and behind the loop, without losing a
guarantee: a queued trial's claim stays held until the trial is stored."""

from __future__ import annotations

import datetime as _dt
import sqlite3
import threading

import optuna
import pytest
from conftest import PNPOLY

from evotune.core.landscape import load_landscape
from evotune.core.result import EvalResult, Status
from evotune.storage.claims import Claim, RdbClaims
from evotune.storage.study import StudyStore, make_storage
from evotune.storage.trial_writer import TrialWriter

OTHER = "another-host:1:0"  # a live worker elsewhere: only its lease could free its claims


@pytest.fixture
def space():
    return load_landscape(PNPOLY).space()


def results():
    ok = EvalResult(Status.OK, time_ms=1.25, samples_ms=[1.2, 1.25, 1.3], compile_s=0.5, bench_s=0.1, error=1e-7,
                    extra={"ci95_ms": [1.2, 1.3], "graph": True})
    failed = EvalResult(Status.COMPILE_ERROR, compile_s=0.2, message="too many registers")
    return ok, failed


def test_a_trial_is_one_transaction_of_a_few_statements_and_reads_back_as_optunas_own(tmp_path, space):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'x.db'}"
    storage = make_storage(url)
    ours, optunas = StudyStore.open(storage, "ours", space), StudyStore.open(storage, "optunas", space)
    points = [dict(zip(space.names, k, strict=True)) for k in list(load_landscape(PNPOLY).entries)[:3]]
    began = _dt.datetime(2026, 1, 2, 3, 4, 5, 678000)
    statements = []
    sa.event.listen(storage.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    for point, result in zip(points, results() + results()[:1], strict=True):
        trial = ours.trial(point, result, clock_s=2.5, started=began, wall_s=0.75)
        statements.clear()
        number = ours.write(trial)
        assert len(statements) <= 7, statements  # Optuna's create_new_trial: about 47 for such a trial
        assert number == optunas.storage.get_trial_number_from_id(
            optunas.storage.create_new_trial(optunas.study_id, template_trial=trial))
    optunas.study.add_trial(optunas.trial(points[0], results()[0], clock_s=0.0))  # numbers go on after Optuna's own
    assert ours.write_all([ours.trial(p, results()[0], clock_s=0.0) for p in points[:2]]) == [3, 4]
    mine, theirs = ours.study.get_trials(), optunas.study.get_trials()
    for a, b in zip(mine[:3], theirs[:3], strict=True):
        assert (a.number, a.state, a.value, a.params, a.distributions, a.user_attrs) == \
               (b.number, b.state, b.value, b.params, b.distributions, b.user_attrs)
        assert a.datetime_start == b.datetime_start == began
        assert a.datetime_complete == b.datetime_complete == began + _dt.timedelta(seconds=0.75)
    assert [r.number for r in ours.history()] == [0, 1, 2, 3, 4]
    assert mine[1].state == optuna.trial.TrialState.FAIL and mine[1].user_attrs["message"] == "too many registers"
    with sqlite3.connect(tmp_path / "x.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class SlowStore:
    """A study store whose writes wait for ``go``, or fail with ``error``."""

    def __init__(self, store: StudyStore, error: Exception | None = None):
        self.store, self.error, self.go = store, error, threading.Event()

    def write_all(self, trials):
        assert self.go.wait(600)
        if self.error is not None:
            raise self.error
        return self.store.write_all(trials)


def test_a_queued_trial_keeps_its_claim_until_it_is_stored(tmp_path, space):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = StudyStore.open(url, "s", space)
    mine, other = RdbClaims(url, "s", lease_s=600), RdbClaims(url, "s", lease_s=600, owner=OTHER)
    point = dict(zip(space.names, next(iter(load_landscape(PNPOLY).entries)), strict=True))
    key = space.key(point)
    assert mine.claim(key, budget=1) is Claim.NEW
    slow, stored = SlowStore(store), []
    writer = TrialWriter(slow, mine, on_stored=stored.append)
    writer.put(key, store.trial(point, results()[0], clock_s=1.0))  # returns while the write waits
    assert writer.pending == 1 and store.history() == []
    assert other.claim(key) is Claim.TAKEN  # held by a live worker: nobody else measures it
    assert other.claim("another point", budget=1) is Claim.FULL  # and it counts against the budget
    slow.go.set()
    writer.close()
    assert [r.key for r in store.history()] == [key] and stored == [1]
    assert other.claim(key) is Claim.TAKEN and other.room(2) == 1  # done now: counted once, never measured again
    assert writer.busy_s > 0 and writer.pending == 0


def test_a_failed_write_stops_the_writer_and_is_raised_in_the_loop(tmp_path, space):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = StudyStore.open(url, "s", space)
    mine, other = RdbClaims(url, "s", lease_s=600), RdbClaims(url, "s", lease_s=600, owner=OTHER)
    points = [dict(zip(space.names, k, strict=True)) for k in list(load_landscape(PNPOLY).entries)[:2]]
    slow = SlowStore(store, error=OSError("disk full"))
    writer = TrialWriter(slow, mine)
    for p in points:
        assert mine.claim(space.key(p)) is Claim.NEW
        writer.put(space.key(p), store.trial(p, results()[0], clock_s=1.0))
    slow.go.set()
    with pytest.raises(RuntimeError, match="disk full"):
        writer.close()
    assert store.history() == []
    # the claims stay held, not done: they lapse with the process, and the points are measured again
    assert other.active() == {space.key(p) for p in points} and other.room(3) == 1


def test_the_fast_write_and_optunas_public_call_store_the_same_trials(tmp_path, space, monkeypatch):
    import sqlalchemy as sa

    from evotune.storage import optuna_rdb

    assert optuna_rdb.FAST_WRITES, f"Optuna {optuna.__version__} is not among the versions checked: add it to VERIFIED"
    storage = make_storage(f"sqlite:///{tmp_path / 'x.db'}")
    points = [dict(zip(space.names, k, strict=True)) for k in list(load_landscape(PNPOLY).entries)[:3]]
    began = _dt.datetime(2026, 1, 2, 3, 4, 5, 678000)
    statements: list[str] = []
    sa.event.listen(storage.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    stored = {}
    for fast in (True, False):
        monkeypatch.setattr(optuna_rdb, "FAST_WRITES", fast)
        store = StudyStore.open(storage, f"fast={fast}", space)
        trials = [store.trial(p, r, clock_s=2.5, started=began, wall_s=0.75)
                  for p, r in zip(points, results() + results()[:1], strict=True)]
        statements.clear()
        assert store.write(trials[0]) == 0 and store.write_all(trials[1:]) == [1, 2]
        # the fast path: one transaction of a few statements per call; Optuna's: dozens per trial
        assert (len(statements) <= 14) is fast, len(statements)
        stored[fast] = [(t.number, t.state, t.value, t.params, t.distributions, t.user_attrs, t.datetime_start,
                         t.datetime_complete) for t in store.study.get_trials()]
    assert stored[True] == stored[False] and len(stored[True]) == 3
    assert stored[True][0][6] == began and stored[True][1][1] == optuna.trial.TrialState.FAIL


def test_only_the_optuna_versions_checked_get_the_fast_write():
    from evotune.storage.optuna_rdb import verified

    assert verified("4.6.0") and verified("4.9.1") and verified("5.0.0") and verified("5.0.0.dev0")
    assert not verified("4.5.0") and not verified("5.1.0") and not verified("6.0.0") and not verified("nightly")

"""SIGKILL ``python -m evotune run`` at random moments, again and again: resuming loses and repeats nothing.

A replay experiment (the pnpoly landscape, the GA) runs as a subprocess and is killed
with SIGKILL at seeded random moments, each once it has made progress, then run once
more to its end. After each kill the storage must open cleanly, every trial stored
before must still be there unchanged, no point may be stored twice and no trial may be
RUNNING; at the end the study holds exactly the budget.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import optuna
import pytest
from conftest import ROOT, replay_experiment
from optuna.trial import TrialState

from evotune.study import make_storage, study_names

KILLS = 10
BUDGET = 300
SEED = 20240611
FIRST_RATE = {"sqlite": 150.0, "journal": 150.0}  # trials/s before any round has been measured


def write_experiment(tmp_path: Path, url: str) -> Path:
    return replay_experiment(tmp_path / "exp.toml", name="kill", url=url, trials=BUDGET, seed=1,
                             options="population = 12, offspring = 12",
                             extra=f'[outputs]\nplots = "{tmp_path / "plots"}"\nbest = "{tmp_path / "best.json"}"\n')


def snapshot(url: str) -> set[tuple[int, str, float | None, str]]:
    """(number, key, value, state) of every trial; fails on a storage that does not open or a RUNNING trial."""
    storage = make_storage(url)
    names = study_names(storage)
    if not names:
        return set()
    assert len(names) == 1, names
    study = optuna.load_study(study_name=names[0], storage=storage)
    out = set()
    for t in study.get_trials(deepcopy=False):
        assert t.state in (TrialState.COMPLETE, TrialState.FAIL), f"trial {t.number} is {t.state.name}"
        out.add((t.number, t.user_attrs["key"], t.value, t.state.name))
    if isinstance(storage, optuna.storages.RDBStorage):
        storage.engine.dispose()
    return out


def stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def written(path: Path, kind: str) -> tuple[int, int] | int:
    """What changes once the run stores a trial: a journal file's size and time (the journal holds nothing
    else), an sqlite file's count of trials (its claims, in the same file, are written before; and commits
    go to the write-ahead log beside it first)."""
    if kind == "journal":
        return stamp(path)
    if not path.exists():
        return 0
    with closing(sqlite3.connect(path, timeout=60)) as db:
        try:
            return db.execute("SELECT count(*) FROM trials").fetchone()[0]
        except sqlite3.OperationalError:  # no tables yet
            return 0


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path, kind):
    store = tmp_path / ("x.db" if kind == "sqlite" else "x.journal")
    url = f"sqlite:///{store}" if kind == "sqlite" else f"journal:{store}"
    exp = write_experiment(tmp_path, url)
    cmd = [sys.executable, "-m", "evotune", "run", str(exp), "--no-progress", "--no-plots"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rng = random.Random(f"{SEED}-{kind}")
    seen: set[tuple] = set()
    kills = rounds = stale_locks = 0
    rate = FIRST_RATE[kind]  # trials per second once the run is writing; re-estimated every round
    lock = Path(f"{store}.lock")
    while kills < KILLS:
        rounds += 1
        assert rounds <= 3 * KILLS, f"only {kills} kills with progress in {rounds - 1} rounds"
        log = (tmp_path / f"run{rounds}.log").open("w")
        before = written(store, kind)
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while written(store, kind) == before and proc.poll() is None:  # wait for the run to store a trial
            assert time.monotonic() < deadline, "the run wrote nothing for 60 s"
            time.sleep(0.005)
        # A random moment, sized so that the kills leave about half of what remains for the runs after
        target = max(1.0, (BUDGET - len(seen)) / (KILLS - kills + 1))
        delay = rng.uniform(0.0, 2.0 * target / rate)
        writing = time.monotonic()
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        code = proc.wait()
        alive = time.monotonic() - writing
        log.close()
        assert code in (0, -signal.SIGKILL), (tmp_path / f"run{rounds}.log").read_text()[-3000:]
        if kind == "journal" and lock.is_symlink():  # Optuna's lock, left by the killed writer
            stale_locks += 1
            lock.unlink()  # else the next run waits 30 s for Optuna's grace period
        if kind == "sqlite":
            with sqlite3.connect(store) as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        now = snapshot(url)
        lost = seen - now
        assert not lost, f"round {rounds}: trials lost after a kill: {sorted(lost)[:5]}"
        gained = len(now) - len(seen)
        if gained > 0 and alive > 0:
            rate = 0.5 * rate + 0.5 * gained / alive
        if code == 0:
            pytest.fail(f"the run finished by itself after {kills} kills; kill sooner")
        if gained > 0:
            kills += 1  # a kill after progress
        seen = now

    final = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert final.returncode == 0, final.stderr[-3000:]
    trials = snapshot(url)
    lost = seen - trials
    keys = [key for _, key, _, _ in trials]
    duplicates = len(keys) - len(set(keys))
    print(f"\n{kind}: kills: {kills} (rounds {rounds}), trials lost: {len(lost)}, duplicates: {duplicates}, "
          f"trials: {len(trials)}, stale journal locks: {stale_locks}")
    assert not lost and duplicates == 0
    assert len(trials) == BUDGET
    assert sorted(n for n, *_ in trials) == list(range(BUDGET))
    assert stale_locks == 0, (
        f"{stale_locks} of {kills} kills left Optuna's journal lock ({lock.name}) behind; the next run waits "
        "30 s before breaking it (evotune/study.py make_storage: use a lock the kernel releases, e.g. flock)")

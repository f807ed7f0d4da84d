"""SIGKILL ``python -m evotune run`` at random moments, again and again: resuming loses and repeats nothing.

A CPU experiment (the GA on ``tests/spaces/gated.py``) runs as a subprocess and is
killed with SIGKILL, with its worker, again and again; then it runs once more to its
end. The gated space builds a point only for a token file the test puts down, so a run
cannot store more trials than it was given tokens, whatever the machine's speed: each
round gives a few tokens more than the seeded random number of new trials it waits to
see stored, and kills the run as soon as they are there, while it is still measuring
or writing the next ones. After each kill the storage must open cleanly, every trial
stored before must still be there unchanged, no point may be stored twice and no trial
may be RUNNING; at the end the study holds exactly the budget.
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
from conftest import ROOT
from optuna.trial import TrialState

from evotune.storage.study import make_storage
from evotune.storage.summaries import study_names

pytestmark = pytest.mark.slow  # ten killed runs and their resumes

KILLS = 10
BUDGET = 120
EXTRA = 3  # tokens a round gives beyond the trials it waits for: what the run is busy with when killed
SEED = 20240611
GATED = ROOT / "tests" / "spaces" / "gated.py"


def write_experiment(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f"""
name = "kill"
space = "{GATED}"
[oracle]
kind = "cpu"
timeout_s = 3600  # a build waits for its token as long as the test takes to give it
[[problem]]
m = 8
n = 8
k = 8
dtype = "fp32"
[strategy]
name = "ga"
seed = 1
options = {{ population = 12, offspring = 12 }}
[budget]
trials = {BUDGET}
[storage]
url = "{url}"
[outputs]
plots = "{tmp_path / "plots"}"
best = "{tmp_path / "best.json"}"
""")
    return path


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


def stored(store: Path, kind: str) -> int:
    """Trials stored so far, read cheaply while the run writes (every trial is added whole)."""
    if not store.exists():  # (sqlite3.connect would create it)
        return 0
    if kind == "journal":
        whole = store.read_bytes().split(b"\n")[:-1]  # a last line without its end is still being written
        return sum(1 for line in whole if line.startswith(b'{"op_code":4,'))  # Optuna's create-trial record
    try:
        # a plain connection (not read-only) reads the write-ahead log too, where the newest commits are
        with closing(sqlite3.connect(store, timeout=60)) as db:
            return db.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    except sqlite3.OperationalError:  # no database or no table yet, or the writer holds the lock
        return 0


def give_tokens(gate: Path, tokens: int, first: int) -> int:
    """Top the gate up to ``tokens`` tokens; returns the next token's number."""
    missing = tokens - len(os.listdir(gate))
    for n in range(first, first + missing):
        (gate / f"{n:06d}").touch()
    return first + max(0, missing)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_sigkill_at_random_moments_loses_and_repeats_nothing(tmp_path, kind):
    store = tmp_path / ("x.db" if kind == "sqlite" else "x.journal")
    url = f"sqlite:///{store}" if kind == "sqlite" else f"journal:{store}"
    exp = write_experiment(tmp_path, url)
    gate = tmp_path / "gate"
    gate.mkdir()
    cmd = [sys.executable, "-m", "evotune", "run", str(exp), "--no-progress", "--no-plots"]
    env = {**os.environ, "EVOTUNE_TEST_GATE": str(gate),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rng = random.Random(f"{SEED}-{kind}")
    seen: set[tuple] = set()
    kills = stale_locks = token = 0
    lock = Path(f"{store}.lock")
    while kills < KILLS:
        # new trials to wait for: the rounds left and the final run share what the budget has left
        share = (BUDGET - EXTRA - 1 - len(seen)) // (KILLS - kills + 1)
        target = len(seen) + rng.randint(1, share)
        token = give_tokens(gate, target - len(seen) + EXTRA, token)
        log_path = tmp_path / f"run{kills + 1}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its group: the run and its CPU worker
            while stored(store, kind) < target and proc.poll() is None:
                time.sleep(0.002)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        assert code == -signal.SIGKILL, f"the run ended by itself ({code}):\n{log_path.read_text()[-3000:]}"
        kills += 1
        if kind == "journal" and lock.is_symlink():  # Optuna's lock, left by the killed writer
            stale_locks += 1
            lock.unlink()  # else the next run waits 30 s for Optuna's grace period
        if kind == "sqlite":
            with sqlite3.connect(store) as db:
                assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        now = snapshot(url)
        lost = seen - now
        assert not lost, f"kill {kills}: trials lost: {sorted(lost)[:5]}"
        assert len(now) >= target, f"kill {kills}: {len(now)} trials stored, {target} seen before the kill"
        assert len(now) < BUDGET
        seen = now

    (gate / "open").touch()
    final = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert final.returncode == 0, final.stderr[-3000:]
    trials = snapshot(url)
    lost = seen - trials
    keys = [key for _, key, _, _ in trials]
    duplicates = len(keys) - len(set(keys))
    print(f"\n{kind}: kills: {kills}, trials before the last run: {len(seen)}, lost: {len(lost)}, "
          f"duplicates: {duplicates}, trials: {len(trials)}, stale journal locks: {stale_locks}")
    assert not lost and duplicates == 0
    assert len(trials) == BUDGET
    assert sorted(n for n, *_ in trials) == list(range(BUDGET))
    assert stale_locks == 0, (
        f"{stale_locks} of {kills} kills left Optuna's journal lock ({lock.name}) behind; the next run waits "
        "30 s before breaking it (evotune/storage/study.py make_storage: use a lock the kernel releases, e.g. flock)")

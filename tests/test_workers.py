"""Several workers on one study: no point measured twice, the counts add up, the GA's generations shared."""

from __future__ import annotations

import os
import subprocess
import sys

import optuna
import pytest
from conftest import ROOT, replay_experiment

from evotune.claims import FileClaims, RdbClaims
from evotune.study import make_storage, study_names

BUDGET = 240
WORKERS = 4


def experiment(tmp_path, url):
    return replay_experiment(tmp_path / "exp.toml", name="shared", url=url, trials=BUDGET, seed=3,
                             options="population = 12, offspring = 12")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_four_workers_share_one_study(tmp_path, kind):
    url = f"journal:{tmp_path / 'x.journal'}" if kind == "journal" else f"sqlite:///{tmp_path / 'x.db'}"
    check_shared_study(tmp_path, url, kind)


def check_shared_study(tmp_path, url, kind):
    """Start WORKERS workers on one study at ``url``; check the counts, duplicates and sharing."""
    exp = experiment(tmp_path, url)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "evotune", "worker", str(exp), "--no-progress"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(WORKERS)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    storage = make_storage(url)
    (name,) = study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    keys = [t.user_attrs["key"] for t in trials]
    measured = [int(line.split(" measured by this worker")[0].rsplit(" ", 1)[1])
                for _, err in outs for line in err.splitlines() if "measured by this worker" in line]
    print(f"\n{kind}: {WORKERS} workers measured {measured}, study holds {len(trials)}, "
          f"duplicates: {len(keys) - len(set(keys))}")
    assert len(keys) == len(set(keys)), "a point was measured twice"
    assert sum(measured) == len(trials)
    assert BUDGET <= len(trials) <= BUDGET + WORKERS - 1  # workers racing for the last slots may overshoot
    assert sum(1 for m in measured if m > 0) >= 2, "the work was not shared"


@pytest.mark.parametrize("kind", ["file", "rdb"])
def test_a_claim_is_exclusive_until_its_owner_dies(tmp_path, kind):
    def make(owner):
        if kind == "file":
            return FileClaims(tmp_path / "c.claims", "s", lease_s=60, owner=owner)
        return RdbClaims(f"sqlite:///{tmp_path / 'c.db'}", "s", lease_s=60, owner=owner)

    me = make(None)
    dead = make(f"{os.uname().nodename}:999999999:0")  # a pid that does not exist on this host
    alive_elsewhere = make("another-host:1:0")
    assert me.claim("a") == "new"
    assert alive_elsewhere.claim("a") == ""  # held by a live worker
    assert alive_elsewhere.claim("b") == "new"
    assert me.claim("b") == ""  # a live worker on another host: only its lease can free it
    assert dead.claim("c") == "new"
    assert me.claim("c") == "takeover"  # its owner is a dead process of this host
    assert me.active() == {"b"}


def test_a_claim_after_a_torn_line_is_still_seen(tmp_path):
    path = tmp_path / "c.claims"
    first = FileClaims(path, "s", lease_s=60, owner="another-host:1:0")
    assert first.claim("a") == "new"
    with path.open("a") as f:
        f.write('{"study": "s", "key": "dead-wri')  # a writer killed inside its write
    assert first.claim("b") == "new"
    fresh = FileClaims(path, "s", lease_s=60)
    assert fresh.claim("b") == ""  # the claim after the torn line is read, not lost in a glued line
    assert fresh.claim("a") == ""

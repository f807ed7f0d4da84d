"""Several workers on one study: no point measured twice, the counts add up, the GA's generations shared."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict

import optuna
import pytest
from conftest import ROOT, int8_landscapes, landscape_excerpt, replay_experiment

from evotune.storage.claims import Claim, FileClaims, NoClaims, RdbClaims
from evotune.storage.study import make_storage
from evotune.storage.summaries import study_names

pytestmark = pytest.mark.slow  # several worker processes on one study

BUDGET = 960  # several seconds of one worker's replay: the others start before it could take every point
WORKERS = 4


def experiment(tmp_path, url):
    return replay_experiment(tmp_path / "exp.toml", name="shared", url=url, trials=BUDGET, seed=3,
                             options="population = 12, offspring = 12")


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_four_workers_share_one_study(tmp_path, kind):
    url = f"journal:{tmp_path / 'x.journal'}" if kind == "journal" else f"sqlite:///{tmp_path / 'x.db'}"
    check_shared_study(tmp_path, url, kind)


def run_workers(tmp_path, exp, workers: int = WORKERS, *args: str, command: str = "worker") -> list[tuple[str, str]]:
    """Run ``workers`` processes of ``evotune worker`` (or ``command``) on ``exp`` to the end, each with ``args``
    (``{i}`` in them is the worker's number); their (stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "evotune", command, str(exp)] + (["--no-progress"] if command == "worker" else [])
    procs = [subprocess.Popen(cmd + [a.format(i=i) for a in args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(workers)]
    outs = [p.communicate(timeout=1800) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    return outs


def check_shared_study(tmp_path, url, kind):
    """Start WORKERS workers on one study at ``url``; check the counts, duplicates and sharing."""
    outs = run_workers(tmp_path, experiment(tmp_path, url))
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
    assert len(trials) == BUDGET
    assert sum(1 for m in measured if m > 0) >= 2, "the work was not shared"


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_workers_racing_for_the_last_slots_stop_at_the_budget(tmp_path, kind):
    """Many small studies, so that four workers reach the end of a budget together many times over:
    every study ends with exactly its budget of trials, none measured twice. The strategy's ask takes some
    milliseconds (a GP's), as on a real run, so that counting and claiming are far enough apart to race."""
    url = f"journal:{tmp_path / 'x.journal'}" if kind == "journal" else f"sqlite:///{tmp_path / 'x.db'}"
    studies, budget = 8, 12
    exp = replay_experiment(tmp_path / "exp.toml", name="race", url=url, trials=budget, strategy="default",
                            repeats=studies, options="startup = 2")
    run_workers(tmp_path, exp, WORKERS, "--split", "points")  # every worker on every study: they race
    assert len(check_exact(url, budget)) == studies


def measured_per_study(outs: list[tuple[str, str]]) -> dict[str, list[int]]:
    """Each study's points as each worker says it measured them (workers that did not run it left out)."""
    per = defaultdict(list)
    for _, err in outs:
        for name, n in re.findall(r"^\s*(\S+): (\d+) measured by this worker", err, re.M):
            per[name].append(int(n))
    return per


def check_exact(url: str, budget: int) -> dict[str, int]:
    """Every study of ``url`` holds ``budget`` trials, none of a point measured twice; their counts by study."""
    storage = make_storage(url)
    counts = {}
    for name in study_names(storage):
        keys = [t.user_attrs["key"] for t in optuna.load_study(study_name=name, storage=storage).get_trials()]
        assert len(keys) == len(set(keys)), f"{name}: a point was measured twice"
        counts[name] = len(keys)
    assert set(counts.values()) == {budget}, counts
    return counts


@pytest.mark.parametrize("split", ["problems", "points"])
def test_workers_take_whole_problems_and_share_the_last(tmp_path, split):
    """Four problems, two workers: with split = problems each problem's fixed cost is paid by one worker (two
    at the end, where the last problem is shared); with split = points by both, every time."""
    problems, workers, budget = 4, 2, 30
    url = f"sqlite:///{tmp_path / 'x.db'}"
    exp = replay_experiment(tmp_path / "exp.toml", name="whole", url=url, trials=budget,
                            options="population = 8, offspring = 8", landscapes=tuple(int8_landscapes(problems)))
    outs = run_workers(tmp_path, exp, workers, "--split", split, "--costs", "costs/{i}.json")  # --costs makes costs/
    counts = check_exact(url, budget)
    per = measured_per_study(outs)
    assert set(per) == set(counts) and all(sum(per[name]) == budget for name in counts)
    costs = [json.loads((tmp_path / "costs" / f"{i}.json").read_text()) for i in range(workers)]
    taken_up = sum(len(c["problems_s"]) for c in costs)  # each time a worker took up a problem
    assert sum(c["evals"] for c in costs) == problems * budget
    assert all(c["model"]["per_eval_s"] > 0 and c["wall_s"] > 0 for c in costs if c["evals"])
    if split == "points":
        assert taken_up == problems * workers
    else:
        # a worker joins another's problem only once it has none of its own left: at most the last ones
        alone = sum(1 for name in counts if sorted(per[name])[:-1] in ([], [0]))
        assert alone >= problems - workers and taken_up <= problems + workers * (workers - 1)


def test_record_is_split_across_workers(tmp_path):
    """Two recording processes on three small landscapes: every point recorded once, every file complete."""
    sources = [landscape_excerpt(src, tmp_path / "src" / src.name, 40) for src in int8_landscapes(3)]
    url = f"sqlite:///{tmp_path / 'x.db'}"
    exp = replay_experiment(tmp_path / "exp.toml", name="rec", url=url, trials=10, landscapes=tuple(sources))
    outs = run_workers(tmp_path, exp, 2, "--out", "out", command="record")
    check_exact(f"sqlite:///{tmp_path / 'x_record.db'}", 40)
    new = defaultdict(int)
    for _, err in outs:
        pattern = r"^\s*(\S+): 40 of 40 feasible points recorded \((\d+) new by this worker"
        for name, n in re.findall(pattern, err, re.M):
            new[name] += int(n)
    assert len(new) == 3 and set(new.values()) == {40}, new  # each point measured by one of the two
    from evotune.core.landscape import load_landscape

    for src in sources:
        (written,) = (tmp_path / "out").glob(f"*{load_landscape(src).problem.key}*")
        recorded, source = load_landscape(written), load_landscape(src)
        assert recorded.meta["complete"] and set(recorded.entries) == set(source.entries)


def claims_of(kind: str, tmp_path, owner):
    """Claims of study "s" in a journal's claims file or an sqlite table, as worker ``owner``."""
    if kind == "file":
        return FileClaims(tmp_path / "c.claims", "s", lease_s=60, owner=owner)
    return RdbClaims(f"sqlite:///{tmp_path / 'c.db'}", "s", lease_s=60, owner=owner)


@pytest.mark.parametrize("kind", ["file", "rdb"])
def test_a_claim_is_exclusive_until_its_owner_dies(tmp_path, kind):
    def make(owner):
        return claims_of(kind, tmp_path, owner)

    me = make(None)
    dead = make(f"{os.uname().nodename}:999999999:0")  # a pid that does not exist on this host
    alive_elsewhere = make("another-host:1:0")
    assert me.claim("a") is Claim.NEW
    assert alive_elsewhere.claim("a") is Claim.TAKEN  # held by a live worker
    assert alive_elsewhere.claim("b") is Claim.NEW
    assert me.claim("b") is Claim.TAKEN  # a live worker on another host: only its lease can free it
    assert dead.claim("c") is Claim.NEW
    assert me.claim("c") is Claim.TAKEOVER  # its owner is a dead process of this host
    assert me.active() == {"b"}


def test_a_claim_answer_says_whether_this_worker_measures_the_key(tmp_path):
    assert [c for c in Claim if c.mine] == [Claim.NEW, Claim.TAKEOVER]
    assert Claim.NEW != "new" and not isinstance(Claim.TAKEN, str)  # an answer, compared by identity
    alone = NoClaims("s", lease_s=60)  # one process: the tuner counts its own trials
    assert alone.claim("a", budget=0) is Claim.NEW and alone.claim("a") is Claim.NEW
    shared = claims_of("file", tmp_path, None)
    with shared.holding("lock"):  # holding() waits for an answer that is this worker's
        assert claims_of("file", tmp_path, "another-host:1:0").claim("lock") is Claim.TAKEN
    assert claims_of("file", tmp_path, "another-host:1:0").claim("lock") is Claim.NEW


def test_a_claim_after_a_torn_line_is_still_seen(tmp_path):
    path = tmp_path / "c.claims"
    first = FileClaims(path, "s", lease_s=60, owner="another-host:1:0")
    assert first.claim("a") is Claim.NEW
    with path.open("a") as f:
        f.write('{"study": "s", "key": "dead-wri')  # a writer killed inside its write
    assert first.claim("b") is Claim.NEW
    fresh = FileClaims(path, "s", lease_s=60)
    assert fresh.claim("b") is Claim.TAKEN  # the claim after the torn line is read, not lost in a glued line
    assert fresh.claim("a") is Claim.TAKEN


@pytest.mark.parametrize("kind", ["file", "rdb"])
def test_the_budget_counts_keys_done_or_held_live_once(tmp_path, kind):
    def make(owner):
        return claims_of(kind, tmp_path, owner)

    me, other = make(None), make("another-host:1:0")
    dead = make(f"{os.uname().nodename}:999999999:0")  # a pid that does not exist on this host
    me.begin({"old"})  # a trial stored before claims were kept
    assert me.claim("a", budget=4) is Claim.NEW
    me.finish("a")
    assert other.claim("b", budget=4) is Claim.NEW  # live, not finished: holds a slot
    assert dead.claim("stored", budget=4) is Claim.NEW
    dead.finish("stored")
    assert dead.claim("lost", budget=4) is Claim.FULL  # old, a, b and stored fill the budget
    assert me.room(4) == 0 and me.room(6) == 2
    assert me.claim("c", budget=5) is Claim.NEW
    # the dead worker's claims: one it stored before dying, without saying so; one it never finished
    assert dead.claim("x", budget=10) is Claim.NEW and dead.claim("y", budget=10) is Claim.NEW
    looked = []

    def look():
        looked.append(1)
        return {"old", "a", "stored", "x"}  # the study holds x (stored by the dead worker), not y

    # done: old, a, stored, x; held live: b, c; y is free again
    assert other.claim("d", budget=6, finished={"old", "a"}, look=look) is Claim.FULL and looked == [1]
    assert other.claim("y", budget=7, finished={"old", "a", "stored", "x"}) is Claim.NEW
    assert me.claim("x", budget=99) is Claim.TAKEN  # marked done under the lock: nobody measures it again

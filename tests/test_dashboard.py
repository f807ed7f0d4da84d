"""``evotune dashboard``: optuna-dashboard serves a finished experiment's trials over HTTP, and refuses
(one line, exit code 2) when the experiment has no storage yet."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest

from evotune import cli

pytest.importorskip("optuna_dashboard")

ROOT = Path(__file__).parents[1]
PNPOLY = ROOT / "experiments/landscapes/kerneltuner/pnpoly_RTX_2080_Ti.json.gz"
TRIALS = 15


def write_experiment(tmp_path: Path, db: Path) -> Path:
    path = tmp_path / "dash.toml"
    path.write_text(f"""\
name = "dash"
space = "landscape"

[oracle]
kind = "replay"
landscapes = ["{PNPOLY.as_posix()}"]

[[strategy]]
name = "random"
seed = 0

[budget]
trials = {TRIALS}

[storage]
url = "sqlite:///{db.as_posix()}"

[outputs]
plots = "{(tmp_path / "plots").as_posix()}"
best = "{(tmp_path / "best.json").as_posix()}"
""")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the dashboard exited with code {proc.returncode}:\n{log.read_text()}")
        try:
            return get_json(url)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not answer {url} within {timeout:.0f} s:\n{log.read_text()}")
            time.sleep(0.2)


def test_dashboard_serves_the_trials_of_a_finished_experiment(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "dash.db"
    exp = write_experiment(tmp_path, db)
    assert cli.main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    assert db.is_file()
    stored = optuna.load_study(study_name="dash/cn_pnpoly_20000000/landscape:pnpoly_RTX_2080_Ti/random/seed0", storage=f"sqlite:///{db}")
    expected = {t.number: t for t in stored.get_trials(deepcopy=False)}
    assert len(expected) == TRIALS

    port = free_port()
    log = tmp_path / "dashboard.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "evotune", "dashboard", str(exp), "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        summaries = wait_for(f"{base}/api/studies", proc, log)["study_summaries"]
        name = "dash/cn_pnpoly_20000000/landscape:pnpoly_RTX_2080_Ti/random/seed0"
        assert [s["study_name"] for s in summaries] == [name]
        assert summaries[0]["directions"] == ["minimize"]

        detail = get_json(f"{base}/api/studies/{summaries[0]['study_id']}")
        trials = detail["trials"]
        assert len(trials) == TRIALS
        assert sorted(t["number"] for t in trials) == sorted(expected)
        for t in trials:
            want = expected[t["number"]]
            assert t["state"] == want.state.name.capitalize()
            if want.state == optuna.trial.TrialState.COMPLETE:
                assert len(t["values"]) == 1
                assert math.isclose(t["values"][0], want.value, rel_tol=1e-12)
                assert t["values"][0] > 0
            else:  # a failed point of the landscape: no value, but its reason is kept
                assert "values" not in t
            assert {p["name"] for p in t["params"]} == set(want.params)
        assert any(t["state"] == "Complete" for t in trials)
        best = min(t.value for t in expected.values() if t.value is not None)
        assert [b["values"][0] for b in detail["best_trials"]] == [pytest.approx(best)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_dashboard_refuses_an_experiment_that_has_not_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "never.db"
    exp = write_experiment(tmp_path, db)
    assert cli.main(["dashboard", str(exp), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"evotune: error: {exp}: ")
    assert str(db) in lines[0]
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert not db.exists()


def test_dashboard_refuses_a_missing_storage_url(tmp_path, capsys):
    db = tmp_path / "missing.db"
    assert cli.main(["dashboard", "--storage", f"sqlite:///{db}", "--port", str(free_port())]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("evotune: error: --storage: ") and str(db) in lines[0]
    assert not db.exists()

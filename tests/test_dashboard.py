"""``evotune dashboard``: optuna-dashboard serves a finished experiment's trials over HTTP, and refuses
(one line, exit code 2) when the experiment has no storage yet."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape
from pathlib import Path

import optuna
import pytest

from evotune import cli

pytest.importorskip("optuna_dashboard")

ROOT = Path(__file__).parents[1]
PNPOLY = ROOT / "evotune/landscapes/kerneltuner/pnpoly_RTX_2080_Ti.json.gz"
TRIALS = 15


def write_experiment(tmp_path: Path, db: Path, strategies: tuple[str, ...] = ("random",)) -> Path:
    path = tmp_path / "dash.toml"
    tables = "".join(f'[[strategy]]\nname = "{name}"\nseed = 0\n\n' for name in strategies)
    path.write_text(f"""\
name = "dash"
space = "landscape"

[oracle]
kind = "replay"
landscapes = ["{PNPOLY.as_posix()}"]

{tables}
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


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> dict:
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


@pytest.mark.slow  # about 2.0 s: kept out of the fast lane (its 3-minute margin)
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

    with dashboard(exp, tmp_path) as (base, summaries):
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
        assert detail["objective_names"] == ["time (ms)"]
        for t in trials:  # each trial lasts as long as its evaluation took
            want = expected[t["number"]]
            assert want.duration.total_seconds() == pytest.approx(want.user_attrs["wall_s"], abs=1e-5)
            assert t["datetime_start"] != t["datetime_complete"]


@contextmanager
def dashboard(exp: Path, tmp_path: Path, timeout: float = 300.0) -> Iterator[tuple[str, list[dict]]]:
    """``evotune dashboard`` (the real command) on a free loopback port: its base URL and study summaries."""
    port = free_port()
    log = tmp_path / "dashboard.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "evotune", "dashboard", str(exp), "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        yield base, wait_for(f"{base}/api/studies", proc, log, timeout)["study_summaries"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def rendered_text(url: str, tmp_path: Path) -> str:
    """The page's text once headless Chromium has run its scripts (the DOM as rendered, tags dropped). Ten seconds
    of virtual time: the pages are drawn within three (virtual time waits for their fetches, however slow the
    machine), and every second more is spent running the dashboard's polling timers."""
    profile = tempfile.mkdtemp(dir=tmp_path, prefix="chromium-")
    proc = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
                           "--window-size=1600,1000", "--virtual-time-budget=10000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", proc.stdout, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.mark.slow  # a headless browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)")
def test_dashboard_pages_render_the_studies_in_a_browser(tmp_path, monkeypatch, capsys):
    """The study list, a study's page, its trial list and the old trial-table address, as a browser draws them."""
    monkeypatch.chdir(tmp_path)
    exp = write_experiment(tmp_path, tmp_path / "dash.db", strategies=("random", "ga"))
    assert cli.main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    with dashboard(exp, tmp_path) as (base, summaries):
        names = sorted(s["study_name"] for s in summaries)
        assert len(names) == 2
        top = rendered_text(f"{base}/dashboard", tmp_path)
        for name in names:
            assert name in top, top[:2000]
        study_id = next(s["study_id"] for s in summaries if s["study_name"].endswith("/random/seed0"))
        page = rendered_text(f"{base}/dashboard/studies/{study_id}", tmp_path)
        assert "time (ms)" in page and "Objective 0" not in page, page[:3000]
        trials = rendered_text(f"{base}/dashboard/studies/{study_id}/trials", tmp_path)
        assert f"{TRIALS} Trials" in trials, trials[:3000]
        for n in range(TRIALS):
            assert f"Trial {n} " in trials
        assert "samples_ms" in trials and "wall_s" in trials  # the user attributes, lists included
        table = rendered_text(f"{base}/dashboard/studies/{study_id}/trialTable", tmp_path)
        assert f"{TRIALS} Trials" in table, table[:3000]


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


def test_dashboard_without_optuna_dashboard_says_how_to_install_it_before_anything_else(tmp_path, monkeypatch,
                                                                                         capsys):
    """No address is printed that would not answer, and the hint is the README's (the package is not on PyPI)."""
    from evotune.reporting import dashboard as dashboard_module

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "dash.db"
    exp = write_experiment(tmp_path, db)
    assert cli.main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # as if not installed
    monkeypatch.setattr(dashboard_module, "listen", lambda *a, **k: pytest.fail("the dashboard started serving"))
    assert cli.main(["dashboard", str(exp), "--port", str(free_port())]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("evotune: error: the dashboard needs optuna-dashboard: pip install '.[dashboard]'")
    readme = (ROOT / "README.md").read_text()
    assert "pip install '.[dashboard]'" in readme


@pytest.mark.parametrize("port", ["taken", "70000"])
def test_dashboard_on_a_port_it_cannot_have_is_one_line_naming_it_and_announces_nothing(tmp_path, monkeypatch,
                                                                                         capsys, port):
    monkeypatch.chdir(tmp_path)
    exp = write_experiment(tmp_path, tmp_path / "dash.db")
    assert cli.main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:  # another program's server on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        number = str(other.getsockname()[1]) if port == "taken" else port
        assert cli.main(["dashboard", str(exp), "--port", number]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no address announced that this process does not serve
    (line,) = captured.err.splitlines()
    assert line.startswith(f"evotune: error: --port: cannot listen on 127.0.0.1:{number} (")
    if port == "taken":
        assert "choose another --port" in line

"""Four workers on one study in PostgreSQL: a private server from Debian's packages, on loopback only.

Skipped when PostgreSQL's server binaries or psycopg2 are not installed (.ci/run installs both).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_workers import check_shared_study

pytestmark = pytest.mark.slow  # a private PostgreSQL server per test

pytest.importorskip("psycopg2")
BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def as_postgres(cmd: list[str]) -> list[str]:
    """The server refuses to run as root: run it as Debian's postgres user then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture
def postgres_url():
    if not BIN:
        pytest.skip("no PostgreSQL server binaries (apt-get install postgresql)")
    bindir = Path(BIN[-1])
    root = Path(tempfile.mkdtemp(prefix="evotune-pg-"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run(as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "evotune"]),
                   check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1"
    subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-w", "-l",
                                str(root / "log"), "start"]), check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg2://evotune@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_four_workers_share_one_study_in_postgresql(tmp_path, postgres_url):
    check_shared_study(tmp_path, postgres_url, "postgresql")


def test_record_on_postgresql_gets_a_database_of_its_own(tmp_path, postgres_url):
    """A server storage's recording goes to DB_record on the same server, created when missing."""
    from conftest import replay_experiment

    from evotune.cli import main
    from evotune.storage.summaries import study_names

    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=postgres_url, trials=5)
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--seconds", "5"]) == 0
    assert study_names(postgres_url) == []
    (name,) = study_names(postgres_url.removesuffix("/postgres") + "/postgres_record")
    assert name.endswith("/record")
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--seconds", "5"]) == 0  # it exists now


def test_two_hosts_with_kernel_caches_of_their_own_share_one_study(tmp_path, postgres_url):
    """Two workers, as on two hosts (each its own kernel cache), on one PostgreSQL study of the CPU oracle:
    the budget is exact, no point is measured twice, and each host compiled what it measured, once."""
    import optuna

    from evotune.measurement.kernel_cache import KernelCache
    from evotune.storage.study import make_storage
    from evotune.storage.summaries import study_names

    budget, workers = 24, 2
    exp = tmp_path / "hosts.toml"
    exp.write_text(f"""
name = "hosts"
space = "{ROOT / 'tests' / 'spaces' / 'cached_matmul.py'}"
[oracle]
kind = "cpu"
timeout_s = 60
[[problem]]
m = 32
n = 32
k = 32
dtype = "fp32"
[strategy]
name = "random"
[budget]
trials = {budget}
[storage]
url = "{postgres_url}"
""")
    # Each host may build half the budget before its builds wait for the test: neither can finish the study
    # alone, however fast it starts, and the first to stop (the study full) lets the other finish.
    gates = [tmp_path / f"gate{i}" for i in range(workers)]
    for gate in gates:
        gate.mkdir()
        for n in range(budget // workers):
            (gate / f"{n:04d}").touch()
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen([sys.executable, "-m", "evotune", "worker", str(exp), "--no-progress"], cwd=tmp_path,
                              env={**base, "EVOTUNE_KERNEL_CACHE": str(tmp_path / f"host{i}"),
                                   "EVOTUNE_TEST_GATE": str(gates[i])},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(workers)]
    while all(p.poll() is None for p in procs):
        time.sleep(0.01)
    for gate in gates:
        (gate / "open").touch()
    outs = [p.communicate(timeout=1800) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    storage = make_storage(postgres_url)
    (name,) = study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    keys = [t.user_attrs["key"] for t in trials]
    assert len(trials) == budget and len(set(keys)) == budget  # exact, none measured twice
    measured = [int(line.split(" measured by this worker")[0].rsplit(" ", 1)[1])
                for _, err in outs for line in err.splitlines() if "measured by this worker" in line]
    assert sum(measured) == budget and all(m > 0 for m in measured), measured  # both hosts took part
    built = [[b["key"] for b in KernelCache(tmp_path / f"host{i}").builds()] for i in range(workers)]
    assert all(len(b) == len(set(b)) for b in built)  # each host compiled each of its kernels once
    assert [len(b) for b in built] == measured  # and compiled exactly what it measured, in its own cache


def test_a_postgresql_url_that_names_no_driver_takes_the_installed_one(tmp_path, monkeypatch, capsys, postgres_url):
    """SQLAlchemy 2.1 reads postgresql:// as psycopg 3; the postgres extra installs psycopg2: either serves."""
    from conftest import replay_experiment

    from evotune.cli import main

    monkeypatch.chdir(tmp_path)
    plain = postgres_url.replace("postgresql+psycopg2://", "postgresql://")
    exp = replay_experiment(tmp_path / "pg.toml", name="pg", url=plain, trials=5)
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    for url in (plain, postgres_url):
        capsys.readouterr()
        assert main(["best", "--storage", url, "--name", "pg"]) == 0, capsys.readouterr().err
        assert "Best configurations: pg" in capsys.readouterr().out


def test_best_on_an_empty_postgresql_database_creates_no_tables(capsys, postgres_url):
    import sqlalchemy

    from evotune.cli import main

    assert main(["best", "--storage", postgres_url]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "holds no Optuna studies" in line
    engine = sqlalchemy.create_engine(postgres_url)
    try:
        assert sqlalchemy.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()

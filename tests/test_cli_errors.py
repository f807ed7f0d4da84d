"""The reading commands (``best``, ``plot``, ``dashboard``) and ``run`` on storages that are missing, of an
unknown kind or not sound, and ``spaces`` on a bad ``--problem``: one line naming the URL or the file, exit
code 2, and nothing created or changed. Also how a PostgreSQL URL gets an installed driver."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import optuna
import pytest
from conftest import replay_experiment

from evotune.cli import main
from evotune.storage.url import StorageError, with_driver

READERS = (["best"], ["plot"], ["dashboard", "--port", "9"])  # the port is never bound: each fails before


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    """A dashboard that got as far as serving would wait for requests: it fails the test instead."""
    bottle = pytest.importorskip("bottle")

    def run(*args, **kwargs):
        raise AssertionError("the dashboard started serving")

    monkeypatch.setattr(bottle, "run", run)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line(capsys, code: int, *says: str) -> str:
    """The command's exit code was 2 and it printed one error line (no traceback) holding every ``says``."""
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("evotune: error: "), captured.err
    for text in says:
        assert text in lines[0], lines[0]
    assert "http://" not in captured.out  # the dashboard did not announce an address it will not serve
    return lines[0]


@pytest.mark.parametrize("url", ["foo://bar", "runs/x.db", "postgres://me@host/db"])
@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_storage_url_of_no_known_kind_is_one_line(tmp_path, monkeypatch, capsys, command, url):
    monkeypatch.chdir(tmp_path)
    line = one_line(capsys, main([*command, "--storage", url]), "--storage: ", url, "accepted: sqlite:///PATH")
    assert "Traceback" not in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["journal:nonexist.journal", "sqlite:///nonexist.db", "sqlite:///runs/nonexist.db"])
@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_reading_command_never_creates_a_storage(tmp_path, monkeypatch, capsys, command, url):
    monkeypatch.chdir(tmp_path)
    one_line(capsys, main([*command, "--storage", url]), "--storage: ", "nonexist.", "run the experiment first")
    assert list(tmp_path.iterdir()) == []  # no file, no lock file, no folder


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_reading_command_adds_no_tables_to_an_empty_sqlite_file(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.db").write_bytes(b"")
    one_line(capsys, main([*command, "--storage", "sqlite:///empty.db"]), "empty.db holds no Optuna studies")
    assert files(tmp_path) == {"empty.db": b""}


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_garbage_sqlite_file_is_one_line_and_left_alone(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.db").write_bytes(random.Random(0).randbytes(5000))
    before = files(tmp_path)
    one_line(capsys, main([*command, "--storage", "sqlite:///garbage.db"]), "--storage: ",
             "garbage.db is not an SQLite database")
    assert files(tmp_path) == before


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_garbage_journal_is_one_line_and_left_alone(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "garbage.journal").write_bytes(random.Random(0).randbytes(5000))
    before = files(tmp_path)
    one_line(capsys, main([*command, "--storage", "journal:garbage.journal"]),
             "garbage.journal is not a readable Optuna journal")
    assert files(tmp_path) == before


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A sqlite storage holding two finished replay runs (a few hundred KB: room to damage its middle)."""
    folder = tmp_path_factory.mktemp("stored")
    exp = replay_experiment(folder / "q.toml", name="q", url=f"sqlite:///{folder / 'q.db'}", trials=40, repeats=2)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)  # the run writes runs/q_best.json beside it
        assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    return folder / "q.db"


def damaged_copy(src: Path, folder: Path) -> Path:
    """``src`` with 8 KiB in its middle overwritten (the same bytes every time)."""
    data = bytearray(src.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8192] = random.Random(1).randbytes(8192)
    dst = folder / "q.db"
    dst.write_bytes(bytes(data))
    return dst


def test_run_on_a_damaged_sqlite_file_says_it_is_corrupt_and_changes_nothing(tmp_path, monkeypatch, capsys, stored):
    monkeypatch.chdir(tmp_path)
    damaged_copy(stored, tmp_path)
    exp = replay_experiment(tmp_path / "q.toml", name="q", url="sqlite:///q.db", trials=60, repeats=2)
    capsys.readouterr()
    before = files(tmp_path)
    line = one_line(capsys, main(["run", str(exp), "--no-progress", "--no-plots"]), f"{exp}: storage.url: ",
                    "q.db is a corrupt SQLite database")
    assert "max length" not in line
    assert files(tmp_path) == before


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_reading_command_on_a_damaged_sqlite_file_says_it_is_corrupt(tmp_path, monkeypatch, capsys, stored,
                                                                        command):
    monkeypatch.chdir(tmp_path)
    damaged_copy(stored, tmp_path)
    before = files(tmp_path)
    one_line(capsys, main([*command, "--storage", "sqlite:///q.db"]), "q.db is a corrupt SQLite database")
    assert files(tmp_path) == before


def test_best_reads_a_sound_storage_without_writing_to_it(tmp_path, monkeypatch, capsys, stored):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.db").write_bytes(stored.read_bytes())
    before = files(tmp_path)
    assert main(["best", "--storage", "sqlite:///q.db"]) == 0
    assert "Best configurations" in capsys.readouterr().out
    assert files(tmp_path) == before  # not even the lock file that creating tables takes


def test_spaces_names_a_problem_that_is_not_m_x_n_x_k(capsys):
    code = main(["spaces", "--problem", "4096x4096"])
    line = one_line(capsys, code, "--problem: ", "'4096x4096'", "MxNxK")
    assert "unpack" not in line


# -- a PostgreSQL URL takes an installed driver (no server needed) ------------------------------------------
def block(monkeypatch, *modules: str) -> None:
    """Make ``modules`` unimportable, as if they were not installed."""
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


def test_a_postgresql_url_without_a_driver_takes_psycopg2_where_psycopg_is_missing(monkeypatch):
    pytest.importorskip("psycopg2")
    block(monkeypatch, "psycopg")
    assert with_driver("postgresql://me:p%40ss@db:5433/evotune") == "postgresql+psycopg2://me:p%40ss@db:5433/evotune"
    assert with_driver("postgresql+psycopg2://me@db/evotune") == "postgresql+psycopg2://me@db/evotune"
    with pytest.raises(StorageError, match=r"postgresql\+psycopg://me@db/evotune: its driver \(psycopg\) is not"):
        with_driver("postgresql+psycopg://me@db/evotune")


def test_a_postgresql_url_keeps_its_form_where_the_default_driver_is_installed(monkeypatch):
    """SQLAlchemy's own default for ``postgresql://`` is used where it is installed."""
    import sqlalchemy

    default = sqlalchemy.engine.make_url("postgresql://db/x").get_dialect()
    try:
        default.import_dbapi()
    except ImportError:
        pytest.skip(f"{default.driver}, SQLAlchemy's default PostgreSQL driver, is not installed")
    assert with_driver("postgresql://me@db/evotune") == "postgresql://me@db/evotune"


@pytest.mark.parametrize("command", READERS, ids=lambda c: c[0])
def test_a_postgresql_url_with_no_driver_installed_is_one_line(tmp_path, monkeypatch, capsys, command):
    block(monkeypatch, "psycopg", "psycopg2")
    monkeypatch.chdir(tmp_path)
    one_line(capsys, main([*command, "--storage", "postgresql://me:secret@127.0.0.1:9/evotune"]),
             "--storage: postgresql://me:***@127.0.0.1:9/evotune: its driver", "pip install '.[postgres]'")


def test_an_experiment_on_postgresql_with_no_driver_installed_is_one_line(tmp_path, monkeypatch, capsys):
    block(monkeypatch, "psycopg", "psycopg2")
    monkeypatch.chdir(tmp_path)
    exp = replay_experiment(tmp_path / "pg.toml", name="pg", url="postgresql://me@127.0.0.1:9/evotune", trials=5)
    one_line(capsys, main(["run", str(exp), "--no-progress", "--no-plots"]), f"{exp}: storage.url: ",
             "postgresql://me@127.0.0.1:9/evotune: its driver", "pip install '.[postgres]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pg.toml"]


def test_open_existing_refuses_what_optuna_would_write_to(tmp_path):
    """A sqlite database of someone else's (no Optuna tables) is refused, not given Optuna's tables."""
    import sqlite3

    from evotune.storage.study import open_existing

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = db.read_bytes()
    with pytest.raises(StorageError, match=r"other\.db holds no Optuna studies"):
        open_existing(f"sqlite:///{db}")
    assert db.read_bytes() == before
    optuna.storages.RDBStorage(f"sqlite:///{db}")  # the tables Optuna makes when it may write
    assert open_existing(f"sqlite:///{db}") is not None


def test_open_existing_reads_what_a_killed_writer_left_in_the_log_and_writes_nothing(tmp_path):
    """A writer killed with its commits still in the WAL log: a reading open sees them and copies none of them
    into the database file (closing the last connection of a writing open would)."""
    import subprocess

    from evotune.storage.study import open_existing

    db = tmp_path / "q.db"
    writer = ("import os, optuna; from evotune.storage.study import make_storage\n"
              f"study = optuna.create_study(storage=make_storage('sqlite:///{db}'), study_name='s')\n"
              "study.add_trial(optuna.trial.create_trial(value=1.5))\n"
              "os._exit(0)  # killed: no connection closed, the commits stay in the log\n")
    subprocess.run([sys.executable, "-c", writer], check=True)
    logged = {p: (tmp_path / p).read_bytes() for p in ("q.db", "q.db-wal")}
    storage = open_existing(f"sqlite:///{db}")
    assert [t.value for t in optuna.load_study(study_name="s", storage=storage).trials] == [1.5]
    storage.engine.dispose()
    assert {p: (tmp_path / p).read_bytes() for p in ("q.db", "q.db-wal")} == logged


CORRUPT = b'[{"space": "landscape:pnpoly", "problem_key": "pnp'  # a cache cut short by a full disk


@pytest.mark.parametrize("content", [CORRUPT, b"\xff\xfe not text", b'{"a": 1}', b'[{"space": "x"}]'],
                         ids=["cut-short", "not-utf8", "not-a-list", "entry-without-fields"])
def test_run_and_best_set_an_unreadable_tuning_cache_aside_in_one_line(tmp_path, monkeypatch, capsys, content):
    import os

    monkeypatch.chdir(tmp_path)
    cache = Path(os.environ["EVOTUNE_TUNED"])  # this test's own (conftest)
    cache.write_bytes(content)
    # a strategy that transfers reads the cache before its search, and run writes it at the end: said once
    exp = replay_experiment(tmp_path / "c.toml", name="c", url="sqlite:///c.db", trials=12, strategy="default",
                            extra=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # however the console wraps it
    assert err.count("warning: ") == 1 and "Traceback" not in err
    assert f"warning: {cache}: the tuning-result cache is unreadable (" in err
    assert "it is kept as tuned.json.corrupt-1 and a new one is started" in err
    assert cache.with_name("tuned.json.corrupt-1").read_bytes() == content  # nothing of it lost
    assert [e["experiment"] for e in json.loads(cache.read_text())] == ["c"]  # a new one, with this run's best

    cache.write_bytes(content)  # broken again: best sets it aside beside the first
    assert main(["best", str(exp)]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: " in err and "it is kept as tuned.json.corrupt-2 and a new one is started" in err
    assert cache.with_name("tuned.json.corrupt-1").read_bytes() == content
    assert cache.with_name("tuned.json.corrupt-2").read_bytes() == content
    assert [e["experiment"] for e in json.loads(cache.read_text())] == ["c"]


def test_lookup_refuses_an_unreadable_tuning_cache_naming_it(tmp_path):
    from evotune.core.problem import Problem
    from evotune.core.tuned_cache import CacheUnreadable
    from evotune.reporting.lookup import lookup

    cache = tmp_path / "tuned.json"
    cache.write_bytes(CORRUPT)
    with pytest.raises(CacheUnreadable, match=r"tuned\.json: not a tuning-result cache \(not JSON"):
        lookup(Problem.gemm(64, 64, 64), path=cache)
    assert cache.read_bytes() == CORRUPT  # a look-up moves nothing


def test_a_journal_cut_mid_line_is_said_in_one_clean_line(tmp_path):
    """Python's own display of a warning (``path:line: JournalWarning: ...`` and a line of source) is not what
    the command line says: seen as the user sees it, in a process of its own."""
    import subprocess

    journal = tmp_path / "x.journal"
    exp = replay_experiment(tmp_path / "j.toml", name="j", url=f"journal:{journal}", trials=12,
                            extra=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    data = journal.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(data[:start + (len(data) - start) // 2])  # what a writer killed inside its write leaves
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "evotune", "best", str(exp)], cwd=root, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "cut short" in line]
    assert len(lines) == 1 and lines[0].startswith(f"warning: {journal}: line ") and "JournalWarning" not in lines[0]
    assert "warnings.warn" not in done.stderr and "Warning:" not in done.stderr

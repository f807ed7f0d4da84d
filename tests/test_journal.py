"""The journal storage survives a writer killed inside a write (a torn last line), and says what it skips."""

from __future__ import annotations

import json
import re
import uuid

import optuna
import pytest
from conftest import replay_experiment

from evotune.storage.claims import Claim, FileClaims, RdbClaims
from evotune.storage.journal import JournalError, JournalWarning, cut_torn_tail
from evotune.storage.study import make_storage
from evotune.storage.summaries import study_names


def add(storage: optuna.storages.BaseStorage, value: float) -> None:
    study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=value))


@pytest.mark.parametrize("ids", ["random", "hex-words"])
def test_append_after_a_torn_line_keeps_the_journal_readable(tmp_path, monkeypatch, ids):
    if ids == "hex-words":  # Optuna's worker ids are uuid4 hex: any hex word may be in them (1 run in ~1000)
        real = uuid.uuid4
        monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(hex="deadbeef" + real().hex[8:]))
    path = tmp_path / "a.journal"
    url = f"journal:{path}"
    add(make_storage(url), 1.0)
    add(make_storage(url), 2.0)
    whole = path.read_bytes()
    # what a writer killed between two pages of its write leaves: half a line, no newline; its worker id
    # cannot occur in Optuna's own lines (no hex word), so the check below cannot match them by chance
    torn = b'{"op_code":4,"worker_id":"killed-writer","study_id":0,"datetime_st'
    path.write_bytes(whole + torn)
    # Optuna's own backend would glue the next line onto the torn one and then fail to read it
    with pytest.warns(JournalWarning, match="line 5 is cut short"):
        add(make_storage(url), 3.0)
    add(make_storage(url), 4.0)
    study = optuna.load_study(study_name="s", storage=make_storage(url))
    assert [t.value for t in study.get_trials()] == [1.0, 2.0, 3.0, 4.0]
    data = path.read_bytes()
    assert data.startswith(whole) and torn not in data
    assert all(isinstance(json.loads(line), dict) for line in data.splitlines())  # nothing glued onto the tear


def test_cut_torn_tail(tmp_path):
    path = tmp_path / "j"
    path.write_bytes(b"")
    assert cut_torn_tail(path) == 0
    path.write_bytes(b"a\nb\n")
    assert cut_torn_tail(path) == 0 and path.read_bytes() == b"a\nb\n"
    path.write_bytes(b"a\nb\n" + b"x" * 10000)  # a tail longer than one read block
    assert cut_torn_tail(path) == 10000 and path.read_bytes() == b"a\nb\n"
    path.write_bytes(b"no newline at all")
    assert cut_torn_tail(path) == 17 and path.read_bytes() == b""


def outputs(tmp_path) -> str:
    return f'[outputs]\nplots = "{tmp_path / "plots"}"\nbest = "{tmp_path / "best.json"}"\n'


def run(exp, capsys) -> tuple[int, str, str]:
    from evotune.cli import main

    code = main(["run", str(exp), "--no-progress", "--no-plots"])
    out = capsys.readouterr()
    return code, out.out, out.err


def last_trial_torn(path) -> None:
    """Cut ``path`` in the middle of the line that made its last trial: what a writer killed inside that write
    leaves (it wrote nothing after it)."""
    lines = path.read_bytes().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if json.loads(line)["op_code"] == 4)
    path.write_bytes(b"".join(lines[:last]) + lines[last][:len(lines[last]) // 2])


def test_a_trial_lost_with_a_torn_last_line_is_measured_again(tmp_path, capsys):
    path = tmp_path / "x.journal"
    exp = replay_experiment(tmp_path / "exp.toml", name="torn", url=f"journal:{path}", trials=40, seed=1,
                            options="population = 12, offspring = 12", extra=outputs(tmp_path))
    code, _, err = run(exp, capsys)
    assert code == 0 and "40 trials (40 new), stopped on trials" in err
    last_trial_torn(path)  # the claims still count that trial as done
    with pytest.warns(JournalWarning, match=r"x\.journal: line \d+ is cut short"):
        code, _, err = run(exp, capsys)
    assert code == 0 and "40 trials (1 new), stopped on trials" in err
    study = optuna.load_study(study_name=study_names(make_storage(f"journal:{path}"))[0],
                              storage=make_storage(f"journal:{path}"))
    trials = study.get_trials()
    keys = [t.user_attrs["key"] for t in trials]
    assert len(trials) == 40 and len(set(keys)) == 40 and [t.number for t in trials] == list(range(40))


@pytest.mark.parametrize("kind", ["file", "rdb"])
def test_begin_frees_a_key_marked_done_whose_trial_is_gone(tmp_path, kind):
    def make(owner):
        if kind == "file":
            return FileClaims(tmp_path / "c.claims", "s", lease_s=60, owner=owner)
        return RdbClaims(f"sqlite:///{tmp_path / 'c.db'}", "s", lease_s=60, owner=owner)

    me, other = make(None), make("another-host:1:0")
    for key in ("a", "b", "lost"):
        assert me.claim(key, budget=3) is Claim.NEW
        me.finish(key)
    assert other.claim("late", budget=4) is Claim.NEW
    other.finish("late")  # stored by another worker after this one read the study
    assert me.claim("c", budget=4) is Claim.FULL
    me.begin({"a", "b"}, look=lambda: {"a", "b", "late"})
    assert me.room(4) == 1  # a, b and late are done; lost is free again
    assert me.claim("lost", budget=4) is Claim.NEW
    assert me.claim("late", budget=9) is Claim.TAKEN


def with_lines(path, lines: dict[int, bytes]) -> list[bytes]:
    """Put ``lines`` (line number, 1-based -> text) before the lines of ``path`` that have those numbers."""
    old = path.read_bytes().splitlines(keepends=True)
    for number in sorted(lines, reverse=True):
        old.insert(number - 1, lines[number])
    path.write_bytes(b"".join(old))
    return old


def stored(path) -> list[float]:
    return [t.value for t in optuna.load_study(study_name="s", storage=make_storage(f"journal:{path}")).get_trials()]


def test_lines_that_are_no_records_are_skipped_with_one_warning(tmp_path):
    path = tmp_path / "a.journal"
    for value in (1.0, 2.0, 3.0):
        add(make_storage(f"journal:{path}"), value)
    with_lines(path, {2: b"a note pasted in\n", 4: b"\n", 5: b'{"note": 1}\n'})
    path.write_bytes(path.read_bytes() + b"\n\n")
    with pytest.warns(JournalWarning) as caught:
        assert stored(path) == [1.0, 2.0, 3.0]
        assert stored(path) == [1.0, 2.0, 3.0]  # read again: warned once
    assert [str(w.message) for w in caught] == [
        f"{path}: skipped 5 line(s) that are not journal records (the first at line 2)"]
    add(make_storage(f"journal:{path}"), 4.0)  # appends after the skipped lines stay readable
    assert stored(path) == [1.0, 2.0, 3.0, 4.0]


def test_a_broken_record_in_the_middle_names_the_file_and_the_line(tmp_path, capsys):
    path = tmp_path / "x.journal"
    exp = replay_experiment(tmp_path / "exp.toml", name="broken", url=f"journal:{path}", trials=12, seed=1,
                            extra=outputs(tmp_path))
    assert run(exp, capsys)[0] == 0
    lines = path.read_bytes().splitlines(keepends=True)
    lines[5] = lines[5][:40] + lines[6]  # a torn line with the next record glued onto it
    del lines[6]
    path.write_bytes(b"".join(lines))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(JournalError, match=f"^{re.escape(str(path))}: line 6: a broken journal record"):
        make_storage(f"journal:{path}")
    code, _, err = run(exp, capsys)
    assert code == 2 and err.count("\n") == 1 and f"{path}: line 6: a broken journal record" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before  # nothing written


def test_a_file_whose_lines_are_no_records_is_no_journal_and_is_left_alone(tmp_path, capsys):
    """A run on a file of text, none of it a record, is refused in one line: no empty journal is appended to it."""
    path = tmp_path / "notes.journal"
    path.write_bytes(b"some notes\nnot a journal\n")
    exp = replay_experiment(tmp_path / "exp.toml", name="notes", url=f"journal:{path}", trials=4)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, _, err = run(exp, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{path} is not a readable Optuna journal" in err and "none of its 2 line(s) is a journal record" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

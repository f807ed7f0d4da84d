"""The journal storage survives a writer killed inside a write (a torn last line)."""

from __future__ import annotations

import json
import uuid

import optuna
import pytest

from evotune.journal import cut_torn_tail
from evotune.study import make_storage


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

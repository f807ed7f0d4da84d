"""Turns on a GPU (evotune.measurement.gpu_turn), between processes, on the CPU: one holder at a time, a turn given
up only inside ``away``, and nothing taken by a process that has its GPU to itself."""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from evotune.measurement import gpu_turn


def _worker(lock: str, log: str, name: str) -> None:
    """Hold the turn for two spans around a wait given up, writing each held span (wall clock) to ``log``."""
    import os

    os.environ[gpu_turn.ENV] = lock
    spans = []
    with gpu_turn.held():
        for _ in range(2):
            start = time.time()
            time.sleep(0.05)
            with gpu_turn.held():  # nested: still one turn
                time.sleep(0.01)
            spans.append((start, time.time()))
            with gpu_turn.away():
                time.sleep(0.05)
    Path(log).write_text(json.dumps({"name": name, "spans": spans}))


@pytest.mark.slow  # processes
def test_processes_sharing_a_turn_never_hold_it_together(tmp_path: Path) -> None:
    lock = str(tmp_path / "gpu0")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(lock, str(tmp_path / f"{i}.json"), str(i))) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    spans = sorted((s, e, doc["name"]) for i in range(3)
                   for doc in [json.loads((tmp_path / f"{i}.json").read_text())] for s, e in doc["spans"])
    assert len(spans) == 6
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert start >= end  # no two holders at once
    # the waits given up let the others in: the holders interleave rather than each running whole
    names = [n for _, _, n in spans]
    assert any(a != b for a, b in itertools.pairwise(names))


def test_a_process_alone_on_its_gpu_takes_no_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_turn.ENV, raising=False)
    assert gpu_turn.this_process() is None
    with gpu_turn.held(), gpu_turn.away():
        pass


def test_a_turn_given_up_is_taken_again_after_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gpu_turn.ENV, str(tmp_path / "gpu0"))
    turn = gpu_turn.this_process()
    assert turn is not None and not turn.held
    with gpu_turn.held():
        with gpu_turn.held():
            assert turn.held
            with gpu_turn.away():
                assert not turn.held
            assert turn.held
        assert turn.held
    assert not turn.held
    with gpu_turn.away():  # not held: nothing to give up
        assert not turn.held

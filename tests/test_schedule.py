"""The schedule: whole problems first, then whole studies, then the points of what others are still running."""

from __future__ import annotations

import pytest

from evotune.running.schedule import Schedule, Turn

GROUPS = [("e/p0", ["e/p0/ga/seed0", "e/p0/ga/seed1"]), ("e/p1", ["e/p1/ga/seed0"]), ("e/p2", ["e/p2/ga/seed0"])]


def schedule(tmp_path, owner: str, split: str = "problems") -> Schedule:
    # owners on another host: their claims lapse only with their lease, as a live worker's would
    return Schedule(f"sqlite:///{tmp_path / 's.db'}", "e", GROUPS, split, owner=f"host-{owner}:1")


def test_two_workers_deal_out_the_problems_then_join_what_is_left(tmp_path):
    a, b = schedule(tmp_path, "a"), schedule(tmp_path, "b")
    unfinished = {"e/p0/ga/seed0", "e/p0/ga/seed1", "e/p1/ga/seed0", "e/p2/ga/seed0"}
    ta, tb = a.turns(unfinished.__contains__), b.turns(unfinished.__contains__)
    assert next(ta) == Turn(0, 0, whole=True)  # a takes problem 0 and starts on its first study
    assert next(tb) == Turn(1, 0, whole=True)  # b finds problem 0 taken: problem 1
    assert next(tb) == Turn(2, 0, whole=True)  # and problem 2
    assert next(tb) == Turn(0, 1, whole=True)  # then the study of problem 0 that a has not started
    unfinished -= {"e/p1/ga/seed0", "e/p2/ga/seed0", "e/p0/ga/seed1"}
    assert next(tb) == Turn(0, 0, whole=False)  # a is still at its study: b joins it, sharing points
    assert list(tb) == []
    assert list(ta) == []  # a's other study was b's; nothing else is unfinished
    a.release()
    b.release()
    c = schedule(tmp_path, "c")  # a later run takes everything afresh
    assert [t.whole for t in c.turns(lambda name: False)] == [True] * 4
    c.release()
    late = schedule(tmp_path, "d")  # a worker that joins late takes only what is unfinished
    assert list(late.turns("e/p1/ga/seed0".__eq__, resume_finished=False)) == [Turn(1, 0, whole=True)]


def test_fewer_problems_than_workers_share_points(tmp_path):
    groups = GROUPS[1:2]
    a = Schedule(f"sqlite:///{tmp_path / 's.db'}", "e", groups, owner="host-a:1")
    b = Schedule(f"sqlite:///{tmp_path / 's.db'}", "e", groups, owner="host-b:1")
    ta = a.turns(lambda name: True)
    assert next(ta) == Turn(0, 0, whole=True)
    assert list(b.turns(lambda name: True)) == [Turn(0, 0, whole=False)]


def test_split_points_runs_every_study_beside_the_others(tmp_path):
    a, b = schedule(tmp_path, "a", "points"), schedule(tmp_path, "b", "points")
    every = [Turn(0, 0, False), Turn(0, 1, False), Turn(1, 0, False), Turn(2, 0, False)]
    assert list(a.turns(lambda name: False)) == every
    assert list(b.turns(lambda name: False)) == every
    with pytest.raises(ValueError, match="split"):
        schedule(tmp_path, "c", "studies")


def test_a_group_is_confirmed_once_per_number_of_trials(tmp_path):
    a, b = schedule(tmp_path, "a"), schedule(tmp_path, "b")
    with a.confirming(0, 40) as mine:
        assert mine
        with b.confirming(0, 40) as theirs:
            assert not theirs  # a is confirming it
    with b.confirming(0, 40) as theirs:
        assert not theirs  # a confirmed it at 40 trials
    with b.confirming(0, 41) as theirs:
        assert theirs  # a trial more: confirmed again
    with pytest.raises(RuntimeError), a.confirming(1, 10) as mine:
        assert mine
        raise RuntimeError("the confirmation failed")
    with b.confirming(1, 10) as theirs:
        assert theirs  # given back when it failed

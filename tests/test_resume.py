"""Running an experiment again resumes it: nothing re-measured, the budget never exceeded."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import PNPOLY, replay_experiment

from evotune.measurement.replay import ReplayEvaluator
from evotune.running.experiment import load_experiment
from evotune.running.run import run_experiment
from evotune.storage.study import StudyStore


def write_experiment(tmp_path, trials=40, strategy="ga"):
    path = replay_experiment(tmp_path / "exp.toml", name="resume", url=f"sqlite:///{tmp_path / 'resume.db'}",
                             trials=trials, strategy=strategy, seed=5, options="population = 8, offspring = 8")
    return load_experiment(path)


def trials_of(exp):
    from evotune.core.landscape import load_landscape

    space = load_landscape(PNPOLY).space()
    name = f"resume/{load_landscape(PNPOLY).problem.key}/landscape:pnpoly_RTX_2080_Ti/ga/seed5"
    return StudyStore.open(exp.storage, name, space).history()


@pytest.mark.slow  # about 1.9 s: kept out of the fast lane (its 3-minute margin)
def test_interrupted_run_resumes_without_remeasuring(tmp_path, monkeypatch):
    exp = write_experiment(tmp_path)
    measured = Counter()
    real = ReplayEvaluator.evaluate

    def flaky(self, point, problem):
        key = tuple(sorted(point.items()))
        measured[key] += 1
        if sum(measured.values()) == 18:
            raise KeyboardInterrupt  # the user presses Ctrl-C during the 18th evaluation
        return real(self, point, problem)

    monkeypatch.setattr(ReplayEvaluator, "evaluate", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, progress=False)
    first = trials_of(exp)
    assert len(first) == 17  # every finished trial is kept; the interrupted one never was finished

    results = run_experiment(exp, progress=False)
    assert results[0].trials == 40 and results[0].new_trials == 23
    final = trials_of(exp)
    assert len(final) == 40
    assert len({r.key for r in final}) == 40, "a point was stored twice"
    assert [r.key for r in final[:17]] == [r.key for r in first]
    # only the point interrupted mid-measurement was ever measured twice
    assert sum(1 for c in measured.values() if c > 1) <= 1

    again = run_experiment(exp, progress=False)
    assert again[0].new_trials == 0 and again[0].trials == 40 and again[0].stopped == "trials"
    assert len(trials_of(exp)) == 40


@pytest.mark.slow  # about 2.1 s: kept out of the fast lane (its 3-minute margin)
def test_failed_points_are_stored_with_their_reason(tmp_path):
    exp = write_experiment(tmp_path, trials=300, strategy="ga")
    run_experiment(exp, progress=False)
    history = trials_of(exp)
    failed = [r for r in history if r.value is None]
    assert failed, "pnpoly has 358 failing points; 300 GA trials should meet some"
    for r in failed:
        assert r.status.value == "runtime_error"
        assert "RuntimeFailedConfig" in r.attrs["message"]

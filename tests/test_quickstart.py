"""The README's quickstart, as a user runs it: finishes, converges, writes its outputs, and resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from evotune.running.experiment import load_experiment

QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def run(cwd):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "evotune", "run", str(QUICKSTART), "--no-progress"],
                          cwd=cwd, capture_output=True, text=True, timeout=1800)  # a hang guard, not a time limit
    assert proc.returncode == 0, proc.stderr
    return proc, time.monotonic() - started


def study_sizes(cwd):
    import optuna

    from evotune.storage.study import make_storage

    exp = load_experiment(QUICKSTART)
    storage = make_storage(exp.storage.replace("journal:", f"journal:{cwd}/"))
    out = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        trials = optuna.load_study(study_name=summary.study_name, storage=storage).get_trials(deepcopy=False)
        out[summary.study_name] = [t.user_attrs["key"] for t in trials]
    return out


@pytest.mark.slow  # the README's quickstart, run twice
def test_quickstart_runs_resumes_and_writes_its_outputs(tmp_path):
    proc, seconds = run(tmp_path)
    print(f"quickstart: {seconds:.1f} s on this machine")
    first = study_sizes(tmp_path)
    for strategy in ("default", "ga", "random"):  # default: the strategy the README recommends
        runs = {k: v for k, v in first.items() if f"/{strategy}/" in k}
        assert len(runs) == 3 and all(len(v) == 200 for v in runs.values()), strategy
    assert len(first) == 9
    assert all(len(set(v)) == len(v) for v in first.values()), "a point was measured twice in one study"
    plots = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert plots == ["quickstart_Xgemm_4096x4096_convergence.png", "quickstart_Xgemm_4096x4096_params.png"]
    best = json.loads((tmp_path / "runs" / "quickstart_best.json").read_text())
    assert best[0]["fraction_of_optimum"] > 0.9 and best[0]["trials"] == 1800
    assert "Best configurations: quickstart" in proc.stdout

    proc, _ = run(tmp_path)  # the same command again resumes: nothing new is measured
    assert proc.stderr.count("(0 new)") == 9
    assert study_sizes(tmp_path) == first


def test_the_quickstart_landscape_is_labelled_fp32():
    """CLBlast's Xgemm as the benchmark hub recorded it (PRECISION = 32): its problem says fp32, in the file, in
    the studies' attributes and in the exports, which write it as the problem does."""
    from evotune.core.landscape import load_landscape
    from evotune.core.problem import Problem

    ls = load_landscape(load_experiment(QUICKSTART).landscapes[0])
    assert [p.choices for p in ls.params if p.name == "PRECISION"] == [(32,)]
    assert (ls.problem.kind, ls.problem.label, ls.problem.dtype) == ("Xgemm", "4096x4096", "fp32")
    assert ls.problem.to_dict() == {"kind": "Xgemm", "label": "4096x4096", "dtype": "fp32", "extra": {}}
    assert Problem.from_dict(ls.problem.to_dict()) == ls.problem and ls.problem.key == "Xgemm_4096x4096"


def test_quickstart_ga_beats_random_at_the_median():
    """The quickstart's point: on this landscape the GA finds better kernels than random search."""
    from statistics import median

    from evotune.core.landscape import load_landscape
    from evotune.core.space import Context
    from evotune.measurement.replay import ReplayEvaluator
    from evotune.search.strategies import make_strategy

    ls = load_landscape(load_experiment(QUICKSTART).landscapes[0])
    space = ls.space()
    fs = space.feasible(Context())
    oracle = ReplayEvaluator(ls)

    def best_of(name, seed):
        s = make_strategy(name, space, fs, seed=seed, population=20, offspring=20) if name == "ga" else \
            make_strategy(name, space, fs, seed=seed)
        best = float("inf")
        for _ in range(200):
            (p,) = s.ask(1)
            v = oracle.evaluate(p, ls.problem).value
            s.tell([(p, v)])
            best = min(best, v if v is not None else best)
        return best

    ga = median(best_of("ga", s) for s in range(7))
    rnd = median(best_of("random", s) for s in range(7))
    assert ga < rnd

"""The README's quickstart, as a user runs it in a fresh clone: finishes, converges, writes its outputs under runs/
(the clone stays clean), resumes, and draws the curves README's figure was drawn from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, git_status

from evotune.running.experiment import load_experiment

QUICKSTART = ROOT / "experiments" / "quickstart.toml"
FIGURE_DATA = ROOT / "docs" / "images" / "quickstart_Xgemm_4096x4096_convergence.csv"


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
def test_quickstart_runs_resumes_and_writes_its_outputs(quickstart):
    checkout, proc = quickstart
    first = study_sizes(checkout.path)
    for strategy in ("default", "ga", "random"):  # default: the strategy the README recommends
        runs = {k: v for k, v in first.items() if f"/{strategy}/" in k}
        assert len(runs) == 3 and all(len(v) == 200 for v in runs.values()), strategy
    assert len(first) == 9
    assert all(len(set(v)) == len(v) for v in first.values()), "a point was measured twice in one study"
    plots = sorted(p.name for p in (checkout.path / "runs" / "plots").glob("*.png"))
    assert plots == ["quickstart_Xgemm_4096x4096_convergence.png", "quickstart_Xgemm_4096x4096_params.png"]
    best = json.loads((checkout.path / "runs" / "quickstart_best.json").read_text())
    assert best[0]["fraction_of_optimum"] > 0.9 and best[0]["trials"] == 1800
    assert "Best configurations: quickstart" in proc.stdout

    proc = checkout.run("-m", "evotune", "run", "experiments/quickstart.toml", "--no-progress")  # resumes
    assert proc.stderr.count("(0 new)") == 9
    assert study_sizes(checkout.path) == first


@pytest.mark.slow  # shares the quickstart's run
def test_readmes_commands_leave_a_fresh_clone_clean(quickstart):
    """The quickstart, then benchmarks/kernel_quality.py (docs/landscapes.md): everything they write is under runs/
    (ignored), none touches a tracked file, the pictures in docs/images/ included. README's commands on the
    quickstart's results (``best``, ``plot``) run in this clone in tests/test_docs.py, which checks the same of
    them."""
    checkout, _ = quickstart
    checkout.run("benchmarks/kernel_quality.py")
    assert (checkout.path / "runs" / "plots" / "kernel_quality.png").is_file()
    assert git_status(checkout.path) == ""


@pytest.mark.slow  # shares the quickstart's run
def test_readmes_quickstart_figure_is_drawn_from_the_curves_the_quickstart_draws_today(quickstart, tmp_path):
    """README's figure keeps its data beside it; when the quickstart's curves change, ``python docs/images/make.py``
    draws both again (and this fails until it has)."""
    from evotune.reporting.plots import evaluation_bands, load_runs, write_bands

    checkout, _ = quickstart
    exp = load_experiment(QUICKSTART)
    (runs,) = load_runs(exp.storage.replace("journal:", f"journal:{checkout.path}/"), exp.name)
    today = write_bands(evaluation_bands(runs), tmp_path / FIGURE_DATA.name).read_text().splitlines()
    committed = FIGURE_DATA.read_text().splitlines()
    differ = [f"{a!r} != {b!r}" for a, b in zip(today, committed, strict=False) if a != b]
    assert not differ and len(today) == len(committed), (
        f"{FIGURE_DATA.relative_to(ROOT)} is stale: run python docs/images/make.py; first differences: {differ[:3]}")


def test_an_experiments_outputs_default_to_runs(tmp_path):
    """Without an [outputs] table, plots and the best-configuration export go under runs/ too, where the storage
    goes: a run inside a checkout changes no tracked file."""
    from conftest import replay_experiment

    exp = load_experiment(replay_experiment(tmp_path / "bare.toml", name="bare", url="journal:runs/bare.journal",
                                            trials=5))
    assert exp.plots_dir == Path("runs/plots") and exp.best_path == Path("runs/bare_best.json")


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


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
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

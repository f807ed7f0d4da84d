"""benchmarks/scaleout.py on the CPU: several workers replay the recorded int8 landscapes, tuning or recording."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from conftest import ROOT

SLOW = pytest.mark.slow  # whole runs with one and two workers


def scaleout():
    spec = importlib.util.spec_from_file_location("scaleout", ROOT / "benchmarks" / "scaleout.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@SLOW
def test_tuning_with_one_and_two_workers_is_exact_and_tabled(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "scaleout_int8.toml"), "--cpu", "--workers", "1,2",
                            "--problems", "3", "--trials", "12", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [r["workers"] for r in doc["runs"]] == [1, 2] and doc["problems"] == 3 and doc["evals"] == 12
    for r in doc["runs"]:
        assert r["exact"] and r["duplicates"] == 0 and list(r["trials"].values()) == [12, 12, 12]
        assert sum(c["evals"] for c in r["costs"]) == 36 and len(r["costs"]) == r["workers"]
    one = doc["runs"][0]["costs"][0]
    assert len(one["problems_s"]) == 3 and one["model"]["per_eval_s"] > 0  # the lone worker took up each once
    printed = capsys.readouterr().out
    assert ("| workers | storage | split | wall time (s) | trials (studies) | exact | duplicates | kernels compiled "
            "(different) | measuring | speed-up |") in printed
    assert "| 2 | sqlite | problems |" in printed and "per problem" in printed


@SLOW
def test_recording_is_split_across_workers_and_complete(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "scaleout_record_int8.toml"), "--cpu", "--record",
                            "--workers", "2", "--points", "25", "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["workers"] for r in runs] == [1, 2]  # one count alone runs with one worker too, for the speed-up
    for run in runs:
        assert run["exact"] and run["incomplete"] == [] and list(run["trials"].values()) == [25] * 4
    assert "recording every feasible point" in capsys.readouterr().out


@SLOW
def test_both_storages_and_the_contention_learned_from_two_workers(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "scaleout_int8.toml"), "--cpu", "--workers", "1,2",
                            "--problems", "2", "--trials", "10", "--storage", "sqlite,journal", "--json", str(out)])
    assert code == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["storage"], r["workers"]) for r in runs] == [("sqlite", 1), ("sqlite", 2), ("journal", 1),
                                                           ("journal", 2)]
    for r in runs:
        assert r["exact"] and r["duplicates"] == 0 and r["builds"] == 0  # replay compiles nothing
        assert r["window_s"] > 0 and r["busy_s"] > 0
        # predicted from the lone worker's costs, and from those with the two workers' contention
        assert r["predicted"] > 0 and r["predicted_with_contention"] > 0
        assert 1.0 < r["ceiling"] <= 2.0 if r["workers"] == 2 else r["ceiling"] == pytest.approx(1.0)
    assert "| 2 | journal | problems |" in capsys.readouterr().out


@SLOW
def test_a_timed_run_after_a_warm_up_reports_how_busy_the_measuring_process_was(tmp_path, capsys):
    out = tmp_path / "runs.json"
    code = scaleout().main([str(ROOT / "experiments" / "gpu_busy_int8.toml"), "--cpu", "--run", "--warm",
                            "--gpus", "1", "--problems", "2", "--trials", "8", "--json", str(out)])
    assert code == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["exact"] and run["workers"] == 1 and run["costs"] == []  # `evotune run`: no worker costs
    assert 0 < run["busy_s"] < run["loops_s"] <= run["window_s"]
    assert "% of " in capsys.readouterr().out


def test_a_trials_time_inside_the_gpu_worker_and_its_samples_are_averaged_per_trial():
    class Trial:
        def __init__(self, **attrs):
            self.user_attrs = attrs

    trials = [Trial(worker_s=0.030, served_s=0.029, bench_s=0.020, samples_ms=[0.006] * 40),
              Trial(worker_s=0.050, served_s=0.048, bench_s=0.060, samples_ms=[0.006] * 120),
              Trial(worker_s=0.004, served_s=0.003, waited_s=0.012)]  # failed before it was timed: no samples
    inside = scaleout().inside_ms(trials)
    assert inside["waited_s"] == pytest.approx(4.0)  # over every trial: one waited 12 ms for another's compile
    assert inside["worker_s"] == pytest.approx(28.0) and inside["served_s"] == pytest.approx(80.0 / 3)
    assert inside["delay"] == pytest.approx(28.0 - 80.0 / 3)
    assert inside["bench_s"] == pytest.approx(40.0)  # the two trials that have it
    assert inside["samples"] == pytest.approx(80.0)  # a count
    assert inside["sample"] == pytest.approx(0.5)  # 0.5 ms a sample in both


def test_the_ceiling_is_the_lone_runs_time_outside_its_evaluations_paid_by_every_worker():
    module = scaleout()
    one = module.Run(1, "problems", "journal", 152.6, {}, {}, 0, window_s=141.6)
    # 141.6 s of evaluations over two GPUs, the 11.0 s around them as alone
    assert module.ceiling(one, 2) == pytest.approx(152.6 / (70.8 + 11.0))
    assert module.ceiling(one, 1) == pytest.approx(1.0)
    assert module.ceiling(module.Run(1, "problems", "journal", 10.0, {}, {}, 0), 2) is None  # no window

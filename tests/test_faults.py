"""The tuner survives candidates that crash, abort, hang, run out of memory, fail to build or compute wrongly.

The CPU flavour of ``tests/spaces/faults.py`` runs in :class:`evotune.measurement.cpu.CpuEvaluator`'s
worker process; every fault must end as one stored trial with its status and reason, and the tuning
process itself must carry on.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from evotune.core.budget import Budget
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.measurement.cpu import CpuEvaluator
from evotune.measurement.options import OracleOptions
from evotune.running.tuner import tune_study
from evotune.search.strategies import make_strategy
from evotune.storage.study import StudyStore

FAULTS = Path(__file__).parent / "spaces" / "faults.py"  # a test fixture, named by its path
EXPERIMENT = Path(__file__).parent / "experiments" / "faults_cpu.toml"
PROBLEM = Problem.gemm(64, 48, 32, "fp32")
CTX = Context(problem=PROBLEM)
OPTIONS = OracleOptions(timeout_s=3.0)
EXPECTED = {  # mode -> the status its trial must end with
    "ok_fast": {Status.OK}, "ok_slow": {Status.OK}, "abort": {Status.CRASH}, "segfault": {Status.CRASH},
    "hang": {Status.TIMEOUT}, "compile_error": {Status.COMPILE_ERROR}, "wrong": {Status.WRONG_RESULT},
    "oom": {Status.RUNTIME_ERROR, Status.CRASH},  # MemoryError under the cap, or killed for memory
}


@pytest.fixture(scope="module")
def space():
    if os.environ.get("EVOTUNE_FAULTS_FLAVOUR", "cpu") != "cpu":
        pytest.skip("EVOTUNE_FAULTS_FLAVOUR selects the GPU flavour")
    return load_space(str(FAULTS))


def test_the_space_has_every_fault_once_and_three_correct_sizes(space):
    fs = space.feasible(CTX)
    points = [fs.point(r) for r in range(len(fs))]
    assert len(points) == 12 and space.size == 24
    assert sorted(p["mode"] for p in points if p["size"] == 1) == sorted(EXPECTED)
    assert sorted(p["size"] for p in points if p["mode"] == "ok_slow") == [1, 2, 3]
    assert fs.pruned == {"one-size-for-faults": 12}


@pytest.mark.slow  # every fault of the space in its own process
def test_a_run_over_the_whole_fault_space_completes(space, tmp_path):
    store = StudyStore.open(f"sqlite:///{tmp_path / 'faults.db'}", "faults/exhaustive", space)
    strategy = make_strategy("exhaustive", space, space.feasible(CTX), seed=0)
    parent = os.getpid()
    with CpuEvaluator(space, OPTIONS, repeats=3, memory_limit_mb=512) as ev:
        result = tune_study(space, CTX, ev, strategy, store, Budget(trials=100))
        restarts = ev.restarts
    assert os.getpid() == parent  # the tuner process is the one that started
    assert result.stopped == "exhausted" and result.trials == result.new_trials == 12

    trials = store.study.get_trials(deepcopy=False)  # every state: nothing may be left RUNNING
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials), [t.state for t in trials]
    keys = [t.user_attrs["key"] for t in trials]
    duplicates = len(keys) - len(set(keys))
    lost = 12 - len(trials)
    by_mode = {}
    for t in trials:
        point = space.from_storage(t.params)
        status = Status(t.user_attrs["status"])
        assert status in EXPECTED[point["mode"]], (point, status, t.user_attrs.get("message"))
        if status is Status.OK:
            assert t.state == TrialState.COMPLETE and t.value > 0
        else:
            assert t.state == TrialState.FAIL and t.value is None and t.user_attrs["message"]
        by_mode.setdefault(point["mode"], []).append((point["size"], t.value, t.user_attrs.get("message", "")))
    assert "signal 6" in by_mode["abort"][0][2] and "signal 11" in by_mode["segfault"][0][2]
    assert "on purpose" in by_mode["compile_error"][0][2] and "MemoryError" in by_mode["oom"][0][2]
    slow = dict((s, v) for s, v, _ in by_mode["ok_slow"])
    assert slow[1] < slow[3]  # sleeps 1 ms against 3 ms
    assert result.best_point["mode"] == "ok_fast"
    assert restarts == 3  # abort, segfault and hang each cost a worker; nothing else does
    survived = sum(1 for t in trials if t.state == TrialState.FAIL)
    assert survived == 6 and result.failures == {"crash": 2, "timeout": 1, "compile_error": 1,
                                                 "wrong_result": 1, "runtime_error": 1}
    print(f"faults survived: {survived}, trials lost: {lost}, duplicates: {duplicates}")
    assert lost == 0 and duplicates == 0

    # resuming measures nothing again
    again = tune_study(space, CTX, CpuEvaluator(space, OPTIONS), make_strategy(
        "exhaustive", space, space.feasible(CTX), seed=0), store, Budget(trials=100))
    assert again.new_trials == 0 and again.trials == 12


def test_the_worker_carries_on_after_each_fault(space):
    with CpuEvaluator(space, OPTIONS, memory_limit_mb=512) as ev:
        for mode in ("wrong", "compile_error", "oom", "abort"):
            assert ev.evaluate({"mode": mode, "size": 1}, PROBLEM).status.failed
            r = ev.evaluate({"mode": "ok_fast", "size": 2}, PROBLEM)
            assert r.status is Status.OK and r.error <= 1e-9 and len(r.samples_ms) == 5, r.message
        assert ev.restarts == 1  # only the abort needed a fresh worker


def test_a_space_the_worker_cannot_load_is_a_crash_not_an_exception(space, tmp_path):
    path = tmp_path / "flaky_space.py"
    path.write_text(
        "import importlib.util, multiprocessing\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise ImportError('not in a worker')\n"
        f"spec = importlib.util.spec_from_file_location('faults_module', {str(FAULTS)!r})\n"
        "faults = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(faults)\n"
        "SPACE = faults._make_space('cpu')  # a space of its own, so the worker loads this file\n")
    flaky = load_space(str(path))
    with CpuEvaluator(flaky, OPTIONS) as ev:
        r = ev.evaluate({"mode": "ok_fast", "size": 1}, PROBLEM)
    assert r.status is Status.CRASH and "could not load the space" in r.message and "not in a worker" in r.message


def test_oom_refuses_to_run_without_an_address_space_cap(space):
    import resource

    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("this process runs under an address-space cap")
    fn = space.build({"mode": "oom", "size": 1}, PROBLEM)
    with pytest.raises(MemoryError, match="refusing"):
        fn(None, None)


def test_a_space_without_build_is_refused():
    from evotune.core.space import SearchSpace, ordinal

    with pytest.raises(ValueError, match="no build function"):
        CpuEvaluator(SearchSpace("x", [ordinal("a", (1, 2))]))


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
def test_the_fault_experiment_runs_to_its_end_with_its_oracle_options(space, tmp_path):
    """The experiment names the space by a path relative to itself; its timeout_s reaches the CPU worker."""
    from evotune.running.experiment import load_experiment
    from evotune.running.run import run_experiment

    exp = load_experiment(EXPERIMENT)
    assert exp.oracle == "cpu" and exp.oracle_options == OracleOptions(timeout_s=10.0)
    # a shorter timeout than the file's keeps the hang cheap; the storage goes to tmp_path
    exp = dataclasses.replace(exp, storage=f"sqlite:///{tmp_path / 'faults.db'}",
                              oracle_options=dataclasses.replace(exp.oracle_options, timeout_s=2.0))
    (result,) = run_experiment(exp, progress=False)
    assert result.trials == 12 and result.stopped == "exhausted" and result.best_point["mode"] == "ok_fast"
    trials = optuna.load_study(study_name=result.study_name, storage=exp.storage).get_trials(deepcopy=False)
    (hang,) = [t for t in trials if t.params.get("mode") == "hang"]
    assert hang.user_attrs["status"] == "timeout" and "no answer within 2 s" in hang.user_attrs["message"]


def test_the_fault_space_is_not_offered_to_users(monkeypatch, capsys):
    from evotune import cli
    from evotune.core.plugins import builtin_names

    assert "faults" not in builtin_names() and "triton_matmul" in builtin_names()
    monkeypatch.setenv("COLUMNS", "200")  # one row per space, names unwrapped
    assert cli.main(["spaces"]) == 0
    table = capsys.readouterr().out
    assert "triton_matmul" in table and "faults" not in table

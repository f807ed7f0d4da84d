"""One measuring process serves every space of a run: a request of another space switches it first."""

from __future__ import annotations

from conftest import ROOT

from evotune.core.result import Status
from evotune.measurement.messages import Reply, ReplyStatus, UseSpace
from evotune.running.experiment import load_experiment
from evotune.running.session import Evaluators
from evotune.running.targets import targets

SHIFTED = '''
import numpy as np

from evotune.core.space import SearchSpace, ordinal


def build(point, problem):
    return lambda a, b: a @ b + point["shift"]  # shift 1 computes the wrong answer on purpose


SPACE = SearchSpace("shifted", [ordinal("shift", [0, 1])], build=build)
'''


def test_one_cpu_worker_process_serves_two_spaces(tmp_path):
    (tmp_path / "shifted.py").write_text(SHIFTED)
    path = tmp_path / "two.toml"
    path.write_text(f"""
name = "two"
space = ["{ROOT / 'tests' / 'spaces' / 'faults.py'}", "{tmp_path / 'shifted.py'}"]
[oracle]
kind = "cpu"
timeout_s = 30
[[problem]]
m = 32
n = 32
k = 32
dtype = "fp32"
[strategy]
name = "exhaustive"
[budget]
trials = 4
[storage]
url = "sqlite:///{tmp_path / 'two.db'}"
""")
    exp = load_experiment(path)
    faults, shifted = targets(exp)
    with Evaluators(exp) as evaluators:
        a, b = evaluators.get(faults), evaluators.get(shifted)
        assert a.shared_worker is b.shared_worker
        steps = [(a, {"mode": "ok_fast", "size": 1}, Status.OK), (b, {"shift": 1}, Status.WRONG_RESULT),
                 (b, {"shift": 0}, Status.OK), (a, {"mode": "wrong", "size": 1}, Status.WRONG_RESULT),
                 (a, {"mode": "ok_fast", "size": 2}, Status.OK)]
        pids = set()
        for evaluator, point, status in steps:
            assert evaluator.evaluate(point, faults.problem).status is status, point
            pids.add(a.shared_worker.process._proc.pid)
        assert len(pids) == 1 and a.restarts == b.restarts == 0  # one process all along
        # a crash replaces the process; the new one starts on the space of the latest request
        assert b.evaluate({"shift": 0}, faults.problem).status is Status.OK
        assert a.evaluate({"mode": "abort", "size": 1}, faults.problem).status is Status.CRASH
        assert b.evaluate({"shift": 1}, faults.problem).status is Status.WRONG_RESULT
        assert a.evaluate({"mode": "ok_fast", "size": 3}, faults.problem).status is Status.OK
        assert a.restarts == 1


def test_the_gpu_worker_switches_space_on_request(monkeypatch, tmp_path):
    """The GPU worker's side of it, without a GPU: its oracle and cuBLAS start-up are the parts that need torch."""
    from evotune.measurement import gpu_worker, oracle
    from evotune.measurement.options import TimingOptions

    (tmp_path / "shifted.py").write_text(SHIFTED)
    monkeypatch.setattr(oracle, "Oracle", lambda timing: None)
    monkeypatch.setattr(gpu_worker, "_first_blas_call", lambda: None)
    worker = gpu_worker._Worker(str(ROOT / "tests" / "spaces" / "faults.py"), TimingOptions())
    worker.kernels[("p", "k")] = object()
    assert worker.handle(UseSpace(str(tmp_path / "shifted.py"))) == Reply(ReplyStatus.OK)
    assert worker.space.name == "shifted" and not worker.kernels
    assert worker.handle(UseSpace(str(ROOT / "tests" / "spaces" / "faults.py"))).status is ReplyStatus.OK
    assert worker.space.name == "faults"
    failed = worker.handle(UseSpace(str(tmp_path / "missing.py")))
    assert failed.status is ReplyStatus.RUNTIME_ERROR and "missing.py" in failed.message
    assert worker.space.name == "faults"

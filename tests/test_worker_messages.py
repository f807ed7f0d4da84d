"""The workers' pipe messages: typed requests and replies that cross processes, and the out-of-memory status the
GPU worker gives and acts on (without a GPU: torch's OutOfMemoryError stands in as a class of the test's own)."""

from __future__ import annotations

import io
import multiprocessing as mp
import pickle

import pytest
from conftest import ROOT

from evotune.core.problem import Problem
from evotune.core.result import Status
from evotune.core.space import SearchSpace, ordinal
from evotune.measurement.isolation import WorkerProcess
from evotune.measurement.messages import (
    CompileOnly,
    Confirm,
    DeviceInfo,
    Evaluate,
    Reply,
    ReplyStatus,
    Stop,
    TimeBaselines,
    UseSpace,
    unknown,
)
from evotune.measurement.options import ConfirmOptions, TimingOptions

PROBLEM = Problem.gemm(32, 32, 32, "fp32")


class FakeOutOfMemoryError(RuntimeError):
    """What torch.cuda.OutOfMemoryError is to the GPU worker, in these tests."""


def test_requests_and_replies_survive_pickling_as_they_cross_the_pipe():
    requests = [Evaluate({"a": 1}, PROBLEM.to_dict(), seed=3, repeats=2), TimeBaselines(PROBLEM.to_dict()),
                DeviceInfo(), Confirm([{"a": 1}], PROBLEM.to_dict(), [0.5], ConfirmOptions()),
                UseSpace("tests/spaces/faults.py"), CompileOnly({"a": 1}), Stop()]
    for request in requests:
        assert pickle.loads(pickle.dumps(request)) == request
    reply = Reply(ReplyStatus.OUT_OF_MEMORY, "time: OutOfMemoryError", compile_s=0.5, extra={"traceback": "..."},
                  baselines={"cuBLAS": {"time_ms": 1.0}}, info={"device": "x"}, confirmation={"items": {}})
    assert pickle.loads(pickle.dumps(reply)) == reply


def test_a_reply_is_recorded_with_its_evaluation_status_and_out_of_memory_as_a_runtime_error():
    ok = Reply(ReplyStatus.OK, time_ms=1.5, samples_ms=[1.4, 1.5], compile_s=2.0, bench_s=0.1, error=1e-6)
    result = ok.result()
    assert result.status is Status.OK and result.time_ms == 1.5 and result.cost_s == pytest.approx(2.1)
    assert Reply(ReplyStatus.OUT_OF_MEMORY, "oom").result().status is Status.RUNTIME_ERROR
    for status in (ReplyStatus.COMPILE_ERROR, ReplyStatus.WRONG_RESULT, ReplyStatus.RUNTIME_ERROR,
                   ReplyStatus.CRASH, ReplyStatus.TIMEOUT):
        assert Reply(status).result().status is Status(status.value)
    with pytest.raises(ValueError, match="answers no evaluation"):
        Reply(ReplyStatus.READY).result()
    assert unknown(object()).status is ReplyStatus.RUNTIME_ERROR


def test_the_gpu_worker_classifies_out_of_memory_by_its_class_not_its_message(monkeypatch):
    from evotune.measurement import gpu_worker

    monkeypatch.setattr(gpu_worker, "_out_of_memory_error", lambda: FakeOutOfMemoryError)
    classify = gpu_worker.out_of_memory_or
    assert classify(ReplyStatus.RUNTIME_ERROR, FakeOutOfMemoryError("CUDA out of memory")) \
        is ReplyStatus.OUT_OF_MEMORY
    try:  # a compiler's error around it
        try:
            raise FakeOutOfMemoryError("CUDA out of memory")
        except FakeOutOfMemoryError as inner:
            raise ValueError("launch failed") from inner
    except ValueError as wrapped:
        assert classify(ReplyStatus.COMPILE_ERROR, wrapped) is ReplyStatus.OUT_OF_MEMORY
    assert classify(ReplyStatus.RUNTIME_ERROR, RuntimeError("OutOfMemoryError: only its name")) \
        is ReplyStatus.RUNTIME_ERROR


@pytest.fixture
def worker(monkeypatch):
    """A GPU worker's request handling without a GPU: its oracle, cuBLAS start-up, memory release and context
    check are the parts that need torch."""
    from evotune.measurement import gpu_worker, oracle

    monkeypatch.setattr(oracle, "Oracle", lambda timing: None)
    monkeypatch.setattr(gpu_worker, "_first_blas_call", lambda: None)
    monkeypatch.setattr(gpu_worker, "_out_of_memory_error", lambda: FakeOutOfMemoryError)
    monkeypatch.setattr(gpu_worker, "_context_poisoned", lambda: False)
    freed: list[bool] = []
    monkeypatch.setattr(gpu_worker._Worker, "_free", staticmethod(lambda: freed.append(True)))
    w = gpu_worker._Worker(str(ROOT / "tests" / "spaces" / "faults.py"), TimingOptions())
    w.freed = freed
    return w


def _space_raising(exc: Exception) -> SearchSpace:
    def build(point, problem):
        raise exc

    return SearchSpace("raising", [ordinal("a", [1, 2])], build=build)


def test_an_out_of_memory_reply_makes_the_gpu_worker_let_its_kernels_go_and_measure_again(worker):
    worker.space = _space_raising(FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    worker.kernels[("earlier problem", "earlier point")] = object()
    worker.inputs["earlier problem"] = object()
    reply = worker.handle(Evaluate({"a": 1}, PROBLEM.to_dict(), seed=1))
    assert reply.status is ReplyStatus.OUT_OF_MEMORY and reply.extra.get("retried_after_oom") is True
    assert worker.freed == [True] and not worker.kernels and not worker.inputs
    assert "CUDA out of memory" in reply.message and reply.result().status is Status.RUNTIME_ERROR
    # with nothing held any more, a second one is the point's own: no retry
    again = worker.handle(Evaluate({"a": 2}, PROBLEM.to_dict(), seed=2))
    assert again.status is ReplyStatus.OUT_OF_MEMORY and "retried_after_oom" not in again.extra
    assert worker.freed == [True]


def test_a_failure_that_only_names_out_of_memory_in_its_message_is_not_retried(worker):
    worker.space = _space_raising(RuntimeError("the kernel printed OutOfMemoryError on purpose"))
    held = object()
    worker.kernels[("earlier problem", "earlier point")] = held
    reply = worker.handle(Evaluate({"a": 1}, PROBLEM.to_dict(), seed=1))
    assert reply.status is ReplyStatus.COMPILE_ERROR and "retried_after_oom" not in reply.extra
    assert worker.freed == [] and list(worker.kernels.values()) == [held]


def test_the_gpu_worker_answers_an_unknown_request_with_a_runtime_error(worker):
    reply = worker.handle(Stop())  # the serving loop ends on Stop before any handler sees it
    assert reply.status is ReplyStatus.RUNTIME_ERROR and "Stop" in reply.message


def test_the_evaluator_base_declares_everything_the_running_layer_uses_of_an_evaluator():
    """What running/ reads or calls on an evaluator is declared (and typed) on :class:`Evaluator`, never looked up
    with getattr: an evaluator of a new kind learns its whole interface from the base."""
    import ast

    from evotune.measurement.base import Evaluator

    names = {"evaluator", "ev"}
    used: dict[str, set[str]] = {}
    for path in sorted((ROOT / "evotune" / "running").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "hasattr") and node.args and isinstance(node.args[0], ast.Name):
                assert node.args[0].id not in names, f"{path.name}:{node.lineno} looks an evaluator up by name"
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Call):  # session.evaluator(target).cache_stats
                owner = owner.func
            if (isinstance(owner, ast.Name) and owner.id in names) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "evaluator"):
                used.setdefault(node.attr, set()).add(path.name)
    assert {"evaluate", "confirm", "baselines", "device_info", "cache_stats", "confirms"} <= set(used)
    missing = {attr: files for attr, files in used.items() if not hasattr(Evaluator, attr)}
    assert not missing, f"used on evaluators but not declared on Evaluator: {missing}"


def test_device_info_reply_holds_plain_values_so_the_tuner_never_imports_torch(monkeypatch):
    """The reply is unpickled in the tuner process: a torch type in it (``torch.__version__`` is a TorchVersion)
    would import torch there, seconds of every GPU run's start-up."""
    torch = pytest.importorskip("torch")
    from evotune.measurement.gpu_worker import device_info

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "NVIDIA H100 80GB HBM3")
    info = device_info()
    assert info["device"] == "NVIDIA H100 80GB HBM3" and info["torch"] == str(torch.__version__)
    assert all(type(v) in (str, int, float) for v in info.values()), info
    modules: list[str] = []

    class Watching(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            modules.append(module)
            return super().find_class(module, name)

    reply = Watching(io.BytesIO(pickle.dumps(Reply(ReplyStatus.OK, info=info)))).load()
    assert reply.info == info and not [m for m in modules if m.split(".")[0] == "torch"], modules


def _answers_with_text(conn) -> None:
    """A worker that says it is ready, then answers its first request with something other than a Reply."""
    conn.send(Reply(ReplyStatus.READY))
    conn.recv()
    conn.send("done")
    conn.recv()  # held open until the parent kills it


def test_a_worker_that_answers_with_no_reply_is_an_error_naming_it():
    worker = WorkerProcess(_answers_with_text, (), "test worker", 600, start=mp.get_context("fork"))
    with pytest.raises(TypeError, match="the test worker sent a str, not a Reply: 'done'"):
        worker.call(DeviceInfo())
    assert worker.restarts == 1  # killed: the next request starts a fresh one

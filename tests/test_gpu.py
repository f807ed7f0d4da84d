"""GPU tests (``pytest -m gpu``): verification, isolation of crashing and hanging candidates, real kernels.

Skipped cleanly on machines without an NVIDIA GPU (see conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evotune.core.hardware import detect
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.measurement.options import OracleOptions

pytestmark = pytest.mark.gpu

FAULTS = str(Path(__file__).parent / "spaces" / "gpu_faults.py")
FAULT_SPACE = str(Path(__file__).parent / "spaces" / "faults.py")  # both flavours; EVOTUNE_FAULTS_FLAVOUR picks
PROBLEM = Problem.gemm(1024, 1024, 1024, "bf16")


@pytest.fixture(scope="module")
def faults():
    from evotune.measurement.gpu import GpuEvaluator

    space = load_space(FAULTS)
    ev = GpuEvaluator(space, OracleOptions(timeout_s=60))
    yield ev
    ev.close()


def test_a_correct_kernel_is_verified_and_timed(faults):
    r = faults.evaluate({"mode": "ok"}, PROBLEM)
    assert r.status is Status.OK, r.message
    assert r.time_ms > 0 and len(r.samples_ms) >= 20 and r.error < 1e-2
    assert r.extra["ci95_ms"][0] <= r.time_ms <= r.extra["ci95_ms"][1]


def test_a_wrong_kernel_is_rejected(faults):
    r = faults.evaluate({"mode": "wrong"}, PROBLEM)
    assert r.status is Status.WRONG_RESULT and r.error > 1e-2 and r.time_ms is None


def test_a_compile_error_fails_only_its_trial(faults):
    r = faults.evaluate({"mode": "compile"}, PROBLEM)
    assert r.status is Status.COMPILE_ERROR and "on purpose" in r.message
    assert faults.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK


def test_an_illegal_address_is_isolated(faults):
    before = faults.restarts
    r = faults.evaluate({"mode": "crash"}, PROBLEM)
    assert r.status is Status.CRASH, r.message
    assert faults.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK  # a fresh worker took over
    assert faults.restarts == before + 1


def test_a_hanging_kernel_times_out_and_is_isolated():
    from evotune.measurement.gpu import GpuEvaluator

    space = load_space(FAULTS)
    with GpuEvaluator(space, OracleOptions(timeout_s=20)) as ev:
        assert ev.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK  # worker warm: CUDA and Triton loaded
        r = ev.evaluate({"mode": "hang"}, PROBLEM)
        assert r.status is Status.TIMEOUT
        assert ev.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_triton_matmul_points_verify_against_the_reference(dtype):
    from evotune.measurement.gpu import GpuEvaluator

    space = load_space("triton_matmul")
    problem = Problem.gemm(64, 4096, 11008 if dtype == "int8" else 4096, dtype)
    ctx = Context(detect(), problem)
    fs = space.feasible(ctx)
    points = [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": s, "num_warps": 4,
               "num_stages": 3, "num_ctas": 1} for s in (1, 4)]
    with GpuEvaluator(space) as ev:
        for p in points:
            assert p in fs
            r = ev.evaluate(p, problem)
            assert r.status is Status.OK, r.message
            if dtype == "int8":
                assert r.error == 0.0
        base = ev.baselines(problem)
        assert all(v.get("verified") for v in base.values()), base


@pytest.mark.parametrize(("dtype", "point"), [
    ("bf16", {"tile_m": 128, "tile_n": 256, "cluster": (2, 1), "swizzle": 1, "raster": "m", "stages": 4}),
    ("bf16", {"tile_m": 128, "tile_n": 128, "cluster": (1, 2), "swizzle": 4, "raster": "n", "stages": 3}),
    ("int8", {"tile_m": 128, "tile_n": 256, "cluster": (2, 1), "swizzle": 2, "raster": "m", "stages": 3}),
    ("fp8", {"tile_m": 128, "tile_n": 128, "cluster": (2, 1), "swizzle": 1, "raster": "m", "stages": 4}),
    ("fp16", {"tile_m": 64, "tile_n": 256, "cluster": (1, 1), "swizzle": 8, "raster": "n", "stages": 2}),
])
def test_cute_hopper_points_verify_against_the_reference(dtype, point):
    pytest.importorskip("cutlass.operators")
    from evotune.measurement.gpu import GpuEvaluator

    space = load_space("cute_hopper_gemm")
    problem = Problem.gemm(2048, 2048, 2048, dtype)
    ctx = Context(detect(), problem)
    assert point in space.feasible(ctx)
    with GpuEvaluator(space) as ev:
        r = ev.evaluate(point, problem)
        assert r.status is Status.OK, r.message
        assert r.compile_s > 0 and r.time_ms > 0


def test_second_run_compiles_nothing_and_lookup_returns_a_correct_kernel(tmp_path, monkeypatch):
    """A fresh evaluator finds the kernels of the first on disk; compile_best rebuilds the best one."""
    import torch

    from evotune.core.tuned_cache import remember
    from evotune.measurement.gpu import GpuEvaluator
    from evotune.measurement.workloads.gemm import make_inputs, verify
    from evotune.reporting.lookup import compile_best
    from evotune.reporting.report import Best

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    space = load_space("triton_matmul")
    problem = Problem.gemm(512, 1024, 2048, "bf16")
    ctx = Context(detect(), problem)
    fs = space.feasible(ctx)
    points = [fs.point(r) for r in range(0, len(fs), max(1, len(fs) // 3))][:3]
    runs = []
    for _ in range(2):
        with GpuEvaluator(space, OracleOptions(workers=2)) as ev:
            ev.prefetch(points, problem)
            results = [ev.evaluate(p, problem) for p in points]
            runs.append((dict(ev.cache_stats), results))
    (first, res1), (second, res2) = runs
    assert second.get("hit", 0) == sum(r.status is Status.OK for r in res2) > 0, (first, second)
    assert second.get("miss", 0) == 0
    best = min((r.time_ms, p) for r, p in zip(res1, points, strict=True) if r.time_ms)
    row = Best("gpu-test", problem.key, problem.to_dict(), "triton_matmul", space.to_storage(best[1]), best[0],
               "s", 0, "ga", 0, 3, torch.cuda.get_device_name(0), "gpu")
    db = tmp_path / "tuned.json"
    remember([row], "memory", db)
    fn = compile_best(problem, path=db)
    a, b, c = make_inputs(problem, seed=99)
    fn(a, b, c)
    torch.cuda.synchronize()
    assert verify(problem, a, b, c)[0]


def test_a_run_over_the_gpu_fault_space_loses_nothing(tmp_path, monkeypatch):
    """The GPU flavour of tests/spaces/faults.py: illegal address, hang, abort, OOM, wrong result, compile error."""
    from optuna.trial import TrialState

    from evotune.core.budget import Budget
    from evotune.measurement.gpu import GpuEvaluator
    from evotune.running.tuner import tune_study
    from evotune.search.strategies import make_strategy
    from evotune.storage.study import StudyStore

    monkeypatch.setenv("EVOTUNE_FAULTS_FLAVOUR", "gpu")  # this load and the worker processes' take the same flavour
    space = load_space(FAULT_SPACE)
    assert space.name == "faults_gpu"
    ctx = Context(detect(), PROBLEM)
    store = StudyStore.open(f"sqlite:///{tmp_path / 'faults.db'}", "faults_gpu/exhaustive", space)
    with GpuEvaluator(space, OracleOptions(timeout_s=30)) as ev:
        result = tune_study(space, ctx, ev, make_strategy("exhaustive", space, space.feasible(ctx), seed=0), store,
                      Budget(trials=100))
        restarts = ev.restarts
    trials = store.study.get_trials(deepcopy=False)
    assert all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
    status = {space.from_storage(t.params)["mode"]: t.user_attrs["status"] for t in trials}
    messages = {space.from_storage(t.params)["mode"]: t.user_attrs.get("message", "") for t in trials}
    assert status["segfault"] == "crash", messages["segfault"]  # the illegal address
    assert status["hang"] == "timeout" and status["abort"] == "crash"
    assert status["wrong"] == "wrong_result" and status["compile_error"] == "compile_error"
    assert status["oom"] in ("runtime_error", "crash") and "memory" in messages["oom"].lower(), messages["oom"]
    assert status["ok_fast"] == status["ok_slow"] == "ok"
    keys = [t.user_attrs["key"] for t in trials]
    lost, duplicates = 12 - len(trials), len(keys) - len(set(keys))
    survived = sum(t.state == TrialState.FAIL for t in trials)
    print(f"GPU faults survived: {survived}, trials lost: {lost}, duplicates: {duplicates}, "
          f"workers replaced: {restarts}; {result.failures}")
    assert result.trials == 12 and survived == 6 and lost == 0 and duplicates == 0


def test_confirmation_re_times_the_points_beside_the_baseline(faults):
    """The confirmation stage on a real GPU: both points and cuBLAS re-timed in rounds, medians tight."""
    from evotune.measurement.options import ConfirmOptions

    points = [{"mode": "ok"}, {"mode": "wrong"}]
    record = faults.confirm(points, PROBLEM, [0.05, 0.04])
    assert "error" not in record, record
    key_ok = faults.space.key(points[0])
    assert set(record["configs"]) == {key_ok}  # a point that fails verification is left out, with its reason
    assert faults.space.key(points[1]) in record["skipped"]
    assert record["baselines"] == ["torch.matmul"]
    opts = ConfirmOptions()
    assert record["rounds"] >= opts.min_rounds
    for name in (key_ok, "torch.matmul"):
        item = record["items"][name]
        assert item["samples"] == opts.per_round * record["rounds"]
        assert item["ci95_ms"][0] <= item["median_ms"] <= item["ci95_ms"][1]
    assert record["items"][key_ok]["search_ms"] == 0.05

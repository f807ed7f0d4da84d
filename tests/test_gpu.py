"""GPU tests (``pytest -m gpu``): verification, isolation of crashing and hanging candidates, real kernels.

Skipped cleanly on machines without an NVIDIA GPU (see conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evotune.evaluation.result import Status
from evotune.hardware import detect
from evotune.plugins import load_space
from evotune.problem import Problem
from evotune.space import Context

pytestmark = pytest.mark.gpu

FAULTS = str(Path(__file__).parent / "spaces" / "gpu_faults.py")
PROBLEM = Problem.gemm(1024, 1024, 1024, "bf16")


@pytest.fixture(scope="module")
def faults():
    from evotune.evaluation.gpu import GpuEvaluator

    space = load_space(FAULTS)
    ev = GpuEvaluator(space, Context(detect(), PROBLEM), timeout_s=60)
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
    from evotune.evaluation.gpu import GpuEvaluator

    space = load_space(FAULTS)
    with GpuEvaluator(space, Context(detect(), PROBLEM), timeout_s=20) as ev:
        assert ev.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK  # worker warm: CUDA and Triton loaded
        r = ev.evaluate({"mode": "hang"}, PROBLEM)
        assert r.status is Status.TIMEOUT
        assert ev.evaluate({"mode": "ok"}, PROBLEM).status is Status.OK


@pytest.mark.parametrize("dtype", ["bf16", "int8"])
def test_triton_matmul_points_verify_against_the_reference(dtype):
    from evotune.evaluation.gpu import GpuEvaluator

    space = load_space("triton_matmul")
    problem = Problem.gemm(64, 4096, 11008 if dtype == "int8" else 4096, dtype)
    ctx = Context(detect(), problem)
    fs = space.feasible(ctx)
    points = [{"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": s, "num_warps": 4,
               "num_stages": 3, "num_ctas": 1} for s in (1, 4)]
    with GpuEvaluator(space, ctx) as ev:
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
])
def test_cute_hopper_points_verify_against_the_reference(dtype, point):
    pytest.importorskip("cutlass.operators")
    from evotune.evaluation.gpu import GpuEvaluator

    space = load_space("cute_hopper_gemm")
    problem = Problem.gemm(2048, 2048, 2048, dtype)
    ctx = Context(detect(), problem)
    assert point in space.feasible(ctx)
    with GpuEvaluator(space, ctx) as ev:
        r = ev.evaluate(point, problem)
        assert r.status is Status.OK, r.message
        assert r.compile_s > 0 and r.time_ms > 0

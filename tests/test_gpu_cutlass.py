"""GPU tests of the CUTLASS C++ sm90 space (``pytest -m gpu``): kernels built by nvcc in the compile pool,
verified and timed; a wrong kernel rejected; a second evaluator served from the kernel cache."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from evotune.core.hardware import detect
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.measurement.options import OracleOptions

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    shutil.which("nvcc") is None or importlib.util.find_spec("cutlass_library") is None,
    reason="needs nvcc and nvidia-cutlass's C++ headers")]

WRONG = str(Path(__file__).parent / "spaces" / "cutlass_wrong_k.py")
BASE = {"swap_ab": False, "schedule": "cooperative", "epilogue": "tma", "scheduler": "persistent", "tile_m": 128,
        "tile_n": 128, "tile_k": 64, "cluster": (2, 1), "stages": 0, "raster": "m", "swizzle": 1,
        "decomposition": "heuristic", "splits": 1}
# (problem, point): each schedule, both epilogues, stream-K and split-K, swapped A/B, int8 and fp16
CASES = [
    (Problem.gemm(1024, 2048, 4096, "bf16"), BASE),
    (Problem.gemm(64, 4096, 11008, "bf16"), dict(BASE, swap_ab=True, tile_n=64, scheduler="streamk",
                                                  decomposition="splitk", splits=3, raster="n")),
    (Problem.gemm(16, 4096, 4096, "bf16"), dict(BASE, swap_ab=True, tile_n=16, scheduler="streamk",
                                                 decomposition="streamk", epilogue="nosmem", stages=6)),
    (Problem.gemm(512, 1024, 2048, "fp16"), dict(BASE, schedule="pingpong", tile_m=64, tile_n=256, cluster=(1, 2),
                                                  swizzle=2)),
    (Problem.gemm(64, 4096, 4096, "int8"), dict(BASE, tile_k=128, schedule="pingpong", tile_m=64)),
]


def _precompile(case: tuple[Problem, dict]) -> bool:
    from search_spaces import _cutlass_sm90 as cpp

    return cpp.precompile(case[1], case[0])


def test_cutlass_kernels_verify_and_a_second_evaluator_compiles_nothing(tmp_path, monkeypatch):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from evotune.measurement.gpu import GpuEvaluator

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    space = load_space("cutlass_sm90_gemm")
    for problem, point in CASES:
        assert space.check(point, Context(detect(), problem)) is None, (problem, point)
    # nvcc takes about a minute per kernel: build them side by side, as the compile pool does
    with ProcessPoolExecutor(len(CASES), mp_context=mp.get_context("spawn")) as pool:
        assert list(pool.map(_precompile, CASES)) == [False] * len(CASES)  # none was in the cache before
    stats: dict[str, int] = {}
    for problem, point in CASES:  # a fresh evaluator (and GPU worker) per case: each loads from disk
        with GpuEvaluator(space, OracleOptions(timeout_s=400)) as ev:
            r = ev.evaluate(point, problem)
            assert r.status is Status.OK, (problem.key, point, r.message)
            assert r.time_ms > 0 and (r.error == 0.0 if problem.dtype == "int8" else r.error < 2e-2)
            for k, v in ev.cache_stats.items():
                stats[k] = stats.get(k, 0) + v
    assert stats == {"hit": len(CASES)}, stats
    # shape-free: another shape and other launch arguments reuse the first case's binary
    problem = Problem.gemm(2048, 1024, 1024, "bf16")
    with GpuEvaluator(space, OracleOptions(timeout_s=400)) as ev:
        r = ev.evaluate(dict(BASE, raster="n", swizzle=4), problem)
        assert r.status is Status.OK and ev.cache_stats == {"hit": 1}, (r.message, ev.cache_stats)


def test_a_cutlass_kernel_that_computes_the_wrong_product_is_rejected(tmp_path, monkeypatch):
    from evotune.measurement.gpu import GpuEvaluator

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    problem = Problem.gemm(1024, 2048, 4096, "bf16")
    with GpuEvaluator(load_space(WRONG), OracleOptions(timeout_s=400)) as ev:
        r = ev.evaluate(BASE, problem)
    assert r.status is Status.WRONG_RESULT and r.time_ms is None, r.message

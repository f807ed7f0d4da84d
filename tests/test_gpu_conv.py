"""GPU tests of the CUTLASS C++ int8 conv2d space (``pytest -m gpu``): kernels built by nvcc in a process pool,
verified against the exact convolution and timed; a kernel fed the wrong filter layout rejected; a second
evaluator served from the kernel cache; the hand-picked configuration and cuDNN timed as baselines."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from evotune.core.hardware import detect
from evotune.core.plugins import load_space
from evotune.core.problem import get_workload
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.measurement.options import OracleOptions
from search_spaces.cutlass_conv2d_int8 import HAND_PICKED

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    shutil.which("nvcc") is None or importlib.util.find_spec("cutlass_library") is None,
    reason="needs nvcc and nvidia-cutlass's C++ headers")]

UNREORDERED = str(Path(__file__).parent / "spaces" / "cutlass_conv_unreordered.py")
CONV = get_workload("conv2d")


def _conv(**fields):
    return CONV.parse({"dtype": "int8", "layout": "nc32hw32", "R": 3, "S": 3, "pad": 1, **fields})


# (problem, point): both iterators, both MMA instructions, a 2-stage Turing pipeline, stride 2, a 1x1 filter,
# a swizzled walk and NHWC with 8-wide loads
CASES = [
    (_conv(N=2, C=128, H=72, W=120, K=128), HAND_PICKED),
    (_conv(N=4, C=64, H=28, W=28, K=256, stride=2), dict(HAND_PICKED, tb_m=64, tb_n=32, tb_k=32, warp_m=32,
                                                          warp_n=32, instruction=(8, 8, 16), stages=2,
                                                          iterator="analytic", swizzle=4)),
    (_conv(N=4, C=256, H=14, W=14, K=256, R=1, S=1, pad=0), dict(HAND_PICKED, tb_m=256, tb_n=64, tb_k=128,
                                                                   warp_n=32, stages=3, swizzle=2)),
    (_conv(N=2, C=64, H=20, W=20, K=64, layout="nhwc"), dict(HAND_PICKED, tb_n=64, warp_n=32, alignment=8,
                                                             stages=3)),
]


def _precompile(case):
    from search_spaces import _cutlass_conv as cc

    return cc.precompile(case[1], case[0])


def test_cutlass_conv_kernels_verify_and_a_second_evaluator_compiles_nothing(tmp_path, monkeypatch):
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from evotune.measurement.gpu import GpuEvaluator

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    space = load_space("cutlass_conv2d_int8")
    for problem, point in CASES:
        assert space.check(point, Context(detect(), problem)) is None, (problem.key, point)
    with ProcessPoolExecutor(len(CASES), mp_context=mp.get_context("spawn")) as pool:
        assert list(pool.map(_precompile, CASES)) == [False] * len(CASES)
    stats: dict[str, int] = {}
    for problem, point in CASES:  # a fresh evaluator (and GPU worker) per case: each loads from disk
        with GpuEvaluator(space, OracleOptions(timeout_s=300)) as ev:
            r = ev.evaluate(point, problem)
            assert r.status is Status.OK, (problem.key, point, r.message)
            assert r.time_ms > 0 and r.error <= 1, (problem.key, r.error)
            for k, v in ev.cache_stats.items():
                stats[k] = stats.get(k, 0) + v
    assert stats == {"hit": len(CASES)}, stats
    # shape-free: another convolution, and another swizzle, reuse the hand-picked binary
    problem = _conv(N=3, C=96, H=17, W=23, K=160, stride=2)
    with GpuEvaluator(space, OracleOptions(timeout_s=300)) as ev:
        r = ev.evaluate(dict(HAND_PICKED, swizzle=2), problem)
        assert r.status is Status.OK and ev.cache_stats == {"hit": 1}, (r.message, ev.cache_stats)


def test_a_conv_kernel_reading_the_filter_in_the_wrong_layout_is_rejected(tmp_path, monkeypatch):
    from evotune.measurement.gpu import GpuEvaluator

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    problem = CASES[0][0]
    with GpuEvaluator(load_space(UNREORDERED), OracleOptions(timeout_s=300)) as ev:
        r = ev.evaluate(HAND_PICKED, problem)
    assert r.status is Status.WRONG_RESULT and r.time_ms is None, r.message


def test_the_hand_picked_configuration_and_cudnn_are_timed_as_baselines(tmp_path, monkeypatch):
    from evotune.measurement.gpu import GpuEvaluator

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    problem = CASES[0][0]
    with GpuEvaluator(load_space("cutlass_conv2d_int8"), OracleOptions()) as ev:
        baselines = ev.baselines(problem)
    print(baselines)
    hand = baselines["cutlass_conv2d_int8: hand-picked 128x128x64 4-stage"]
    assert hand["verified"] is True and hand["time_ms"] > 0, hand
    fp16 = baselines["cudnn fp16 conv2d (torch, channels_last)"]
    assert fp16["verified"] is None and fp16["time_ms"] > 0, fp16  # another precision: timed, not verified
    int8 = baselines["cudnn int8 conv2d (frontend graph)"]
    assert int8.get("time_ms", 0) > 0 or int8["error"], int8  # cuDNN may have no engine for it: then why


# sm90 (TMA im2col + WGMMA), NHWC: a 2x2 cluster with six stages, the epilogue straight from registers, a 1x1
# filter with automatic stages and stride 2 with a narrow tile
SM90_CASES = [
    (_conv(N=2, C=128, H=36, W=60, K=128, layout="nhwc"),
     {"tile_m": 256, "tile_n": 64, "tile_k": 64, "cluster": (2, 2), "stages": 6, "epilogue": "tma"}),
    (_conv(N=4, C=64, H=28, W=28, K=64, stride=2, layout="nhwc"),
     {"tile_m": 64, "tile_n": 128, "tile_k": 128, "cluster": (1, 1), "stages": 0, "epilogue": "nosmem"}),
    (_conv(N=4, C=256, H=14, W=14, K=256, R=1, S=1, pad=0, layout="nhwc"),
     {"tile_m": 64, "tile_n": 128, "tile_k": 64, "cluster": (2, 1), "stages": 2, "epilogue": "tma"}),
]


def _precompile_sm90(case):
    from search_spaces import _cutlass_sm90_conv as sc

    return sc.precompile(case[1], case[0])


def test_sm90_conv_kernels_verify_and_the_cutlass_2x_hand_picked_kernel_is_timed_beside_them():
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from evotune.measurement.gpu import GpuEvaluator

    space = load_space("cutlass_sm90_conv2d_int8")
    for problem, point in SM90_CASES:
        assert space.check(point, Context(detect(), problem)) is None, (problem.key, point)
    with ProcessPoolExecutor(len(SM90_CASES), mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_precompile_sm90, SM90_CASES))  # into the session's kernel cache: about a minute each
    for problem, point in SM90_CASES:
        with GpuEvaluator(space, OracleOptions(timeout_s=300)) as ev:
            r = ev.evaluate(point, problem)
            assert r.status is Status.OK, (problem.key, point, r.message)
            assert r.time_ms > 0 and r.error <= 1 and ev.cache_stats == {"hit": 1}, (r.error, ev.cache_stats)
    problem = SM90_CASES[0][0]
    with GpuEvaluator(space, OracleOptions()) as ev:
        baselines = ev.baselines(problem)
    label = "cutlass_conv2d_int8 hand-picked 128x128x64 4-stage"
    assert baselines[f"{label} (nhwc)"]["verified"] is True, baselines
    # the same convolution in the layout it was picked for: its own copies of the inputs, timed, not verified
    assert baselines[f"{label} (nc32hw32)"]["time_ms"] > 0, baselines


# A shape whose confirmation faulted (an illegal address) when every item's CUDA graph was captured at the start and
# kept: the cuDNN baseline's graph, captured before the CUTLASS ones, no longer had its memory once they were
# captured. The stage now captures each item's graph for its round only.
CONFIRM_CASE = (_conv(N=8, C=64, H=56, W=56, K=256, R=1, S=1, pad=0, layout="nhwc"),
                {"tile_m": 64, "tile_n": 128, "tile_k": 64, "cluster": (2, 1), "stages": 3, "epilogue": "tma"})


def test_an_sm90_conv_is_confirmed_beside_cudnn_and_the_hand_picked_kernels():
    from evotune.measurement.gpu import GpuEvaluator

    space = load_space("cutlass_sm90_conv2d_int8")
    problem, point = CONFIRM_CASE
    _precompile_sm90(CONFIRM_CASE)
    with GpuEvaluator(space, OracleOptions(timeout_s=300)) as ev:
        record = ev.confirm([point], problem, [0.02])
    assert record is not None and "error" not in record, record
    assert set(record["configs"]) == {space.key(point)}
    timed = set(record["items"]) | set(record.get("raced_out", {}))
    assert "cudnn fp16 conv2d (torch, channels_last)" in timed, record
    assert {"cutlass_conv2d_int8 hand-picked 128x128x64 4-stage (nhwc)",
            "cutlass_conv2d_int8 hand-picked 128x128x64 4-stage (nc32hw32)"} <= timed, record


"""CPU tests of the CUTLASS C++ sm90 space: its rules, the C++ it emits, its shape-free cache key, the estimate."""

from __future__ import annotations

import importlib.util
import math
import shutil

import numpy as np
import pytest

from evotune.core.hardware import get_hardware
from evotune.core.plugins import builtin_names, load_space
from evotune.core.problem import Problem
from evotune.core.space import Context
from search_spaces import _cutlass_build as cb
from search_spaces import _cutlass_sm90 as cpp
from search_spaces.cutlass_sm90_gemm import SPACE

H100 = get_hardware("H100")
BF16 = Problem.gemm(4096, 4096, 4096, "bf16")
SKINNY = Problem.gemm(16, 4096, 11008, "bf16")
POINT = {"swap_ab": False, "schedule": "cooperative", "epilogue": "tma", "scheduler": "persistent", "tile_m": 128,
         "tile_n": 256, "tile_k": 64, "cluster": (2, 1), "stages": 0, "raster": "m", "swizzle": 1,
         "decomposition": "heuristic", "splits": 1}
STREAM_K = dict(POINT, scheduler="streamk", decomposition="streamk")


def ctx(problem: Problem = BF16) -> Context:
    return Context(H100, problem)


def test_the_space_is_a_builtin_and_prunes_on_chips_without_wgmma():
    assert "cutlass_sm90_gemm" in builtin_names() and load_space("cutlass_sm90_gemm").name == "cutlass_sm90_gemm"
    assert len(SPACE.feasible(ctx())) > 10_000
    assert len(SPACE.feasible(Context(get_hardware("B200"), BF16))) == 0
    assert len(SPACE.feasible(Context(get_hardware("A100"), BF16))) == 0
    assert SPACE.check(POINT, ctx()) is None and SPACE.check(STREAM_K, ctx()) is None
    # 192 accumulators per consumer thread build without spills (ptxas), 256 spill
    assert SPACE.check(dict(POINT, tile_m=256, tile_n=192), ctx()) is None
    assert SPACE.check(dict(POINT, schedule="pingpong", tile_m=128, tile_n=192), ctx()) is None


@pytest.mark.parametrize("change,rule", [
    ({"schedule": "pingpong", "tile_n": 128, "scheduler": "streamk", "decomposition": "streamk"},
     "streamk-cooperative"),
    ({"tile_m": 64}, "cooperative-tile-m"),
    ({"tile_m": 256, "tile_n": 256}, "accumulators"),
    ({"schedule": "pingpong", "tile_m": 128, "tile_n": 256}, "accumulators"),
    ({"decomposition": "splitk", "splits": 2}, "decomposition-streamk"),
    ({"scheduler": "streamk", "splits": 4}, "splits"),
    ({"scheduler": "streamk", "decomposition": "splitk", "splits": 1}, "splits"),
    ({"tile_k": 256}, "tile-k"),
    ({"tile_m": 256, "tile_n": 128, "tile_k": 128, "stages": 6}, "smem"),
])
def test_each_rule_names_itself_and_the_values(change, rule):
    reason = SPACE.check(dict(POINT, **change), ctx())
    assert reason is not None and reason.startswith(rule + ":"), reason
    assert "{" not in reason


def test_splits_must_leave_a_whole_tile_k_per_slice():
    small_k = Problem.gemm(4096, 4096, 128, "bf16")
    point = dict(STREAM_K, decomposition="splitk", splits=4)
    assert SPACE.check(point, ctx()) is None
    assert SPACE.check(point, ctx(small_k)).startswith("splits-fit-k:")


def test_int8_needs_k_major_operands_and_takes_its_own_tile_k():
    int8 = Problem.gemm(64, 4096, 4096, "int8")
    assert SPACE.check(dict(POINT, tile_k=128), ctx(int8)) is None
    assert SPACE.check(dict(POINT, tile_k=64), ctx(int8)) is None  # 64 bytes: the 64-byte swizzle
    assert SPACE.check(dict(POINT, tile_k=128), ctx(Problem.gemm(64, 4096, 4096, "int8", "nn"))).startswith(
        "8bit-k-major:")


@pytest.mark.slow  # about 2.5 s: kept out of the fast lane (its 3-minute margin)
def test_every_pruning_message_is_formatted():
    for problem in (BF16, SKINNY, Problem.gemm(4096, 4098, 4100, "fp16", "nt"), Problem.gemm(16, 64, 64, "fp8")):
        for reason in SPACE.feasible(ctx(problem)).reasons.values():
            assert "{" not in reason and "}" not in reason, reason


def test_the_source_declares_the_configuration():
    src = cpp.source(POINT, BF16)
    for text in ("cutlass::bfloat16_t", "Shape<_128, _256, _64>", "Shape<_2, _1, _1>",
                 "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                 "cutlass::epilogue::TmaWarpSpecializedCooperative",
                 "cutlass::gemm::PersistentScheduler", "StageCountAutoCarveout", "kStreamK = false",
                 "using LayoutA = cutlass::layout::RowMajor", "using LayoutB = cutlass::layout::ColumnMajor",
                 'extern "C" int evotune_gemm', 'extern "C" int evotune_workspace'):
        assert text in src, text
    streamk = cpp.source(dict(STREAM_K, epilogue="nosmem", stages=4), Problem.gemm(64, 4096, 4096, "int8"))
    for text in ("int8_t", "using ElementD = int32_t", "cutlass::gemm::StreamKScheduler", "kStreamK = true",
                 "cutlass::epilogue::NoSmemWarpSpecialized", "StageCount<4>"):
        assert text in streamk, text
    pingpong = cpp.source(dict(POINT, schedule="pingpong", tile_m=64, tile_n=128), BF16)
    assert "KernelTmaWarpSpecializedPingpong" in pingpong and "cutlass::epilogue::TmaWarpSpecialized>" in pingpong


def test_swapping_a_and_b_transposes_the_layouts():
    # tn: A row-major (m x k), B column-major (k x n), D row-major. Swapped, the kernel computes D^T = B^T A^T:
    # its A is B^T (n x k, row-major), its B is A^T (k x m, column-major), its D is D^T, column-major.
    assert cpp.kernel_problem(POINT, BF16) == (cpp.ROW, cpp.COL, cpp.ROW)
    assert cpp.kernel_problem(dict(POINT, swap_ab=True), BF16) == (cpp.ROW, cpp.COL, cpp.COL)
    nn = Problem.gemm(64, 4096, 4096, "bf16", "nn")
    assert cpp.kernel_problem(POINT, nn) == (cpp.COL, cpp.COL, cpp.ROW)
    assert cpp.kernel_problem(dict(POINT, swap_ab=True), nn) == (cpp.ROW, cpp.ROW, cpp.COL)
    assert cpp.runtime_args(dict(POINT, swap_ab=True), SKINNY, 132)[:3] == (4096, 16, 11008)
    assert cpp.runtime_args(dict(STREAM_K, raster="n", swizzle=4, decomposition="splitk", splits=3), SKINNY, 132) == (
        16, 4096, 11008, cpp.RASTER["n"], 4, cpp.DECOMPOSITION["splitk"], 3, 132)


def test_the_cache_key_holds_only_what_the_compiler_sees(monkeypatch):
    monkeypatch.setattr(cb, "toolchain", lambda: ("nvcc 13.0", "4.2.0"))
    key = cpp.cache_key(POINT, BF16)
    # every problem of the same dtype and layout, and every launch argument, share one binary
    assert cpp.cache_key(dict(POINT, raster="n", swizzle=8), SKINNY) == key
    assert cpp.cache_key(STREAM_K, BF16) != key  # another tile scheduler
    assert cpp.cache_key(dict(STREAM_K, decomposition="splitk", splits=4), BF16) == cpp.cache_key(STREAM_K, BF16)
    for knob, value in [("tile_n", 128), ("stages", 4), ("swap_ab", True), ("epilogue", "nosmem"), ("cluster", (1, 1))]:
        assert cpp.cache_key(dict(POINT, **{knob: value}), BF16) != key, knob
    assert cpp.cache_key(POINT, Problem.gemm(4096, 4096, 4096, "fp16")) != key
    assert cpp.cache_key(POINT, Problem.gemm(4096, 4096, 4096, "bf16", "nn")) != key
    assert set(cpp.COMPILE_KNOBS) < set(SPACE.names)


def test_the_estimate_is_finite_and_favours_a_narrow_swapped_tile_for_a_skinny_gemm():
    fs = SPACE.feasible(ctx(SKINNY))
    rows = np.random.default_rng(0).choice(len(fs), 500, replace=False)
    for r in rows:
        ms = SPACE.estimate(fs.point(int(r)), ctx(SKINNY))
        assert math.isfinite(ms) and ms > 0
    narrow = dict(POINT, swap_ab=True, tile_m=128, tile_n=16)
    padded = dict(POINT, tile_m=128, tile_n=64)
    assert SPACE.check(narrow, ctx(SKINNY)) is None and SPACE.check(padded, ctx(SKINNY)) is None
    # 16 rows in a 128-row tile waste 7/8 of each WGMMA; swapped, they fill a 16-wide tile N
    assert SPACE.estimate(narrow, ctx(SKINNY)) < SPACE.estimate(padded, ctx(SKINNY))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None or importlib.util.find_spec("cutlass_library") is None,
                    reason="needs nvcc and nvidia-cutlass's C++ headers")
def test_nvcc_compiles_a_configuration_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path))
    point = dict(POINT, tile_n=128, cluster=(1, 1))
    assert cpp.precompile(point, BF16) is False
    assert cpp.precompile(dict(point, raster="n", swizzle=2), SKINNY) is True  # shape-free, launch arguments free

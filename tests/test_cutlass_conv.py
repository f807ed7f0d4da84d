"""The CUTLASS C++ int8 conv2d space on the CPU: its rules against what nvcc and the H100 said, the generated
source, the cache key, the filter reorder, and replaying the recorded H100 conv landscapes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, replay_experiment

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.landscape import load_landscape
from evotune.core.plugins import builtin_names, load_space
from evotune.core.problem import get_workload
from evotune.core.space import Context
from search_spaces import _cutlass_build as cb
from search_spaces import _cutlass_conv as cc
from search_spaces.cutlass_conv2d_int8 import HAND_PICKED, SPACE, interleaved_thread_map, smem_bytes

CONV = get_workload("conv2d")
SEED = CONV.parse({"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8",
                   "layout": "nc32hw32"})
LANDSCAPES = sorted((ROOT / "evotune" / "landscapes" / "h100_conv").glob("*.json.gz"))


def ctx(problem=SEED):
    return Context(get_hardware("H100"), problem)


def test_the_space_is_built_in_and_serves_conv2d():
    assert "cutlass_conv2d_int8" in builtin_names()
    assert SPACE.workload == "conv2d" and SPACE.named == {"hand-picked 128x128x64 4-stage": HAND_PICKED}
    assert SPACE.check(HAND_PICKED, ctx()) is None
    assert len(SPACE.feasible(ctx())) == 978


@pytest.mark.parametrize(("change", "field", "rule"), [
    ({"tb_k": 32}, {}, "warp-k-steps"),
    ({"instruction": (8, 8, 16)}, {}, "turing-two-stage"),
    ({"epilogue": 4}, {}, "interleaved-epilogue"),
    ({"alignment": 8}, {}, "interleaved-alignment"),
    ({"iterator": "fixed_channels"}, {}, "iterator-layout"),
    ({"tb_m": 64, "tb_n": 32, "tb_k": 128, "warp_m": 32, "warp_n": 32}, {}, "interleaved-thread-map"),
    ({"stages": 6, "tb_m": 256, "tb_n": 256, "tb_k": 128}, {}, "registers"),
    ({"swizzle": 4}, {}, "swizzle-band"),
    ({}, {"scaling": "channel"}, "scaling"),
    ({}, {"dtype": "fp16", "layout": "nhwc"}, "dtype"),
])
def test_each_rule_prunes_with_its_reason(change, field, rule):
    problem = CONV.parse({"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1,
                          "dtype": "int8", "layout": "nc32hw32", **field})
    reason = SPACE.check(dict(HAND_PICKED, **change), ctx(problem))
    assert reason is not None and reason.startswith(rule + ":"), reason
    assert "{" not in reason  # every field of the message was filled in


# What nvcc 13.0 said of the interleaved thread map (CUTLASS 4.2 headers, on the CPU machine):
# (tb_m, tb_n, tb_k, warp_m, warp_n) -> compiled
COMPILED = {
    (64, 32, 128, 32, 32): False, (128, 32, 32, 32, 32): False, (64, 32, 128, 64, 32): False,
    (128, 32, 128, 64, 32): False, (64, 64, 128, 32, 64): False, (64, 64, 128, 64, 32): False,
    (128, 128, 128, 64, 64): True, (128, 32, 32, 64, 32): True, (64, 32, 32, 64, 32): True,
    (128, 32, 128, 32, 32): True, (256, 32, 128, 32, 32): True, (128, 32, 64, 64, 32): True,
    (256, 64, 64, 64, 32): True, (64, 128, 64, 64, 32): True, (128, 256, 64, 64, 64): True,
}


@pytest.mark.parametrize(("tile", "compiled"), COMPILED.items(), ids=[str(t) for t in COMPILED])
def test_the_interleaved_thread_map_rule_agrees_with_nvcc(tile, compiled):
    point = dict(HAND_PICKED, **dict(zip(("tb_m", "tb_n", "tb_k", "warp_m", "warp_n"), tile, strict=True)))
    assert interleaved_thread_map(point) == compiled


def test_the_nhwc_rules_agree_with_nvcc():
    nhwc = CONV.parse({"N": 8, "C": 64, "H": 56, "W": 56, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8"})
    # three tiles nvcc refused ("Number of iterations must be non-zero"), and one it built
    for tile, alignment in [((256, 32, 64, 32, 32), 16), ((256, 32, 64, 32, 32), 4), ((128, 32, 32, 32, 32), 4)]:
        knobs = dict(zip(("tb_m", "tb_n", "tb_k", "warp_m", "warp_n"), tile, strict=True))
        point = dict(HAND_PICKED, alignment=alignment, instruction=(8, 8, 16), stages=2, **knobs)
        assert SPACE.check(point, ctx(nhwc)).startswith("nhwc-thread-map:"), tile
    assert SPACE.check(dict(HAND_PICKED, tb_m=256, tb_n=32, warp_n=32, alignment=8), ctx(nhwc)) is None
    assert SPACE.check(dict(HAND_PICKED, epilogue=16), ctx(nhwc)).startswith("nhwc-epilogue:")


def test_the_shared_memory_model_equals_the_binaries():
    # sizeof(Kernel::SharedStorage) of libraries built by nvcc: (tb_m, tb_n, tb_k, stages) -> bytes
    for (m, n, k, stages), smem in {(128, 128, 128, 4): 131072, (128, 32, 32, 2): 10240, (128, 128, 64, 5): 81920,
                                    (256, 128, 128, 3): 147456, (128, 256, 64, 6): 147456,
                                    (64, 32, 64, 6): 36864}.items():
        assert smem_bytes(dict(HAND_PICKED, tb_m=m, tb_n=n, tb_k=k, stages=stages)) == smem


def test_the_source_is_shape_free_and_the_swizzle_stays_out_of_the_cache_key(monkeypatch):
    monkeypatch.setattr(cb, "toolchain", lambda: ("nvcc 13.0", "4.2.0"))
    src = cc.source(HAND_PICKED, SEED)
    assert "DefaultConv2dFprop" in src and "TensorNCxHWx<32>" in src and "TensorCxRSKx<32>" in src
    assert "GemmShape<128, 128, 64>" in src and "cutlass::arch::Sm80" in src and "kOptimized" in src
    assert "10, 128, 72" not in src  # the problem is an argument
    assert "cutlass::arch::Sm75" in cc.source(dict(HAND_PICKED, instruction=(8, 8, 16), stages=2), SEED)
    assert "TensorNHWC" in cc.source(HAND_PICKED, CONV.parse({"N": 1, "C": 64, "H": 8, "W": 8, "K": 64, "R": 1,
                                                              "S": 1, "dtype": "int8"}))
    key = cc.cache_key(HAND_PICKED, SEED)
    other = CONV.parse({"N": 3, "C": 96, "H": 17, "W": 23, "K": 160, "R": 3, "S": 3, "stride": 2, "dtype": "int8",
                        "layout": "nc32hw32"})
    assert cc.cache_key(dict(HAND_PICKED, swizzle=4), other) == key
    for knob, value in [("tb_n", 64), ("stages", 3), ("iterator", "analytic"), ("warp_n", 32)]:
        assert cc.cache_key(dict(HAND_PICKED, **{knob: value}), SEED) != key, knob
    assert cc.shape_args(SEED) == (10, 72, 120, 128, 128, 3, 3, 72, 120, 1, 1, 1)


def test_the_filter_is_reordered_as_cutlass_reorder_convk_does():
    k = 64
    order = cc.interleaved_k_order(k)
    assert sorted(order) == list(range(k)) and order[:10] == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]
    w = np.random.default_rng(0).integers(-8, 8, (k, 2, 3, 3, 32), dtype=np.int8)  # (K, C/32, R, S, 32)
    out = cc.kernel_filter(w, "nc32hw32")  # (C/32, R, S, K, 32), filter n at position order[n]
    assert out.shape == (2, 3, 3, k, 32)
    for n in (0, 2, 9, 33, 63):
        assert (out[:, :, :, order[n], :] == w[n]).all()
    assert cc.kernel_filter(w, "nhwc") is w


def test_the_recorded_conv_landscapes_match_the_space_and_carry_their_baselines():
    assert len(LANDSCAPES) == 2
    for path in LANDSCAPES:
        assert path.stat().st_size < 300_000
        ls = load_landscape(path)
        assert ls.space_name == "cutlass_conv2d_int8" and ls.names == SPACE.names
        feasible = SPACE.feasible(ctx(ls.problem))
        assert ls.meta["feasible"] == len(feasible) and not ls.meta["complete"]  # best estimate first, in part
        for values in ls.entries:
            assert SPACE.check(dict(zip(ls.names, values, strict=True)), ctx(ls.problem)) is None
        hand = ls.baselines["cutlass_conv2d_int8: hand-picked 128x128x64 4-stage"]
        assert hand["verified"] and hand["time_ms"] > 0
        assert {"cudnn fp16 conv2d (torch, channels_last)", "cudnn int8 conv2d (frontend graph)"} < set(ls.baselines)


def test_evotune_run_replays_the_conv_landscapes(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTUNE_TUNED", str(tmp_path / "tuned.json"))
    exp = replay_experiment(tmp_path / "replay_conv.toml", name="replay_h100_conv", strategy="default", trials=40,
                            url=f"journal:{tmp_path / 'replay.journal'}", landscapes=tuple(LANDSCAPES),
                            extra=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')
    assert main(["run", str(exp), "--no-plots", "--no-progress"]) == 0
    rows = {r["problem_key"]: r for r in json.loads((tmp_path / "best.json").read_text())}
    assert set(rows) == {load_landscape(p).problem.key for p in LANDSCAPES}
    for row in rows.values():
        assert row["fraction_of_optimum"] >= 0.9 and row["tflops"] > 0
        assert set(row["baselines"]) >= {"cutlass_conv2d_int8: hand-picked 128x128x64 4-stage"}


def test_load_space_by_name_and_the_cli_lists_it_for_its_own_problem(capsys):
    assert load_space("cutlass_conv2d_int8").name == "cutlass_conv2d_int8"
    assert main(["spaces"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "cutlass_conv2d_int8" in line)
    assert "(for conv2d" in row and " 978 " in row  # pruned for its own default convolution, not the GEMM

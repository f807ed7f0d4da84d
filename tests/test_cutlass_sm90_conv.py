"""The CUTLASS C++ sm90 int8 conv2d space on the CPU: its rules, its shared-memory model against the binaries
nvcc built, the generated source and cache key, the estimate's ordering of what the H100 measured, and the
space's own baselines in the GPU worker."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import ROOT

from evotune.core.hardware import get_hardware
from evotune.core.plugins import builtin_names, load_space
from evotune.core.problem import get_workload
from evotune.core.space import Context
from evotune.measurement import gpu_worker
from evotune.running.experiment import load_experiment
from search_spaces import _cutlass_build as cb
from search_spaces import _cutlass_sm90_conv as sc
from search_spaces.cutlass_sm90_conv2d_int8 import SPACE, smem_bytes

CONV = get_workload("conv2d")
SEED = CONV.parse({"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8",
                   "layout": "nhwc"})
POINT = {"tile_m": 128, "tile_n": 128, "tile_k": 128, "cluster": (1, 1), "stages": 0, "epilogue": "tma"}


def ctx(problem=SEED, gpu="H100"):
    return Context(get_hardware(gpu), problem)


def test_the_space_is_built_in_and_serves_nhwc_int8_conv2d():
    assert "cutlass_sm90_conv2d_int8" in builtin_names()
    space = load_space("cutlass_sm90_conv2d_int8")
    assert space.workload == "conv2d" and space.baselines is not None
    assert SPACE.check(POINT, ctx()) is None
    assert len(SPACE.feasible(ctx())) == 1352


@pytest.mark.parametrize("change,fields,rule", [
    ({"tile_n": 256}, {}, "accumulators"),
    ({"stages": 6, "tile_k": 256}, {}, "smem"),
    ({}, {"layout": "nc32hw32"}, "layout"),
    ({}, {"C": 24}, "alignment"),
    ({}, {"K": 40}, "alignment"),
    ({}, {"scaling": "channel"}, "scaling"),
    ({}, {"dtype": "fp16"}, "dtype"),
])
def test_each_rule_prunes_with_its_reason(change, fields, rule):
    table = {"N": 2, "C": 128, "H": 20, "W": 20, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8",
             "layout": "nhwc", **fields}
    if table["dtype"] != "int8":
        table.pop("scaling", None)
    reason = SPACE.check(dict(POINT, **change), ctx(CONV.parse(table)))
    assert reason is not None and reason.startswith(f"{rule}:"), reason


def test_the_arch_rule_keeps_it_to_hopper():
    assert SPACE.check(POINT, ctx(gpu="A100")).startswith("arch:")


def test_the_shared_memory_model_covers_the_binaries():
    # evotune_shared_memory() of libraries nvcc 13.0 built from this space's source (CUTLASS 4.2 headers): the
    # epilogue shares the operand buffers, so the model may overcount only the barriers' few hundred bytes
    for point, smem in [
        (dict(POINT, tile_n=192), 205312),  # automatic stages: 5 of 40 KiB
        (dict(POINT, cluster=(2, 1), stages=4, epilogue="nosmem"), 131200),
        (dict(POINT, tile_n=256, tile_k=64, stages=3), 74240),  # built to see it spill: 2356 bytes of stores
    ]:
        assert smem <= smem_bytes(point) <= smem + 1024, point


def test_the_source_is_shape_free_and_every_knob_is_in_the_cache_key(monkeypatch):
    monkeypatch.setattr(cb, "toolchain", lambda: ("nvcc 13.0", "4.2.0"))
    src = sc.source(POINT, SEED)
    assert "KernelImplicitTmaWarpSpecializedSm90>" in src and "Shape<_128, _128, Shape<_128>>" in src
    assert "StageCountAutoCarveout" in src and "TmaWarpSpecialized," in src and "alpha_ptr = scale" in src
    assert "72, 120" not in src  # the problem is an argument
    nosmem = sc.source(dict(POINT, stages=4, epilogue="nosmem", cluster=(2, 1)), SEED)
    assert "NoSmemWarpSpecialized" in nosmem and "StageCount<4>" in nosmem and "Shape<_2, _1, _1>" in nosmem
    key = sc.cache_key(POINT, SEED)
    other = CONV.parse({"N": 3, "C": 96, "H": 17, "W": 23, "K": 160, "R": 1, "S": 1, "stride": 2, "dtype": "int8"})
    assert sc.cache_key(POINT, other) == key
    for knob, value in [("tile_m", 64), ("tile_n", 64), ("tile_k", 64), ("cluster", (1, 2)), ("stages", 3),
                        ("epilogue", "nosmem")]:
        assert sc.cache_key(dict(POINT, **{knob: value}), SEED) != key, knob


def test_the_estimate_orders_what_the_h100_measured():
    # seed shape on the H100 (search times, µs): 128x128x128 automatic stages 41.5; with the epilogue straight
    # from registers 75; two 64-deep stages 75; 256-deep K tiles 79
    best = SPACE.estimate(POINT, ctx())
    for worse in (dict(POINT, epilogue="nosmem", stages=3), dict(POINT, tile_k=64, stages=2),
                  dict(POINT, tile_k=256)):
        assert SPACE.estimate(worse, ctx()) > 1.2 * best, worse


def test_the_experiment_serves_the_space_and_names_the_same_shapes_as_the_nc32hw32_one():
    exp = load_experiment(ROOT / "experiments" / "h100_int8_conv_sm90.toml")
    twin = load_experiment(ROOT / "experiments" / "h100_int8_conv.toml")
    assert exp.spaces == ["cutlass_sm90_conv2d_int8"] and len(exp.problems) == 6
    assert [dict(p.extra) for p in exp.problems] == [dict(p.extra) for p in twin.problems]
    for problem in exp.problems:
        assert problem.layout == "nhwc" and len(SPACE.feasible(ctx(problem))) > 100


class _Workload:
    def baselines(self, problem):
        return {"vendor": "vendor-fn"}


def test_the_worker_times_the_space_baselines_and_goes_on_without_them_when_they_fail(monkeypatch):
    monkeypatch.setattr(gpu_worker, "_workload", lambda problem: _Workload())
    worker = gpu_worker._Worker.__new__(gpu_worker._Worker)
    worker.space = dataclasses.replace(SPACE, baselines=lambda problem: {"other kernel": "other-fn"})
    assert worker._baseline_fns(SEED) == ({"vendor": "vendor-fn", "other kernel": "other-fn"}, {})

    def broken(problem):
        raise RuntimeError("nvcc failed: on purpose")

    worker.space = dataclasses.replace(SPACE, baselines=broken)
    fns, failed = worker._baseline_fns(SEED)
    assert fns == {"vendor": "vendor-fn"}
    assert failed == {"cutlass_sm90_conv2d_int8: baselines": "RuntimeError: nvcc failed: on purpose"}

"""The replay oracle agrees with the files it reads, in both formats."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import KT_EXCERPT

from evotune.core.landscape import LandscapeError, load_landscape
from evotune.core.landscape_convert import convert
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.measurement.replay import ReplayEvaluator


def test_replay_agrees_with_every_entry_of_a_kernel_tuner_file():
    raw = json.loads(gzip.decompress(KT_EXCERPT.read_bytes()))
    pnpoly = load_landscape(KT_EXCERPT)
    keys = raw["tune_params_keys"]
    oracle = ReplayEvaluator(pnpoly)
    failed = 0
    assert len(raw["cache"]) == len(pnpoly) == 205
    for entry in raw["cache"].values():
        point = {k: entry[k] for k in keys}
        r = oracle.evaluate(point, pnpoly.problem)
        assert r.compile_s == pytest.approx(entry["compile_time"] / 1e3)
        assert r.bench_s == pytest.approx((entry["benchmark_time"] + entry["verification_time"]) / 1e3)
        if isinstance(entry["time"], str):
            failed += 1
            assert r.status is Status.RUNTIME_ERROR and entry["time"] in r.message and r.value is None
        else:
            assert r.status is Status.OK
            assert r.time_ms == entry["time"] and r.samples_ms == entry["times"]
    assert failed == 18
    assert pnpoly.optimum_ms == min(e["time"] for e in raw["cache"].values() if not isinstance(e["time"], str))


def test_points_absent_from_the_landscape_are_infeasible_and_free(gemm_landscape):
    space = gemm_landscape.space()
    missing = next(p for p in space.points() if gemm_landscape.lookup(p) is None)
    r = ReplayEvaluator(gemm_landscape).evaluate(missing, gemm_landscape.problem)
    assert r.status is Status.INFEASIBLE and r.cost_s == 0
    assert space.check(missing, Context()) == "recorded: not in the recorded landscape"
    assert len(space.feasible(Context())) == len(gemm_landscape) == 17956


def test_evotune_format_round_trip_keeps_every_point(tmp_path):
    pnpoly = load_landscape(KT_EXCERPT)
    out = convert(KT_EXCERPT, tmp_path / "pnpoly.json.gz", max_samples=4)
    again = load_landscape(out)
    assert again.names == pnpoly.names and len(again) == len(pnpoly)
    for key, r in pnpoly.entries.items():
        s = again.entries[key]
        assert s.status is r.status and s.time_ms == r.time_ms and s.cost_s == r.cost_s
        if r.status is Status.OK:
            assert len(s.samples_ms) == min(4, len(r.samples_ms))
            assert min(s.samples_ms) == pytest.approx(min(r.samples_ms), rel=1e-5)
    assert again.meta["device"] == "NVIDIA GeForce RTX 2080 Ti"


def test_unreadable_landscapes_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(LandscapeError, match=r"bad\.json"):
        load_landscape(bad)
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(LandscapeError, match="neither a Kernel Tuner cache file nor an evotune landscape"):
        load_landscape(other)

"""benchmarks/confirmed_table.py and the shipped benchmarks/confirmed/h100.json: only confirmed ratios, one row per
problem (its best over the runs), every GEMM shape of the shipped H100 landscapes covered."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, load_benchmark

from evotune.reporting.report import Best

FIELDS = {"dtype", "m", "n", "k", "space", "config", "flush", "time_ms", "ci95_ms", "baseline", "baseline_ms",
          "speedup", "pct_read_bw", "date", "command"}


def best(confirmed: bool, baselines: dict[str, float], time_ms: float = 0.02) -> Best:
    b = Best("e", "gemm_int8_tn_16x4096x4096", {"kind": "gemm", "m": 16, "n": 4096, "k": 4096, "dtype": "int8",
                                                "layout": "tn"}, "cute_hopper_gemm", {"tile_m": 64}, time_ms, "e/s",
             3, "default", 0, 12, "H100", "gpu")
    b.confirmed, b.baselines, b.ci95_ms, b.flush = confirmed, baselines, [0.0199, 0.0201], "clean"
    return b


def test_a_row_is_made_only_of_a_confirmed_best_with_a_baseline(monkeypatch) -> None:
    ct = load_benchmark("confirmed_table", monkeypatch)
    got = ct.row(best(True, {"torch._int_mm": 0.03, "other": 0.05}), "2026-11-26", "python -m evotune run X")
    assert FIELDS <= set(got)
    assert (got["dtype"], got["m"], got["n"], got["k"]) == ("int8", 16, 4096, 4096)
    assert got["baseline"] == "torch._int_mm" and got["speedup"] == pytest.approx(1.5)
    assert ct.row(best(False, {"torch._int_mm": 0.03}), None, "c") is None  # the search's own ratio: left out
    assert ct.row(best(True, {}), None, "c") is None  # nothing re-timed beside it


def test_merge_replaces_the_same_run_and_keeps_each_problems_best_run(monkeypatch) -> None:
    ct = load_benchmark("confirmed_table", monkeypatch)
    old = [{"problem_key": "a", "command": "run1", "speedup": 1.2}, {"problem_key": "b", "command": "run1",
                                                                     "speedup": 0.9},
           {"problem_key": "a", "command": "run2", "speedup": 1.1}]
    merged = ct.merge(old, [{"problem_key": "b", "command": "run2", "speedup": 1.0}])
    assert merged == [{"problem_key": "a", "command": "run1", "speedup": 1.2},
                      {"problem_key": "b", "command": "run2", "speedup": 1.0}]
    rerun = ct.merge(merged, [{"problem_key": "a", "command": "run1", "speedup": 1.0}])  # run1 again: replaced
    assert [r["speedup"] for r in rerun] == [1.0, 1.0]


def test_the_shipped_table_covers_every_gemm_shape_of_the_h100_landscapes_with_confirmed_rows() -> None:
    rows = json.loads((ROOT / "benchmarks" / "confirmed" / "h100.json").read_text())
    keys = [r["problem_key"] for r in rows]
    assert len(keys) == len(set(keys))
    shapes = set()
    for f in (ROOT / "evotune" / "landscapes" / "h100").glob("*_gemm_*.json.gz"):
        m = re.search(r"_gemm_(bf16|int8)_tn_(\d+)x(\d+)x(\d+)\.json\.gz$", f.name)
        if m:
            shapes.add((m.group(1), *(int(x) for x in m.groups()[1:])))
    assert len(shapes) == 40
    gemms = [r for r in rows if r.get("kind", "gemm") == "gemm"]
    assert shapes <= {(r["dtype"], r["m"], r["n"], r["k"]) for r in gemms}
    for r in rows:  # a conv row carries its own problem fields in place of m, n, k
        fields = FIELDS if r in gemms else (FIELDS - {"m", "n", "k"}) | {"kind", "extra"}
        assert fields <= set(r), r["problem_key"]
        assert r["flush"] == "clean" and r["ci95_ms"][0] <= r["time_ms"] <= r["ci95_ms"][1]
        assert r["speedup"] == pytest.approx(r["baseline_ms"] / r["time_ms"])

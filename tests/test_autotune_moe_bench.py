"""benchmarks/autotune_moe.py on the CPU: the grid it times, which batch sizes get the whole grid and which a
sample plus the nearest exhaustive size's fastest, the Triton specializations it compiles for, and one tiny run of
all three phases through the interpreter (the report's fractions and GPU shares are not checked: wall clock)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "autotune_moe.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    return load_benchmark("autotune_moe", monkeypatch, interpret=True)


def test_the_grid_is_vllms_1920_configurations(bench) -> None:
    sys.path.insert(0, str(bench.EXAMPLES))
    import fused_moe

    points = bench.grid_points(fused_moe.SPACE)
    assert len(points) == 1920 == len({tuple(p.values()) for p in points})
    assert {p["BLOCK_SIZE_M"] for p in points} == {16, 32, 64, 128, 256} and {p["num_stages"] for p in points} == {
        2, 3, 4, 5}


def test_specializations_of_m(bench) -> None:
    assert [bench.specialization(m) for m in (1, 2, 8, 16, 24, 32, 4096)] == ["1", "other", "other", "16n", "other",
                                                                              "16n", "16n"]


def test_plan_times_the_whole_grid_for_exhaustive_sizes_and_a_sample_plus_the_nearest_best_for_the_others(bench):
    opts = argparse.Namespace(seed=0, sample=5, nearest=2, exhaustive={16, 256})
    keys = [{"M": m} for m in (16, 256, 8, 64, 512)]
    points = list(range(40))
    first = bench.plan(opts, keys, points, {})
    assert first["M16"] == first["M256"] == list(range(40))
    assert len(first["M8"]) == 5 and first["M8"] == first["M64"] == first["M512"]  # one sample for all
    done = {"M16": {"complete": True, "rows": {"7": {"status": "ok", "time_ms": 1.0},
                                               "9": {"status": "ok", "time_ms": 0.5},
                                               "3": {"status": "wrong_result", "time_ms": None},
                                               "5": {"status": "ok", "time_ms": 2.0}}},
            "M256": {"complete": False, "rows": {"1": {"status": "ok", "time_ms": 0.1}}}}
    later = bench.plan(opts, keys, points, done)
    assert set(later["M8"]) == set(first["M8"]) | {9, 7}  # M16 is nearest to 8: its two fastest that ran
    assert set(later["M64"]) == set(first["M64"]) | {9, 7}  # M16 and M256 are as near: the smaller M
    assert set(later["M512"]) == set(first["M512"])  # M256 is nearest and unfinished: nothing from it yet


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_a_tiny_run_of_every_phase(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_args"\n' + "".join(
        f'[[key]]\nM = {m}\nN = 32\nK = 32\nE = 4\ndtype = "float32"\n' for m in (8, 16)))
    out = tmp_path / "out"
    env = {**os.environ, "TRITON_INTERPRET": "1", "EVOTUNE_AUTOTUNE_CACHE": str(tmp_path / "default"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(SCRIPT), "--keys", str(keys), "--out", str(out), "--exhaustive", "16",
                           "--sample", "3", "--nearest", "2", "--grid-limit", "6", "--jobs", "1", "--budget", "6"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    tune = json.loads((out / "tune.json").read_text())
    assert set(tune["keys"]) == {"M8", "M16"} and all(k["evaluations"] > 0 for k in tune["keys"].values())
    grid = json.loads((out / "grid.json").read_text())
    assert grid["sizes"]["M16"]["exhaustive"] and grid["sizes"]["M16"]["timed"] == 6
    assert all(s["complete"] and s["ok"] == s["timed"] for s in grid["sizes"].values())  # fp32: every config is right
    report = json.loads((out / "report.json").read_text())
    assert [r["key"] for r in report["rows"]] == ["M8", "M16"]
    assert all(0 < r["fraction"] <= 1 and set(r["medians_ms"]) >= {"decided", "grid#1"} for r in report["rows"])
    (name, count), = report["summary"]["vllm_files"].items()
    assert name.startswith("E=4,N=16,device_name=") and count == 2
    assert (out / "vllm_fused_moe_E4_N32_K32_M16_fp32.json.gz").is_file()  # the exhaustive size's landscape

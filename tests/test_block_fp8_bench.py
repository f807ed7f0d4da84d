"""benchmarks/block_fp8.py on the CPU: DeepSeek-V3's shapes as vLLM's tuning script lists them, vLLM's grid, its bad
options, and one tiny run of all three phases through Triton's interpreter (tuned keys checked against the
dequantized product and re-timed beside vLLM's default, the grid timed, the vLLM files written and checked, a second
run resuming; the fractions are not checked: wall clock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, load_benchmark

SCRIPT = ROOT / "benchmarks" / "block_fp8.py"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    return load_benchmark("block_fp8", monkeypatch)


def test_deepseek_v3_shapes_at_tensor_parallelism_8_and_vllms_batch_sizes(bench):
    shapes = bench.weight_shapes(8)
    assert len(shapes) == len(set(shapes)) == 14
    # left whole, split along N (gate-up 36864 / 8, q_b 24576 / 8, ...), split along K (down 18432 / 8, ...)
    assert {(576, 7168), (24576, 7168), (32768, 512), (4608, 7168), (3072, 1536), (512, 7168), (7168, 2304),
            (7168, 256)} <= set(shapes)
    assert all(k % 128 == 0 for _, k in shapes) and any(n % 128 for n, _ in shapes)  # N = 576: a partial block
    assert bench.weight_shapes(1)[5] == (36864, 7168)
    assert len(bench.BATCHES) == 18 and bench.BATCHES[0] == 1 and bench.BATCHES[-1] == 4096
    assert set(bench.GRID_SHAPES) <= set(shapes)


def test_the_grid_is_vllms_1280_configurations(bench):
    configs = bench.grid_configs()
    assert len(configs) == 1280 == len({tuple(c.values()) for c in configs})
    assert {c["BLOCK_SIZE_K"] for c in configs} == {64, 128} and {c["GROUP_SIZE_M"] for c in configs} == {1, 16, 32,
                                                                                                          64}


@pytest.mark.parametrize(("args", "message"), [
    (["--shapes", "7168x100"], "--shapes: expected NxK pairs with K a multiple of 128"),
    (["--grid-batches", "16,x"], "--grid-batches: expected positive batch sizes"),
    (["--budget", "0"], "--budget and --max-seconds must be positive"),
])
def test_bad_options_are_one_line_exit_2_and_nothing_created(bench, tmp_path, capsys, args, message):
    out = tmp_path / "run"
    assert bench.main(["--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow  # two keys tuned, a grid of four timed and the report, under Triton's interpreter
def test_a_tiny_run_tunes_times_the_grid_exports_and_resumes(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    out = tmp_path / "run"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # N = 192: not a multiple of 128 (a whole weight block and half of one), as DeepSeek-V3's 576 is not; K = 128,
    # a single scale group along K: the interpreter runs few programs of few steps per launch
    args = [sys.executable, str(SCRIPT), "--out", str(out), "--shapes", "192x128", "--batches", "1,16",
            "--grid-shapes", "192x128", "--grid-batches", "16", "--grid-limit", "4", "--budget", "2"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    tuned = json.loads((out / "tune.json").read_text())["keys"]
    assert sorted(tuned) == ["N192_K128_M1", "N192_K128_M16"]
    for row in tuned.values():
        assert row["error"] <= 1e-2 and row["evaluations"] == 2 and row["speedup"] > 0
        assert set(row["config"]) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                                      "num_stages"}
    grid = json.loads((out / "grid.json").read_text())["keys"]["N192_K128_M16"]
    assert grid["complete"] and grid["timed"] == 4 and grid["ok"] == 4
    report = json.loads((out / "report.json").read_text())
    summary = report["summary"]
    assert summary["keys"] == 2 and summary["wrong_picks"] == [] and summary["grid_keys"] == 1
    assert summary["geomean_speedup_vs_vllm_default"] > 0 and summary["min_fraction_of_grid_best"] > 0
    name = "N=192,K=128,device_name=cpu-interpreter,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert summary["vllm_files"] == {name: 2}
    configs = {int(k): v for k, v in json.loads((out / "vllm" / name).read_text()).items()}
    assert configs == {m: tuned[f"N192_K128_M{m}"]["config"] for m in (1, 16)}
    # again: every key and the grid are done, nothing is tuned or timed again
    again = subprocess.run([*args, "--phase", "tune"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0 and "tune N192" not in again.stdout
    assert json.loads((out / "tune.json").read_text())["keys"] == tuned

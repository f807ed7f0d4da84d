"""benchmarks/tune_model.py: the fused-MoE keys it hands to vLLM's grid run, a decoder layer's dense GEMMs, the
grid comparison and the scaling runs (CPU: a stand-in tuner under the interpreter, a grid of two configurations)
and the decode step (GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the checkout first, then whatever the suite itself runs with (a GPU machine's packages may come that way)
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(ROOT / "benchmarks"))
import tune_model as bench  # noqa: E402

from evotune.model.models import load_model  # noqa: E402
from evotune.model.plan import make_plan  # noqa: E402

TINY = ROOT / "tests" / "data" / "tiny_moe_config.json"


def test_the_grid_run_gets_mixtral_tp2_keys_as_the_shipped_keys_file_has_them() -> None:
    got = tomllib.loads(bench.moe_keys_toml(make_plan(load_model("Mixtral-8x7B"), 2)))
    shipped = tomllib.loads((ROOT / "examples" / "triton_autotune" / "moe_mixtral_tp2.toml").read_text())
    assert got["launch"] == shipped["launch"] == "make_args"
    assert got["key"] == [{**k, "top_k": 2} for k in shipped["key"]]


def test_a_decoder_layer_of_llama_3_8b_at_m16() -> None:
    plan = make_plan(load_model("Llama-3-8B"), 1, "bf16", (16,))
    assert bench.dense_layers(plan, 16) == [("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096),
                                            ("gate_up_proj", 28672, 4096), ("down_proj", 4096, 14336)]


@pytest.mark.slow  # three tune-model runs of worker processes
def test_scaling_runs_each_gpu_count_in_its_own_folder_and_predicts_the_last(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "scaling", "--model",
                          str(TINY), "--gpus", "1,2,3", "--batch-sizes", "1,128", "--out", str(tmp_path),
                          "--tuner", f"{ROOT / 'tests' / 'model_standin.py'}:make"], env=env, capture_output=True,
                         text=True)
    assert got.returncode == 0, got.stderr
    doc = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["gpus"] for r in doc["runs"]] == [1, 2, 3]
    # the fused MoE at M = 1 and 128, QKV and O as decode GEMMs at 1 and GEMMs at 128; six configurations each
    assert all(r["keys"] == 6 and r["evaluations"] == 6 * 6 and not r["interrupted"] for r in doc["runs"])
    assert doc["runs"][0]["speedup"] == 1.0
    assert all((tmp_path / f"gpus{g}" / "report.md").is_file() for g in (1, 2, 3))
    # the stand-in keeps no autotune cache: nothing to count there
    assert all(r["points_timed_twice"] is None for r in doc["runs"])
    pred = doc["prediction"]
    assert pred["gpus"] == 3 and pred["predicted_wall_s"] > 0 and pred["measured_wall_s"] == doc["runs"][2]["wall_s"]
    assert "GPUs" in got.stdout and "speed-up" in got.stdout


@pytest.mark.slow  # the grid's way and tune-model on a tiny MoE under the interpreter (about a minute)
def test_the_grid_comparison_times_the_grid_runs_tune_model_and_retimes_both(tmp_path) -> None:
    cfg = json.loads(TINY.read_text())
    cfg.update(hidden_size=64, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = tmp_path / "tiny" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(cfg))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = tmp_path / "out"
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "grid", "--model", str(model),
                          "--batch-sizes", "1,16", "--exhaustive", "16", "--sample", "1", "--nearest", "1",
                          "--grid-limit", "2", "--tuner", f"{ROOT / 'tests' / 'model_standin.py'}:make", "--out",
                          str(out)], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    doc = json.loads((out / "grid.json").read_text())
    sizes = doc["grid"]["sizes"]
    assert sizes["M16"]["exhaustive"] and sizes["M16"]["complete"] and sizes["M16"]["timed"] == 2
    assert not sizes["M1"]["exhaustive"] and sizes["M1"]["complete"]  # its sample and M = 16's fastest
    measured = doc["grid"]["measured"]
    assert measured["configs_timed"] == sizes["M16"]["timed"] + sizes["M1"]["timed"]
    assert measured["compiled"] == 2 + sizes["M1"]["timed"]  # once per specialisation: M = 16 and M = 1 differ
    est = doc["grid"]["estimate"]
    assert est["configs"] == 2 * 2 and est["gpu_s"] > 0 and est["wall_s"] >= est["gpu_s"] / doc["gpus"]
    assert doc["tune"]["decided"] == doc["tune"]["keys"] == 2 and not doc["tune"]["interrupted"]
    assert [r["M"] for r in doc["retime"]] == [1, 16]
    for r in doc["retime"]:
        assert set(r["medians_ms"]) == {"tuned"} | {f"grid#{i + 1}" for i in range(min(3, r["grid_timed"]))}
        assert 0 < r["fraction"] <= 1 and r["fraction"] == min(r["medians_ms"].values()) / r["tuned_ms"]
    assert "fraction" in got.stdout


@pytest.mark.gpu
@pytest.mark.slow  # a tune-model run of the tiny model at M = 16, then the step's graphs
def test_decode_step_tuned_against_cublas(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "evotune", "tune-model", str(TINY), "--gpus", "1", "--batch-sizes", "16",
                    "--kernels", "triton_decode_gemm", "--out", str(run), "--no-progress"], env=env, check=True,
                   cwd=ROOT)
    assert bench.main(["decode-step", "--model", str(TINY), "--ms", "16", "--run", str(run), "--out", str(tmp_path),
                       "--rounds", "5"]) == 0
    (step,) = json.loads((tmp_path / "decode_step.json").read_text())["steps"]
    assert [row["layers"] for row in step["layers"]] == ["qkv_proj", "o_proj"] and step["m"] == 16
    assert step["tuned_ms"] > 0 and step["untuned_ms"] > 0 and step["ratio"] == step["untuned_ms"] / step["tuned_ms"]


def test_decode_step_names_a_run_without_tuned_json(tmp_path, capsys) -> None:
    assert bench.main(["decode-step", "--model", str(TINY), "--run", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert f"--run {tmp_path}: no tuned.json" in capsys.readouterr().err

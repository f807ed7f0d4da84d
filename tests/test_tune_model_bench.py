"""benchmarks/tune_model.py: the fused-MoE keys it hands to vLLM's grid run, a decoder layer's dense GEMMs, the
scaling runs (CPU: a stand-in tuner under the interpreter) and the decode step (GPU)."""

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


@pytest.mark.slow  # two tune-model runs of worker processes
def test_scaling_runs_each_gpu_count_in_its_own_folder(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "scaling", "--model",
                          str(TINY), "--gpus", "1,2", "--batch-sizes", "1,128", "--out", str(tmp_path),
                          "--tuner", f"{ROOT / 'tests' / 'model_standin.py'}:make"], env=env, capture_output=True,
                         text=True)
    assert got.returncode == 0, got.stderr
    doc = json.loads((tmp_path / "scaling.json").read_text())
    assert [r["gpus"] for r in doc["runs"]] == [1, 2]
    # the fused MoE at M = 1 and 128, QKV and O as decode GEMMs at 1 and GEMMs at 128; six configurations each
    assert all(r["keys"] == 6 and r["evaluations"] == 6 * 6 for r in doc["runs"])
    assert doc["runs"][0]["speedup"] == 1.0
    assert (tmp_path / "gpus1" / "report.md").is_file() and (tmp_path / "gpus2" / "report.md").is_file()


@pytest.mark.gpu
@pytest.mark.slow  # a tune-model run of the tiny model at M = 16, then the step's graphs
def test_decode_step_tuned_against_cublas(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "evotune", "tune-model", str(TINY), "--gpus", "1", "--batch-sizes", "16",
                    "--out", str(run), "--no-progress"], env=env, check=True, cwd=ROOT)
    bench.main(["decode-step", "--model", str(TINY), "--m", "16", "--run", str(run), "--out", str(tmp_path),
                "--rounds", "5"])
    doc = json.loads((tmp_path / "decode_step.json").read_text())
    assert [row["layers"] for row in doc["layers"]] == ["qkv_proj", "o_proj"]
    assert doc["tuned_ms"] > 0 and doc["untuned_ms"] > 0 and doc["ratio"] == doc["untuned_ms"] / doc["tuned_ms"]

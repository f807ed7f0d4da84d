"""benchmarks/tune_model.py: the fused-MoE keys it hands to vLLM's grid run, a decoder layer's dense GEMMs, the
grid comparison and the scaling runs (CPU: a stand-in tuner under the interpreter, a grid of two configurations)
and the decode step (GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# the checkout first, then whatever the suite itself runs with (a GPU machine's packages may come that way)
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
sys.path.insert(0, str(ROOT / "benchmarks"))
import layer_step  # noqa: E402
import moe_grid_bound  # noqa: E402
import tune_model as bench  # noqa: E402

from evotune.model.exports import write_tuned  # noqa: E402
from evotune.model.models import load_model  # noqa: E402
from evotune.model.outcome import Outcome  # noqa: E402
from evotune.model.plan import Family, make_plan  # noqa: E402
from evotune.model.tuning import LAYOUTS  # noqa: E402
from search_spaces import _triton_fused_moe as moe  # noqa: E402

TINY = ROOT / "tests" / "data" / "tiny_moe_config.json"


def test_the_grid_run_gets_mixtral_tp2_keys_as_the_shipped_keys_file_has_them() -> None:
    got = tomllib.loads(bench.moe_keys_toml(make_plan(load_model("Mixtral-8x7B"), 2)))
    shipped = tomllib.loads((ROOT / "examples" / "triton_autotune" / "moe_mixtral_tp2.toml").read_text())
    assert got["launch"] == shipped["launch"] == "make_args"
    assert got["key"] == [{**k, "top_k": 2} for k in shipped["key"]]


def test_the_fp8_grid_keys_are_e4m3_and_tune_model_is_run_at_fp8() -> None:
    plan = bench.moe_plan("Mixtral-8x7B", 2, "vllm", "fp8")
    keys = tomllib.loads(bench.moe_keys_toml(plan))["key"]
    assert len(keys) == 18 and all(k["dtype"] == "float8_e4m3fn" for k in keys)
    assert {(k["N"], k["K"], k["E"], k["top_k"]) for k in keys} == {(14336, 4096, 8, 2)}
    cmd = bench.tune_model_cmd("Mixtral-8x7B", 2, "vllm", 1, Path("out"), "default", "fused_moe", plan.dtype)
    assert cmd[-2:] == ["--dtype", "fp8"]


def test_a_block_fp8_model_or_an_out_of_another_dtype_is_one_line_and_nothing_is_written(tmp_path, capsys) -> None:
    fresh = tmp_path / "fresh"
    assert bench.main(["grid", "--model", "DeepSeek-V3", "--tp", "8", "--dtype", "fp8", "--out", str(fresh)]) == 2
    assert "weight_block_size: [128, 128]; the grid comparison's fp8 is scaled per tensor" in capsys.readouterr().err
    assert not fresh.exists()
    bf16 = tmp_path / "bf16"
    (bf16 / "grid" / "exhaustive" / "gpu0").mkdir(parents=True)
    sizes = {"sizes": {"M16": {"key": {"M": 16, "dtype": "bfloat16"}, "rows": {}}}}
    (bf16 / "grid" / "exhaustive" / "gpu0" / "grid.json").write_text(json.dumps(sizes))
    before = sorted(p for p in tmp_path.rglob("*"))
    mixtral = ["grid", "--model", "Mixtral-8x7B", "--tp", "2", "--dtype", "fp8", "--out", str(bf16)]
    assert bench.main(mixtral) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("gpu0/grid.json: sizes.M16.key.dtype: bfloat16, not float8_e4m3fn (--dtype fp8): give each "
                        "dtype its own --out") and "\n" not in err
    assert sorted(p for p in tmp_path.rglob("*")) == before
    (bf16 / "grid.json").write_text(json.dumps({"model": "Mixtral-8x7B"}))  # a bf16 comparison's, without its dtype
    before = sorted(p for p in tmp_path.rglob("*"))
    assert bench.main(mixtral) == 2
    assert f"{bf16 / 'grid.json'}: dtype: bf16, not --dtype fp8" in capsys.readouterr().err
    assert sorted(p for p in tmp_path.rglob("*")) == before


def _mixtral_fp8_outcomes(sizes: dict[int, int]) -> tuple[Any, dict[str, Outcome]]:
    """Mixtral-8x7B's fp8 fused-MoE keys at tp 2, decided on an H200; BLOCK_SIZE_N says which batch size it is."""
    plan = bench.moe_plan("Mixtral-8x7B", 2, ",".join(map(str, sizes)), "fp8")
    outcomes = {}
    for key in plan.keys:
        config = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": sizes[key.m], "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                  "num_warps": 4, "num_stages": 3}
        outcomes[key.ident] = Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(), config, 8, 8,
                                      1.0, 0.1, 0.2, "confirmed", "NVIDIA H200", "3.4.0", "vllm_fused_moe")
    return plan, outcomes


def test_the_tune_phase_file_is_vllms_fp8_name_read_back_and_written_from_the_record_if_the_run_was_cut(
        tmp_path) -> None:
    plan, outcomes = _mixtral_fp8_outcomes({16: 64, 64: 128})
    assert bench.tuned_file(plan, {}, tmp_path, 0.0) is None  # nothing decided: no file
    # tune-model cut by its cap wrote nothing: the file is written from its record, by the same function
    cut = bench.tuned_file(plan, outcomes, tmp_path, time.time() + 60)
    assert cut is not None and cut.written_by == "tune_model.py"
    assert cut.path == tmp_path / "vllm" / "E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"
    assert sorted(cut.configs) == [16, 64] and cut.pick(16)[1]["BLOCK_SIZE_N"] == 64
    # a file tune-model wrote since the phase began is read as it is, as vLLM reads it: the nearest batch size
    doc = json.loads(cut.path.read_text())
    doc["64"]["BLOCK_SIZE_N"] = 256
    cut.path.write_text(json.dumps(doc))
    ended = bench.tuned_file(plan, outcomes, tmp_path, 0.0)
    assert ended is not None and ended.written_by == "tune-model"
    assert ended.pick(100) == (64, {**outcomes[plan.keys[1].ident].config, "BLOCK_SIZE_N": 256})
    assert ended.pick(1)[0] == 16


def test_a_decoder_layer_of_llama_3_8b_at_m16() -> None:
    plan = make_plan(load_model("Llama-3-8B"), 1, "bf16", (16,))
    assert bench.dense_layers(plan, 16) == [("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096),
                                            ("gate_up_proj", 28672, 4096), ("down_proj", 4096, 14336)]


@pytest.mark.slow  # three tune-model runs of worker processes
def test_scaling_runs_each_gpu_count_in_its_own_folder_and_predicts_the_last(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)

    def scaling(gpus: str, *more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "scaling", "--model",
                               str(TINY), "--gpus", gpus, "--batch-sizes", "1,128", "--out", str(tmp_path),
                               "--tuner", f"{ROOT / 'tests' / 'model_standin.py'}:make", *more], env=env,
                              capture_output=True, text=True)

    # two calls, as on a machine lent ten minutes at a time: the second's table takes the first's runs in
    first = scaling("1,3")
    assert first.returncode == 0, first.stderr
    (tmp_path / "first.json").write_text((tmp_path / "scaling.json").read_text())
    got = scaling("2", "--previous", str(tmp_path / "first.json"))
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
    assert pred["gpus"] == 3 and pred["measured_wall_s"] == doc["runs"][2]["wall_s"]
    # one GPU's start-up, then two rounds of whole keys (6 keys on 3 GPUs) at the two runs' pooled per-evaluation cost
    one, two = doc["runs"][:2]
    per_eval = (one["gpu_s"] + two["gpu_s"]) / (one["evaluations"] + two["evaluations"])
    assert pred["predicted_wall_s"] == pytest.approx(max(0.0, one["wall_s"] - one["gpu_s"]) + 2 * 6 * per_eval)
    assert "GPUs" in got.stdout and "speed-up" in got.stdout


#: the file name vLLM looks up for the grid tests' tiny MoE (E = 4, intermediate size 32 at tp 1) as the stand-in
#: tuner reports its device, by dtype
TINY_GRID_FILES = {"bf16": "E=4,N=32,device_name=NVIDIA_H100_80GB_HBM3.json",
                   "fp8": "E=4,N=32,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"}


@pytest.mark.slow  # the grid's way and tune-model on a tiny MoE under the interpreter (30 to 50 s a dtype)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])  # fp8: e4m3 scaled per tensor, which the interpreter runs
def test_the_grid_comparison_times_the_grid_runs_tune_model_and_retimes_both(tmp_path, dtype: str) -> None:
    cfg = json.loads(TINY.read_text())
    cfg.update(hidden_size=64, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = tmp_path / "tiny" / "config.json"
    model.parent.mkdir()
    model.write_text(json.dumps(cfg))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "grid", "--model", str(model), "--batch-sizes",
           "1,16", "--exhaustive", "16", "--sample", "1", "--nearest", "1", "--grid-limit", "2", "--tuner",
           f"{ROOT / 'tests' / 'model_standin.py'}:make", "--out", str(out), "--dtype", dtype]
    got = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    doc = json.loads((out / "grid.json").read_text())
    assert doc["dtype"] == dtype and doc["scaling"] == ("tensor" if dtype == "fp8" else None)
    sizes = doc["grid"]["sizes"]
    assert sizes["M16"]["exhaustive"] and sizes["M16"]["complete"] and sizes["M16"]["timed"] == 2
    assert not sizes["M1"]["exhaustive"] and sizes["M1"]["complete"]  # its sample and M = 16's fastest
    # the grid ran the dtype's keys, and every configuration passed the check against the reference: for fp8 the
    # product of the dequantized inputs, within the scaled-fp8 tolerance
    want = {"bf16": "float32", "fp8": "float8_e4m3fn"}[dtype]  # bf16 runs as float32 under the interpreter
    assert all(s["key"]["dtype"] == want and s["ok"] == s["timed"] for s in sizes.values())
    landscape = f"vllm_fused_moe_E4_N64_K64_M16_{'fp8' if dtype == 'fp8' else 'fp32'}.json.gz"
    assert (out / "grid" / "exhaustive" / "gpu0" / landscape).is_file()
    measured = doc["grid"]["measured"]
    assert measured["configs_timed"] == sizes["M16"]["timed"] + sizes["M1"]["timed"]
    assert measured["compiled"] == 2 + sizes["M1"]["timed"]  # once per specialisation: M = 16 and M = 1 differ
    est = doc["grid"]["estimate"]
    assert est["configs"] == 2 * 2 and est["gpu_s"] > 0 and est["wall_s"] >= est["gpu_s"] / doc["gpus"]
    assert doc["tune"]["decided"] == doc["tune"]["keys"] == 2 and not doc["tune"]["interrupted"]
    assert doc["tune"]["command"].endswith(f"--dtype {dtype}") and doc["tune"]["calls"] == 1
    # tune-model's picks are re-timed as vLLM reads them from the file tune-model wrote, named as vLLM names it
    file = doc["tune"]["vllm_file"]
    assert file["name"] == TINY_GRID_FILES[dtype] and file["written_by"] == "tune-model"
    assert file["batch_sizes"] == [1, 16] and (out / file["path"]).is_file()
    assert [r["M"] for r in doc["retime"]] == [1, 16]
    assert [r["grid"] for r in doc["retime"]] == ["sampled", "whole"] and "2 whole" in got.stdout
    assert doc["summary"]["compared"] == 2 and doc["summary"]["cut"] == [] and doc["summary"]["not_retimed"] == {}
    for r in doc["retime"]:
        assert r["file_batch_size"] == r["M"] and r["file_is_decision"]
        assert set(r["medians_ms"]) == {"tuned"} | {f"grid#{i + 1}" for i in range(min(3, r["grid_timed"]))}
        assert set(r["configs"]) == set(r["medians_ms"]) and r["configs"]["tuned"] == r["tuned"]
        assert 0 < r["fraction"] <= 1 and r["fraction"] == min(r["medians_ms"].values()) / r["tuned_ms"]
        # a grid configuration that is the pick is the pick's one timing, not a second draw of the same kernel
        assert all(r["configs"][n] == r["tuned"] and r["medians_ms"][n] == r["tuned_ms"] for n in r["same_as_tuned"])
        assert all(c != r["tuned"] for n, c in r["configs"].items() if n not in r["same_as_tuned"] + ["tuned"])
    assert "fraction" in got.stdout and file["path"] in got.stdout
    assert ("fused MoE fp8 (e4m3 activations and weights, per-tensor scales" in got.stdout) == (dtype == "fp8")
    if dtype == "fp8":  # the same command again resumes: nothing of the grid is timed again, the calls' walls add up
        again = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        doc2 = json.loads((out / "grid.json").read_text())
        assert doc2["grid"]["sizes"] == doc["grid"]["sizes"]  # each size's rows and seconds as the first call left them
        assert doc2["tune"]["calls"] == 2 and doc2["tune"]["decided"] == 2
        assert doc2["tune"]["wall_s_total"] == doc["tune"]["wall_s_total"] + doc2["tune"]["wall_s"]
        assert doc2["summary"]["tune_wall_s"] == doc2["tune"]["wall_s_total"]


def test_an_exhaustive_size_cut_by_the_grids_seconds_is_not_compared() -> None:
    """A size whose every configuration was timed is the grid's whole; one cut by --grid-seconds holds the grid's
    first configurations in its order, neither the whole nor a sample: its fraction would say nothing."""
    assert bench.grid_kind({"exhaustive": True, "complete": True}) is bench.GridKind.WHOLE
    assert bench.grid_kind({"exhaustive": True, "complete": False}) is bench.GridKind.CUT
    assert bench.grid_kind({"exhaustive": False, "complete": True}) is bench.GridKind.SAMPLED


def test_a_batch_size_without_a_row_is_named_with_its_reason() -> None:
    got = bench.not_retimed([1, 16, 256, 2048], retimed={1}, grid_timed={1, 16, 256}, decided={1, 16})
    assert got == {16: "--retime-seconds reached first", 256: "tune-model did not decide it",
                   2048: "the grid timed none of its configurations"}


@pytest.mark.gpu
@pytest.mark.slow  # the grid's way (96 configurations) and tune-model on the tiny MoE at fp8 on one GPU: minutes
def test_the_fp8_grid_comparison_on_a_gpu(tmp_path) -> None:
    from evotune.model.exports import ServerFileKind, device_part

    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    out = tmp_path / "out"
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_model.py"), "grid", "--model", str(TINY),
                          "--dtype", "fp8", "--gpus", "1", "--batch-sizes", "16,64", "--exhaustive", "16", "--sample",
                          "16", "--nearest", "4", "--grid-limit", "96", "--tune-seconds", "1200", "--out", str(out)],
                         env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr[-3000:]
    doc = json.loads((out / "grid.json").read_text())
    assert doc["dtype"] == "fp8" and doc["torch_dtype"] == "float8_e4m3fn" and doc["scaling"] == "tensor"
    sizes = doc["grid"]["sizes"]
    assert all(s["complete"] and s["key"]["dtype"] == "float8_e4m3fn" and s["ok"] > 0 for s in sizes.values())
    # every configuration that ran matched the product of the dequantized inputs (the others did not build)
    rows = [r for path in (out / "grid").glob("*/gpu*/grid.json")
            for size in json.loads(path.read_text())["sizes"].values() for r in size["rows"].values()]
    assert rows and {r["status"] for r in rows} <= {"ok", "compile_error"}
    assert doc["tune"]["decided"] == 2 and not doc["tune"]["interrupted"]
    device = device_part(torch.cuda.get_device_name(), ServerFileKind.VLLM_MOE)
    file = doc["tune"]["vllm_file"]
    assert file["name"] == f"E=4,N=512,device_name={device},dtype=fp8_w8a8.json" and file["written_by"] == "tune-model"
    assert [r["M"] for r in doc["retime"]] == [16, 64]
    assert all(r["file_is_decision"] and 0 < r["fraction"] <= 1 for r in doc["retime"])


@pytest.mark.gpu
@pytest.mark.slow  # a tune-model run of the tiny model at M = 16 (decode GEMMs and the fused MoE), then the step
def test_decode_step_tuned_against_untuned(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "evotune", "tune-model", str(TINY), "--gpus", "1", "--batch-sizes", "16",
                    "--kernels", "triton_decode_gemm,fused_moe", "--out", str(run), "--no-progress"], env=env,
                   check=True, cwd=ROOT)
    assert bench.main(["decode-step", "--model", str(TINY), "--ms", "16", "--run", str(run), "--out", str(tmp_path),
                       "--rounds", "3"]) == 0
    (step,) = json.loads((tmp_path / "decode_step.json").read_text())["steps"]
    assert [row["layers"] for row in step["layers"]] == ["qkv_proj", "o_proj", "experts.gate_up", "experts.down"]
    assert step["m"] == 16
    # a dense GEMM runs its decision from tuned.json, or, where the run kept cuBLAS (timed faster than every
    # configuration found: no decision written), cuBLAS in both versions and says so; the experts run the vLLM file's
    for row in step["layers"][:2]:
        assert (row["config"] is not None and row["source"].startswith("tuned.json")) or \
            (row["config"] is None and row["source"].startswith(layer_step.NO_DECISION))
    assert all(row["config"] is not None for row in step["layers"][2:])
    assert [row["untuned_config"] is None for row in step["layers"]] == [True, True, False, False]
    assert step["layers"][2]["source"].endswith("batch size 16")
    assert step["tuned_ms"] > 0 and step["untuned_ms"] > 0 and step["ratio"] == step["untuned_ms"] / step["tuned_ms"]
    for row in step["layers"]:
        assert row["tuned_ms"] > 0 and row["ratio"] == row["untuned_ms"] / row["tuned_ms"]
    # the step holds the four GEMMs: it takes at least as long as the slowest alone
    assert step["untuned_ms"] >= max(row["untuned_ms"] for row in step["layers"])
    # what each must move at M = 16 in bf16: x, W and y of QKV and O; the experts' hit by the routing drawn
    qkv, o, gate_up, down = step["layers"]
    assert (qkv["bytes"], o["bytes"]) == ((16 * 256 + 384 * 256 + 16 * 384) * 2, (16 * 256 + 256 * 256 + 16 * 256) * 2)
    hit = gate_up["experts_hit"]
    assert 1 <= hit <= 4 and down["experts_hit"] == hit
    assert gate_up["bytes"] == (16 * 256 + hit * 1024 * 256 + 32 * 1024) * 2
    assert step["bytes"] == sum(row["bytes"] for row in step["layers"])
    for row in [step, *step["layers"]]:
        assert row["read_ms"] == min(row["read"]["torch_sum_ms"], row["read"]["triton_read_ms"]) > 0
        assert row["read"]["bytes"] == row["bytes"] and "read_note" not in row
        assert row["tuned_pct_of_read"] == pytest.approx(100 * row["tuned_ms"] / row["read_ms"])
        assert row["untuned_over_read"] == pytest.approx(row["untuned_ms"] / row["read_ms"])


def _outcome(m: int, n: int, k: int) -> Outcome:
    config = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2, "REDUCE": "sum", "num_warps": 4,
              "num_stages": 3}
    return Outcome(f"triton_decode_gemm N={n} K={k} M={m}", f"triton_decode_gemm N={n} K={k}",
                   Family.DECODE.value, {"M": m, "N": n, "K": k}, config, 64, 64, 1.0, 0.01, 0.012, "confirmed",
                   "NVIDIA H200", "3.4.0", "triton_decode_gemm")


def _moe_file(run: Path, sizes: dict[int, int]) -> None:
    """A vLLM fused-MoE file of the tiny model (E = 4, N = 512 per shard): BLOCK_SIZE_N says which size it is."""
    doc = {str(m): {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
                    "num_stages": 3} for m, bn in sizes.items()}
    (run / "vllm").mkdir(parents=True, exist_ok=True)
    (run / "vllm" / "E=4,N=512,device_name=NVIDIA_H200.json").write_text(json.dumps({"triton_version": "3.4.0",
                                                                                    **doc}))


def test_the_step_of_a_moe_layer_holds_its_dense_gemms_then_the_experts_tuned_against_untuned(tmp_path) -> None:
    plan = make_plan(load_model(str(TINY)), 1, "bf16", (16,))
    write_tuned([_outcome(16, 384, 256), _outcome(16, 256, 256)], tmp_path, "bf16", LAYOUTS, "run")
    _moe_file(tmp_path, {1: 32, 64: 128})
    gemms = layer_step.compose(plan, 16, tmp_path, "NVIDIA H200")
    assert [(g.name, g.family, g.n, g.k) for g in gemms] == [
        ("qkv_proj", "triton_decode_gemm", 384, 256), ("o_proj", "triton_decode_gemm", 256, 256),
        ("experts.gate_up", "fused_moe", 1024, 256), ("experts.down", "fused_moe", 256, 512)]
    assert gemms[0].tuned == _outcome(16, 384, 256).config and gemms[0].untuned is None  # against cuBLAS
    # both expert GEMMs take the nearest batch size's configuration (1 is nearer 16 than 64), against vLLM's default
    for g in gemms[2:]:
        assert g.tuned is not None and g.tuned["BLOCK_SIZE_N"] == 32 and g.source.endswith("batch size 1")
        assert g.untuned == moe.default_config(16, 4) and (g.experts, g.top_k) == (4, 2)
    at64 = layer_step.compose(make_plan(plan.model, 1, "bf16", (64,)), 64, tmp_path)[2]
    assert at64.tuned is not None and at64.tuned["BLOCK_SIZE_N"] == 128 and at64.source.endswith("batch size 64")


def test_a_gemm_the_run_did_not_decide_runs_untuned_in_both_and_says_so(tmp_path) -> None:
    plan = make_plan(load_model(str(TINY)), 1, "bf16", (16,))
    write_tuned([_outcome(16, 384, 256), _outcome(1, 256, 256)], tmp_path, "bf16", LAYOUTS, "run")  # O at M=1 only
    qkv, o, gate_up, down = layer_step.compose(plan, 16, tmp_path)
    assert qkv.tuned is not None
    assert o.tuned is None and o.source.startswith(layer_step.NO_DECISION)  # no nearest key for a dense GEMM
    assert gate_up.tuned is None and down.tuned is None and gate_up.source.startswith(layer_step.NO_DECISION)
    assert "vllm/E=4,N=512" in gate_up.source


def test_a_dense_model_step_holds_its_four_linear_layers_and_no_experts(tmp_path) -> None:
    plan = make_plan(load_model("Llama-3-8B"), 1, "bf16", (64,))
    gemms = layer_step.compose(plan, 64, tmp_path)
    assert [(g.name, g.n, g.k) for g in gemms] == [(n, nn, k) for n, nn, k in bench.dense_layers(plan, 64)]
    assert all(g.tuned is None and g.family == "triton_decode_gemm" for g in gemms)


def test_the_bytes_each_gemm_of_mixtral_tp2_must_move_at_m16() -> None:
    qkv, o, gate_up, down = layer_step.compose(make_plan(load_model("Mixtral-8x7B"), 2, "bf16", (16,)), 16,
                                               Path("no-run"))
    assert [(g.n, g.k) for g in (qkv, o, gate_up, down)] == [(3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168)]
    # bf16: x (16 x K), the weight (N x K) and y (16 x N), each once
    assert qkv.bytes(16, 2) == 25_395_200 and o.bytes(16, 2) == 16_973_824
    # the gate-up reads each token once and writes a row per slot (16 x top-2); the weights of the experts hit only
    assert gate_up.bytes(16, 2, 8) == 940_572_672  # 8 x 14336 x 4096 x 2 = 939.5 MB of it weights
    assert gate_up.bytes(16, 2, 3) == 940_572_672 - 5 * 14336 * 4096 * 2
    # the down GEMM reads a row per slot (32 x 7168) and writes one (32 x 4096)
    assert down.bytes(16, 2, 8) == 470_482_944
    with pytest.raises(ValueError, match=r"experts\.down: experts_hit must be 1 to 8"):
        down.bytes(16, 2)


def test_the_record_sets_each_gemm_and_the_step_against_a_plain_read_of_its_bytes(tmp_path) -> None:
    import read_ceiling

    gemms = layer_step.compose(make_plan(load_model(str(TINY)), 1, "bf16", (4,)), 4, tmp_path)
    calls: list[str] = []
    hits = [0, 0, 3, 3]
    steps = [layer_step.StepLaunch((lambda i=i: calls.append(f"t{i}")), (lambda i=i: calls.append(f"u{i}")),
                                   g.bytes(4, 2, h or None), h)
             for i, (g, h) in enumerate(zip(gemms, hits, strict=True))]
    timing = layer_step.time_step([(s.tuned, s.untuned) for s in steps], rounds=1, per_round=2, timer=_Timer(calls))
    sizes = layer_step.read_sizes(steps)
    assert sizes == [201_728, 135_168, 1_591_296, 798_720, 2_726_912]  # the tiny model at M = 4, the step last
    # stand-in reads: a GEMM's launch counts 1 in the stand-in timing; its read half that (torch.sum or Triton's)
    reads = [read_ceiling.PlainRead(n, 0.5 if i % 2 else 0.8, 0.8 if i % 2 else 0.5, {"BLOCK": 1024})
             for i, n in enumerate(sizes[:-1])] + [read_ceiling.PlainRead(sizes[-1], 3.0, 2.0, {"BLOCK": 2048})]
    record = layer_step.step_record(4, gemms, steps, timing, reads)
    assert record["m"] == 4 and record["bytes"] == 2_726_912 and record["tuned_ms"] == 4.0
    assert record["read_ms"] == 2.0 and record["read"]["triton_read"] == {"BLOCK": 2048}
    assert record["tuned_pct_of_read"] == 200.0 and record["untuned_over_read"] == 2.0
    for row, nbytes in zip(record["layers"], sizes, strict=False):
        assert row["bytes"] == nbytes and row["read_ms"] == 0.5
        assert row["tuned_pct_of_read"] == 200.0 and row["untuned_over_read"] == 2.0
    assert [row.get("experts_hit") for row in record["layers"]] == [None, None, 3, 3]
    assert bench._step_row(record) == [2.726912, 4.0, 4.0, 1.0, 2.0, 200.0, 2.0]
    # the CPU path: no plain read timed there, and it says why
    unread = layer_step.step_record(4, gemms, steps, timing, None)
    assert unread["bytes"] == 2_726_912 and unread["read_ms"] is None and unread["tuned_pct_of_read"] is None
    assert all(r["read_note"] == layer_step.READ_NOT_MEASURED for r in [unread, *unread["layers"]])


class _Timer:
    """A stand-in for the oracle: each sample is the number of launches one call of ``fn`` makes."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def warm(self, fn) -> None:
        fn()

    def round(self, fn, n: int) -> list[float]:
        before = len(self.calls)
        fn()
        return [float(len(self.calls) - before)] * n


def test_the_step_replays_every_gemm_in_order_and_each_alone_tuned_and_untuned_alternated() -> None:
    calls: list[str] = []
    pairs = [((lambda i=i: calls.append(f"t{i}")), (lambda i=i: calls.append(f"u{i}"))) for i in range(3)]
    timing = layer_step.time_step(pairs, rounds=2, per_round=4, timer=_Timer(calls))
    assert timing.step.tuned_ms == timing.step.untuned_ms == 3.0  # the whole step: the three GEMMs
    assert [(g.tuned_ms, g.untuned_ms) for g in timing.gemms] == [(1.0, 1.0)] * 3
    # warm-ups, then the rounds alternated: tuned step, untuned step, tuned step, untuned step
    assert calls[:12] == ["t0", "t1", "t2", "u0", "u1", "u2"] * 2
    assert calls[12:18] == ["t0", "t1", "t2", "u0", "u1", "u2"]
    assert len(timing.samples_ms["step tuned"]) == 2 * 4 and set(timing.samples_ms) >= {"gemm2 untuned"}


@pytest.mark.slow  # the tiny model's four GEMMs under Triton's interpreter (about 10 s)
def test_the_step_launches_run_the_fused_moe_with_the_decision_and_vllms_default(tmp_path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    _moe_file(tmp_path, {4: 64})
    code = f"""
import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import layer_step
from pathlib import Path
from evotune.model.models import load_model
from evotune.model.plan import make_plan
gemms = layer_step.compose(make_plan(load_model({str(TINY)!r}), 1, "bf16", (4,)), 4, Path({str(tmp_path)!r}))
steps = layer_step.launches(gemms, 4, "cpu", "float16")  # each tuned launch checked against torch there
print(len(steps), [g.tuned is not None for g in gemms])
print(*[(s.bytes, s.experts_hit) for s in steps])
"""
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    first, second = got.stdout.splitlines()
    assert first.split() == ["4", "[False,", "False,", "True,", "True]"]
    qkv, o, gate_up, down = (tuple(map(int, pair.strip("()").split(","))) for pair in second.split(") ("))
    assert qkv == (201_728, 0) and o == (135_168, 0)  # float16 at M = 4: x, W, y
    hit = gate_up[1]  # the experts the routing drawn sends the 4 tokens' 8 slots to: both GEMMs' weights
    assert 1 <= hit <= 4 and down[1] == hit
    assert gate_up[0] == (4 * 256 + hit * 1024 * 256 + 8 * 1024) * 2 and down[0] == (8 * 512 + hit * 256 * 512
                                                                                     + 8 * 256) * 2


@pytest.mark.slow  # the read's sweep through Triton's interpreter
def test_the_plain_reads_are_read_ceilings_timed_as_the_step_is() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH}
    code = f"""
import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
import layer_step, read_ceiling

class Timer:  # each launch its own stand-in time, later ones faster: the last of the sweep is the fastest
    def __init__(self):
        self.seen, self.rounds = [], []
    def warm(self, fn):
        fn()
        self.seen.append(fn)
    def round(self, fn, n):
        fn()
        self.rounds.append(self.seen.index(fn))
        return [100.0 - self.seen.index(fn)] * n

timer = Timer()
(read,) = layer_step.time_reads([1000], rounds=2, per_round=3, timer=timer, device="cpu", sms=1)
assert read.bytes == 1000 and read.torch_sum_ms == 100.0, read
assert read.triton_read_ms == 100.0 - len(read_ceiling.SWEEP) and read.ms == read.triton_read_ms, read
assert read.triton_read == dict(zip(read_ceiling.READ_FIELDS, read_ceiling.SWEEP[-1])), read
assert timer.rounds == [i for i in range(len(read_ceiling.SWEEP) + 1) for _ in range(2)], timer.rounds
print("ok")
"""
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0 and got.stdout.strip() == "ok", got.stderr[-3000:]


def test_decode_step_names_a_run_without_tuned_json(tmp_path, capsys) -> None:
    assert bench.main(["decode-step", "--model", str(TINY), "--run", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert f"--run {tmp_path}: no tuned.json" in capsys.readouterr().err


def test_moe_grid_bound_reads_the_models_experts_and_the_spaces_constraints(tmp_path: Path) -> None:
    """The bound times the fused MoE's two GEMMs at the model's expert shape over the configurations the kernel's
    space keeps for each launch; a model without routed experts is one line and exit 2, nothing written."""
    assert moe_grid_bound.expert_shape("Mixtral-8x7B", 2) == (8, 2, 7168, 4096)
    x, gate = torch.randn(16, 64), torch.randn(64, 4)
    weights, ids = moe.route(x, gate, 2)
    gate_up = moe.make_launch(x, torch.empty(4, 96, 64), torch.ones_like(weights), ids, 2)
    down = moe.make_launch(torch.randn(32, 48), torch.empty(4, 64, 48), weights.reshape(-1, 1), ids.reshape(-1, 1), 1)
    for launch, n_tile, k_tile in ((gate_up, 128, 64), (down, 64, 64)):
        configs = moe_grid_bound.feasible(launch)
        assert configs and len(configs) < bench.GRID_CONFIGS
        # 8 tokens an expert: BLOCK_SIZE_M at most 16; tiles no larger than N and K rounded up to a power of two
        assert {c["BLOCK_SIZE_M"] for c in configs} == {16}
        assert max(c["BLOCK_SIZE_N"] for c in configs) == n_tile and max(c["BLOCK_SIZE_K"] for c in configs) == k_tile
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe_grid_bound.py"), "--model", "Llama-3-8B",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2 and not (tmp_path / "out").exists()
    assert proc.stderr.strip().splitlines() == ["moe_grid_bound.py: error: --model Llama-3-8B: no routed experts, "
                                                "so no fused MoE to bound"]

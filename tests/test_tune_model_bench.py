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
import layer_step  # noqa: E402
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
    assert step["m"] == 16 and all(row["config"] is not None for row in step["layers"])  # every GEMM tuned
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

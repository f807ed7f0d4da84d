"""``tune-model`` on the CPU: plans of the shipped models and of a config.json that is not shipped, the dry run,
the exports and their check, the report, every bad input, and runs of worker processes on one storage with a
stand-in tuner (``tests/model_standin.py``): two workers with no key tuned twice, a run killed and resumed."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from evotune.cli.main import main
from evotune.core.problem import Problem
from evotune.model import exports, report
from evotune.model.models import load_model
from evotune.model.outcome import Outcome
from evotune.model.plan import VLLM_BATCH_SIZES, Family, make_plan
from evotune.model.runner import Ledger
from evotune.reporting.lookup import lookup
from evotune.triton_tuning.export import check_vllm_folder

ROOT = Path(__file__).resolve().parents[1]
# the checkout first, then whatever the suite itself runs with (a GPU machine's packages may come that way)
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
TINY = ROOT / "tests" / "data" / "tiny_moe_config.json"
STANDIN = f"{ROOT / 'tests' / 'model_standin.py'}:make"
sys.path.insert(0, str(ROOT / "tests"))
import model_standin  # noqa: E402


def shapes(name: str, tp: int, dtype: str | None = None) -> dict[tuple[str, int, int], list[str]]:
    plan = make_plan(load_model(name), tp, dtype)
    return {(k.shape.family.value, k.shape.n, k.shape.k): k.layers for k in plan.kernels}


def test_llama_3_8b_at_tp1_has_four_dense_layers_each_decode_and_gemm() -> None:
    plan = make_plan(load_model("Llama-3-8B"), 1)
    assert plan.dtype == "bf16"
    got = {(k.shape.family, k.shape.n, k.shape.k): [key.m for key in k.keys] for k in plan.kernels}
    decode = [m for m in VLLM_BATCH_SIZES if m <= 64]
    gemm = [m for m in VLLM_BATCH_SIZES if m > 64]
    expected = {(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)}  # qkv, o, gate_up, down
    assert got == {**{(Family.DECODE, n, k): decode for n, k in expected},
                   **{(Family.GEMM, n, k): gemm for n, k in expected}}
    assert len(plan.keys) == 4 * 18


def test_llama_3_70b_at_tp8_replicates_the_kv_heads() -> None:
    assert shapes("Llama-3-70B", 8) == {
        (fam, n, k): [layer] for fam in ("triton_decode_gemm", "triton_matmul")
        for layer, n, k in [("qkv_proj", (8 + 2) * 128, 8192), ("o_proj", 8192, 1024),
                            ("gate_up_proj", 2 * 3584, 8192), ("down_proj", 8192, 3584)]}


def test_mixtral_at_tp2_tunes_the_fused_moe_at_every_vllm_batch_size() -> None:
    plan = make_plan(load_model("Mixtral-8x7B"), 2)
    moe = [k for k in plan.kernels if k.shape.family is Family.FUSED_MOE]
    assert len(moe) == 1
    assert (moe[0].shape.experts, moe[0].shape.top_k, moe[0].shape.n, moe[0].shape.k) == (8, 2, 14336, 4096)
    assert [k.m for k in moe[0].keys] == list(VLLM_BATCH_SIZES)
    assert {(s[1], s[2]) for s in shapes("Mixtral-8x7B", 2) if s[0] != "fused_moe"} == {(3072, 4096), (4096, 2048)}


def test_deepseek_v3_at_tp8_is_block_fp8_with_latent_attention() -> None:
    got = shapes("DeepSeek-V3", 8)
    assert got == {("fused_moe", 512, 7168): ["experts (gate_up and down)"],
                   ("triton_block_fp8", 1536, 7168): ["q_a_proj"], ("triton_block_fp8", 3072, 1536): ["q_b_proj"],
                   ("triton_block_fp8", 576, 7168): ["kv_a_proj"], ("triton_block_fp8", 4096, 512): ["kv_b_proj"],
                   ("triton_block_fp8", 7168, 2048): ["o_proj"],
                   ("triton_block_fp8", 4608, 7168): ["dense_gate_up_proj"],
                   ("triton_block_fp8", 7168, 2304): ["dense_down_proj"],
                   ("triton_block_fp8", 512, 7168): ["shared_experts.gate_up_proj"],
                   ("triton_block_fp8", 7168, 256): ["shared_experts.down_proj"]}
    plan = make_plan(load_model("DeepSeek-V3"), 8)
    assert plan.dtype == "fp8" and load_model("DeepSeek-V3").fp8_block == (128, 128)
    assert len(plan.keys) == 10 * 18


def test_kernels_keeps_the_families_named(capsys) -> None:
    assert main(["tune-model", "Mixtral-8x7B", "--tp", "2", "--kernels", "fused_moe", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 kernels, 18 keys" in out and "triton_decode_gemm" not in out


def test_a_config_json_not_shipped() -> None:
    model = load_model(str(TINY))
    assert (model.name, model.head_dim, model.kv_heads) == ("tiny_moe_config", 32, 2)
    plan = make_plan(model, 2, batch_sizes=(1, 64, 128))
    got = {(k.shape.family.value, k.shape.n, k.shape.k): [key.m for key in k.keys] for k in plan.kernels}
    assert got == {("fused_moe", 512, 256): [1, 64, 128],
                   ("triton_decode_gemm", (4 + 2) * 32, 256): [1, 64], ("triton_matmul", (4 + 2) * 32, 256): [128],
                   ("triton_decode_gemm", 256, 128): [1, 64], ("triton_matmul", 256, 128): [128]}


def test_dry_run_of_deepseek_v3_at_tp8_prints_the_plan_and_creates_nothing(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["tune-model", "DeepSeek-V3", "--tp", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tp 8, fp8" in out and "10 kernels, 180 keys" in out
    assert "fused_moe E=256 top_k=8 N=512 K=7168" in out and "triton_block_fp8 N=7168 K=2304" in out
    total = next(line for line in out.splitlines() if line.startswith("total")).split()
    # evotune: 64 evaluations a key, 5.2 s a key as measured on one GPU; the grid: 1,920 fused-MoE and 1,280
    # block-fp8 configurations at each of 18 keys, 0.2 s each, each built once, 1.5 s
    grid = 18 * 1920 + 9 * 18 * 1280
    assert total == ["total", "180", str(180 * 64), f"{180 * 5.2 / 60:.1f}", "min",
                     str(grid), f"{(grid * 0.2 + (1920 + 9 * 1280) * 1.5) / 3600:.1f}", "h"]
    assert list(tmp_path.iterdir()) == []


def outcome(family: Family, m: int, n: int, k: int, device: str = "NVIDIA H100 80GB HBM3", e: int = 0,
            config: dict[str, int] | None = None, tuned: float = 1.0, untuned: float | None = 2.0) -> Outcome:
    fields = {"M": m, "N": n, "K": k} | ({"E": e, "top_k": 2} if e else {})
    return Outcome(f"{family.value} {n} {k} M={m}", f"{family.value} N={n} K={k}", family.value, fields,
                   config or dict(model_standin.CONFIGS[1]), 6, 6, 1.0, tuned, untuned, "confirmed", device, "3.4.0")


def test_exports_name_files_as_vllm_and_sglang_look_them_up(tmp_path) -> None:
    rows = [outcome(Family.FUSED_MOE, m, 512, 7168, e=256) for m in (64, 1)] + \
           [outcome(Family.BLOCK_FP8, 1, 1536, 7168), outcome(Family.DECODE, 1, 4096, 4096)]
    written = exports.write_server_files(rows, tmp_path, "fp8", (128, 128))
    assert sorted(str(p.relative_to(tmp_path)) for p in written) == sorted([
        "vllm/E=256,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
        "vllm/N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json",
        "sglang/fused_moe_triton/configs/triton_3_4_0/"
        "E=256,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json",
        "sglang/quantization/configs/N=1536,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,"
        "block_shape=[128, 128].json"])
    moe = json.loads((tmp_path / "vllm" / "E=256,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,"
                                          "block_shape=[128,128].json").read_text())
    assert list(moe) == ["triton_version", "1", "64"] and moe["1"] == model_standin.CONFIGS[1]
    assert len(exports.check_folder(tmp_path)) == 4
    assert len(check_vllm_folder(tmp_path / "vllm")) == 2  # export-configs --check reads them too


def test_vllm_names_every_h200_alike_for_the_fused_moe_and_sglang_does_not(tmp_path) -> None:
    rows = [outcome(Family.FUSED_MOE, 1, 14336, 4096, device="NVIDIA H200 NVL", e=8)]
    names = {p.relative_to(tmp_path).parts[0]: p.name for p in exports.write_server_files(rows, tmp_path, "bf16")}
    assert names == {"vllm": "E=8,N=7168,device_name=NVIDIA_H200.json",
                     "sglang": "E=8,N=7168,device_name=NVIDIA_H200_NVL.json"}


@pytest.mark.parametrize(("name", "doc", "said"), [
    ("E=8,N=7168,device_name=NVIDIA_H200_NVL.json", {"1": model_standin.CONFIGS[0]}, "device_name"),
    ("E=8,N=7168,device_name=X.json", {"1": {**model_standin.CONFIGS[0], "num_warps": 3}}, "1.num_warps"),
    ("E=8,N=7168,device_name=X.json", {"1": model_standin.CONFIGS[0], "one": model_standin.CONFIGS[0]},
     "one: not a batch size"),
    ("N=1,K=7168,device_name=X,dtype=fp8_w8a8,block_shape=[128, 128].json", {"1": model_standin.CONFIGS[0]},
     "(name)"),
])
def test_the_checker_names_the_file_and_the_field(tmp_path, name, doc, said) -> None:
    path = tmp_path / "vllm" / name
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    with pytest.raises(exports.ServerFileError, match=f"{re.escape(name)}: .*{re.escape(said)}"):
        exports.check_folder(tmp_path)


def test_a_block_fp8_step_that_does_not_divide_the_block_is_refused(tmp_path) -> None:
    bad = {**model_standin.CONFIGS[0], "BLOCK_SIZE_K": 256}
    with pytest.raises(exports.ServerFileError, match="BLOCK_SIZE_K: 256 does not divide the block's K 128"):
        exports.write_server_files([outcome(Family.BLOCK_FP8, 1, 1536, 7168, config=bad)], tmp_path, "fp8", (128, 128))
    assert list(tmp_path.iterdir()) == []


def test_the_default_tuner_builds_ahead_for_the_same_kernels_later_keys_in_the_plans_order() -> None:
    """While a key is searched its build processes build for the keys of its kernel after it (tune_kernel's
    ``upcoming``), by the fields its keys file names; another kernel's keys are not among them."""
    from types import SimpleNamespace

    from evotune.model.tuning import AutotuneTuner

    plan = make_plan(load_model("Mixtral-8x7B"), 2)
    moe = next(k for k in plan.kernels if k.shape.family is Family.FUSED_MOE)
    later = AutotuneTuner._after(SimpleNamespace(plan=plan), moe.keys[-3])  # type: ignore[arg-type]
    assert later == [k.fields() for k in moe.keys[-2:]] and [k["M"] for k in later] == [3072, 4096]
    assert AutotuneTuner._after(SimpleNamespace(plan=plan), moe.keys[-1]) == []  # type: ignore[arg-type]


def test_report_per_kernel(tmp_path) -> None:
    plan = make_plan(load_model(str(TINY)), 1, batch_sizes=(1, 2))
    moe = next(k for k in plan.kernels if k.shape.family is Family.FUSED_MOE)
    done = {key.ident: Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(),
                               model_standin.CONFIGS[0], 5, 5, 2.5, 1.0, untuned, "confirmed", "cpu", "3.4.0",
                               "vllm_fused_moe", compiles, 5 - compiles, timing)
            for key, untuned, compiles, timing in zip(moe.keys, (2.0, 8.0), (5, 1), (0.5, None), strict=True)}
    rep = report.build_report(plan, done, ["vllm/x.json"])
    row = next(r for r in rep.kernels if r.family == "fused_moe")
    assert (row.decided, row.keys, row.evaluations, row.gpu_s, row.measured) == (2, 2, 10, 5.0, 2)
    assert row.timing_s == 0.5  # of the seconds held, those timing (a key that did not count them is left out)
    assert row.ratio_geomean == pytest.approx(4.0) and (row.ratio_min, row.ratio_max) == (2.0, 8.0)
    assert row.untuned == "vLLM default config" and row.grid_gpu_s == pytest.approx(1920 * (2 * 0.2 + 1.5))
    dense = [r for r in rep.kernels if r.family != "fused_moe"]
    assert all(r.decided == 0 and r.ratio_geomean is None and r.untuned == "cuBLAS" for r in dense)
    md, js = report.write_report(rep, tmp_path)
    assert "| 2/2 | 10 | 5.0 | 0.5 |" in md.read_text() and "4.000x" in md.read_text()
    assert "| 2.000x - 8.000x | 5, 1 |" in md.read_text()  # compiles per key, in batch-size order
    doc = json.loads(js.read_text())
    assert doc["kernels"][0]["ratio_geomean"] == pytest.approx(4.0)
    assert (doc["kernels"][0]["compiles"], doc["kernels"][0]["loads"]) == ([5, 1], [0, 4])
    assert [o["compiles"] for o in doc["outcomes"]] == [5, 1]


@pytest.fixture
def bad(tmp_path, monkeypatch, capsys):
    """Run the command in ``tmp_path`` with ``env``; its one line on stderr, after checking exit code 2 and that
    nothing was created."""
    monkeypatch.chdir(tmp_path)

    def run(argv: list[str], env: dict[str, str] | None = None) -> str:
        for name in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(name, raising=False)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        before = set(tmp_path.rglob("*"))
        capsys.readouterr()
        assert main(["tune-model", *argv, "--no-progress"]) == 2
        assert set(tmp_path.rglob("*")) == before
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    return run


def _config(tmp_path: Path, **changes: object) -> str:
    doc = json.loads(TINY.read_text())
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    path = tmp_path / "cfg" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


def test_bad_inputs_say_one_line_exit_2_and_create_nothing(tmp_path, bad) -> None:
    cfg = _config(tmp_path, hidden_size=None)
    assert bad([cfg]).endswith("config.json: hidden_size: missing (a Hugging Face config.json field "
                                          "this model needs)")
    cfg = _config(tmp_path, num_experts_per_tok=None)
    assert "config.json: num_experts_per_tok: missing" in bad([cfg])
    cfg = _config(tmp_path, intermediate_size=510)
    assert "--tp 4: does not divide intermediate_size 510" in bad([cfg, "--tp", "4"])
    assert "--tp 3: does not divide num_attention_heads 32" in bad(["Llama-3-8B", "--tp", "3"])
    assert "--kernels: expected all or families of triton_decode_gemm, triton_matmul" in \
        bad(["Llama-3-8B", "--kernels", "moe", "--dry-run"])
    assert "--kernels: Llama-3-8B at tp 1, bf16, has no kernel of fused_moe" in \
        bad(["Llama-3-8B", "--kernels", "fused_moe", "--dry-run"])
    assert "MODEL: Llama-9: neither a config.json path nor a shipped model (DeepSeek-V3, Llama-3-70B" in \
        bad(["Llama-9", "--dry-run"])
    assert "missing.json: no such file" in bad(["missing.json"])
    assert "--batch-sizes: expected vllm or positive integers" in bad(["Llama-3-8B", "--batch-sizes",
                                                                                  "1,x"])
    assert "--gpus 8: this host has 2 GPUs" in bad(["Llama-3-8B", "--gpus", "8", "--out", "o"],
                                                    {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert "--gpus 8: this host has no GPU (set TRITON_INTERPRET=1" in \
        bad(["Llama-3-8B", "--gpus", "8", "--out", "o"], {"CUDA_VISIBLE_DEVICES": ""})
    assert "--workers-per-gpu: expected an integer >= 1, got '0'" in bad(["Llama-3-8B", "--workers-per-gpu", "0"])
    assert "--storage: 'nonsense' is not a storage URL" in \
        bad([str(TINY), "--gpus", "1", "--out", "o", "--storage", "nonsense", "--tuner", STANDIN],
            {"TRITON_INTERPRET": "1"})
    assert "--dtype int8: the default tuner's kernels are bf16 and fp8" in \
        bad([str(TINY), "--dtype", "int8", "--gpus", "1", "--out", "o"], {"TRITON_INTERPRET": "1"})
    cfg = _config(tmp_path, quantization_config={"quant_method": "fp8", "weight_block_size": [64, 64]})
    assert "config.json: weight_block_size: [64, 64]; the default tuner's fp8 kernels (block-fp8 and the fused MoE) " \
        "take [128, 128]" in bad([cfg, "--gpus", "1", "--out", "o"], {"TRITON_INTERPRET": "1"})


def _run(out: Path, *extra: str, env: dict[str, str] | None = None, wait: bool = True):
    full_env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": PYTHONPATH, **(env or {})}
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [sys.executable, "-m", "evotune", "tune-model", str(TINY), "--batch-sizes", "1,2,64,128", "--tuner",
            STANDIN, "--out", str(out), "--no-progress", *extra]
    if wait:
        return subprocess.run(argv, env=full_env, capture_output=True, text=True)
    # Ctrl-C reaches the run as at a terminal: a test process that ignores SIGINT (a shell's background job, as
    # CI may start the suite) would pass that on to the command, and Python then leaves it ignored
    return subprocess.Popen(argv, env=full_env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_at_a_terminal)


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ledger(out: Path) -> Ledger:
    plan = make_plan(load_model(str(TINY)), 1, None, (1, 2, 64, 128))
    return Ledger(f"sqlite:///{out / 'tune_model.db'}", plan.ident)


def _no_evaluation_twice(out: Path) -> list[dict]:
    evals = model_standin.evaluations(out)
    seen = [(e["key"], json.dumps(e["config"], sort_keys=True)) for e in evals]
    assert len(seen) == len(set(seen))
    return evals


@pytest.mark.slow  # worker processes
def test_two_workers_on_one_storage_tune_no_key_twice(tmp_path) -> None:
    out = tmp_path / "out"
    got = _run(out, "--gpus", "2", env={"STANDIN_SLEEP": "0.1"})
    assert got.returncode == 0, got.stderr
    plan = make_plan(load_model(str(TINY)), 1, None, (1, 2, 64, 128))
    outcomes = _ledger(out).outcomes()
    assert set(outcomes) == {k.ident for k in plan.keys}
    evals = _no_evaluation_twice(out)
    assert len(evals) == len(plan.keys) * len(model_standin.CONFIGS)
    assert len({e["pid"] for e in evals}) == 2  # both workers tuned keys
    assert all(o.new == o.evaluations == len(model_standin.CONFIGS) for o in outcomes.values())
    assert len(exports.check_folder(out)) == 2 and (out / "report.md").is_file()
    # the dense GEMMs, as lookup() reads them: QKV of the tiny model at M = 2 (a decode key)
    hit = lookup(Problem.gemm(2, (8 + 2 * 2) * 32, 256, "bf16", "tn"), space="standin", path=out / "tuned.json")
    qkv = outcomes[next(k.ident for k in plan.keys if k.shape.n == 384 and k.m == 2)]
    assert hit.exact and hit.config == qkv.config and hit.time_ms == qkv.time_ms
    # a second run decides nothing again
    again = _run(out, "--gpus", "2")
    assert again.returncode == 0 and len(model_standin.evaluations(out)) == len(evals)
    assert _ledger(out).outcomes() == outcomes


@pytest.mark.slow  # worker processes
def test_workers_sharing_a_gpu_take_turns_and_tune_no_key_twice(tmp_path) -> None:
    """Two workers on one device: each gives the device up while it waits for a build, so both tune keys, and no
    evaluation of one overlaps one of the other."""
    out = tmp_path / "out"
    got = _run(out, "--gpus", "1", "--workers-per-gpu", "2", env={"STANDIN_SLEEP": "0.04", "STANDIN_BUILD": "0.04"})
    assert got.returncode == 0, got.stderr
    plan = make_plan(load_model(str(TINY)), 1, None, (1, 2, 64, 128))
    assert set(_ledger(out).outcomes()) == {k.ident for k in plan.keys}
    evals = _no_evaluation_twice(out)
    assert len(evals) == len(plan.keys) * len(model_standin.CONFIGS)
    assert len({e["pid"] for e in evals}) == 2  # both workers tuned keys
    spans = sorted((e["held"][0], e["held"][1], e["pid"]) for e in evals)
    for (_, end, pid), (start, _, other) in itertools.pairwise(spans):
        assert pid == other or start >= end  # one evaluation at a time on the device
    assert not list(Path(tempfile.gettempdir()).glob("evotune-gpu-turns-*"))  # the turns' files go with the run


def _mid_key(out: Path) -> bool:
    """Three keys fully evaluated, and another with a few of its six configurations evaluated (not the last); read
    from the stand-in's files, so that nothing opens the storage while the workers write it."""
    counts: dict[str, int] = {}
    for e in model_standin.evaluations(out) if (out / "standin").is_dir() else []:
        counts[e["key"]] = counts.get(e["key"], 0) + 1
    full = len(model_standin.CONFIGS)
    return sum(n == full for n in counts.values()) >= 3 and any(1 <= n <= full - 2 for n in counts.values())


@pytest.mark.slow  # worker processes, stopped and resumed
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_or_interrupted_run_resumes_with_nothing_lost_or_timed_twice(tmp_path, how) -> None:
    out = tmp_path / "out"
    proc = _run(out, "--gpus", "2", env={"STANDIN_SLEEP": "0.15"}, wait=False)
    try:
        while not _mid_key(out):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, how)  # the run and both workers, mid-key (SIGINT: Ctrl-C at a terminal)
        _, err = proc.communicate()
    if how is signal.SIGINT:
        assert proc.returncode == 130 and "run the same command again to resume" in err
        assert not _ledger(out).claims.active()  # every claim given back
    before = _ledger(out).outcomes()
    partial = len(model_standin.evaluations(out))
    assert 1 <= len(before) < 12 and partial > len(before) * len(model_standin.CONFIGS)
    got = _run(out, "--gpus", "1")
    assert got.returncode == 0, got.stderr
    after = _ledger(out).outcomes()
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())  # decided keys were not tuned again
    evals = _no_evaluation_twice(out)
    assert len(evals) == 12 * len(model_standin.CONFIGS)
    resumed = [o for k, o in after.items() if k not in before and o.new < o.evaluations]
    assert resumed  # a key cut mid-way went on from its stored evaluations


@pytest.mark.gpu
@pytest.mark.slow  # evotune's autotune on every key of the tiny model, on one GPU
def test_the_default_tuner_on_a_gpu(tmp_path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    got = subprocess.run([sys.executable, "-m", "evotune", "tune-model", str(TINY), "--batch-sizes", "1,128",
                          "--gpus", "1", "--out", str(out), "--no-progress"], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    doc = json.loads((out / "report.json").read_text())
    assert all(k["decided"] == k["keys"] and k["measured"] == k["keys"] for k in doc["kernels"])
    assert all(0 < k["timing_s"] < k["gpu_s"] for k in doc["kernels"])  # compiles hold the GPU too
    assert [p.name for p in exports.check_folder(out)] and (out / "autotune.db").is_file()
    # decode keys by the decode family, confirmed beside cuBLAS, found by lookup() in tuned.json unless cuBLAS
    # was confirmed faster (the tiny model's small layers: nothing better to hand out)
    decode = [o for o in doc["outcomes"] if o["family"] == "triton_decode_gemm"]
    assert decode and all(o["space"] == "triton_decode_gemm" and o["how"] == "confirmed" for o in decode)
    for o in decode:
        f = o["fields"]
        untuned_wins = o["untuned_ms"] is not None and o["untuned_ms"] < o["time_ms"]
        try:
            found = lookup(Problem.gemm(f["M"], f["N"], f["K"], "bf16", "tn"), space="triton_decode_gemm",
                           path=out / "tuned.json").exact
        except LookupError:
            found = False
        assert found is not untuned_wins, o
    # a second run times nothing
    again = subprocess.run([sys.executable, "-m", "evotune", "tune-model", str(TINY), "--batch-sizes", "1,128",
                            "--gpus", "1", "--out", str(out), "--no-progress"], env=env, capture_output=True,
                           text=True)
    assert again.returncode == 0 and json.loads((out / "report.json").read_text())["outcomes"] == doc["outcomes"]


@pytest.mark.slow  # worker processes, one killed
def test_a_worker_killed_mid_key_leaves_its_key_to_the_other(tmp_path) -> None:
    out = tmp_path / "out"
    proc = _run(out, "--gpus", "2", env={"STANDIN_SLEEP": "0.15"}, wait=False)
    try:
        victim = None
        while victim is None:
            assert proc.poll() is None, proc.communicate()
            counts: dict[tuple[str, int], int] = {}
            for e in model_standin.evaluations(out) if (out / "standin").is_dir() else []:
                counts[(e["key"], e["pid"])] = counts.get((e["key"], e["pid"]), 0) + 1
            started = [pid for (_, pid), n in counts.items() if 1 <= n <= len(model_standin.CONFIGS) - 2]
            victim = started[0] if len({pid for _, pid in counts}) == 2 and started else None
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1 and "run the same command to go on" in err
    assert len(_ledger(out).outcomes()) == 12  # the other worker took the dead one's key over
    evals = _no_evaluation_twice(out)
    assert len(evals) == 12 * len(model_standin.CONFIGS)
    assert any(e["pid"] == victim for e in evals)
    again = _run(out, "--gpus", "1")
    assert again.returncode == 0 and len(exports.check_folder(out)) == 2


def test_int8_fused_moe_files_name_vllms_int8_dtype(tmp_path) -> None:
    written = exports.write_server_files([outcome(Family.FUSED_MOE, 1, 1024, 256, e=4)], tmp_path, "int8")
    names = sorted(p.name for p in written)
    assert names == ["E=4,N=512,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a8.json"] * 2


def test_the_record_and_its_claims_on_a_journal_file(tmp_path) -> None:
    url = f"journal:{tmp_path / 'run.journal'}"
    ledger = Ledger(url, "tune-model/x/tp1/bf16")
    done = outcome(Family.FUSED_MOE, 1, 1024, 256, e=4)
    assert ledger.claims.claim(done.key).mine
    ledger.record(done)
    ledger.claims.finish(done.key)
    again = Ledger(url, "tune-model/x/tp1/bf16")  # another process opening the same run
    assert again.outcomes() == {done.key: done}
    assert not again.claims.claim(done.key).mine  # decided: nobody tunes it again


def test_each_worker_gets_its_share_of_the_hosts_cores_for_its_build_processes(tmp_path, monkeypatch) -> None:
    from evotune.model.runner import RunOptions, worker_env

    options = RunOptions(str(TINY), 1, None, "1,2", f"sqlite:///{tmp_path / 'tune_model.db'}", str(tmp_path), STANDIN)
    monkeypatch.delenv("EVOTUNE_COMPILE_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert worker_env(options, 4)["EVOTUNE_COMPILE_THREADS"] == "14"  # 16 cores a worker, less two
    assert worker_env(options, 1)["EVOTUNE_COMPILE_THREADS"] == "16"  # at most 16: each holds a CUDA context
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert worker_env(options, 2)["EVOTUNE_COMPILE_THREADS"] == "1"
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "3")  # the user's choice is every worker's
    assert worker_env(options, 4)["EVOTUNE_COMPILE_THREADS"] == "3"


def test_the_workers_server_imports_the_default_tuners_kernels_and_no_tuner_file() -> None:
    from evotune.model import tuning
    from evotune.model.preload import DEFAULT_TUNER, worker_preload

    default = worker_preload(DEFAULT_TUNER)
    kernels = {s.ref.partition(":")[0] for s in tuning.SOURCES.values()}
    assert kernels <= set(default) and {"torch", "triton", "evotune.model.tuning"} <= set(default)
    standin = worker_preload(STANDIN)
    assert "torch" not in standin and not any(m.endswith(".py") for m in standin)


@pytest.mark.parametrize(("argv", "starts"), [
    (["tune-model", "Mixtral-8x7B", "--tp", "2"], True),
    (["tune-model", "Mixtral-8x7B", "--dry-run"], False),
    (["tune-model", "--help"], False),
    (["tune-model", "Mixtral-8x7B", "--tuner", STANDIN], False),
    (["tune-model", "Mixtral-8x7B", f"--tuner={STANDIN}"], False),
    (["tune-model", "Mixtral-8x7B", "--tuner", "evotune.model.tuning:autotune_tuner"], True),  # the default, named
    (["tune-model", "Mixtral-8x7B", "--tuner=evotune.model.tuning:autotune_tuner"], True),
    (["tune-model", "Mixtral-8x7B", "--tuner"], False),  # argparse's error to give
    (["run", "experiment.toml"], False),
    ([], False),
])
def test_the_command_line_starts_the_workers_server_first_only_for_a_run_of_the_default_tuner(
        monkeypatch, argv, starts) -> None:
    import evotune.measurement.processes as processes
    from evotune.model.preload import DEFAULT_TUNER, start_for, worker_preload

    started: list[tuple[str, ...]] = []
    monkeypatch.setattr(processes, "start_method", lambda preload=(): started.append(tuple(preload)))
    assert start_for(argv) is starts
    assert started == ([worker_preload(DEFAULT_TUNER)] if starts else [])


def test_a_worker_forked_after_the_preload_opens_its_storage_and_searches_without_importing(tmp_path) -> None:
    # what a worker imports after its fork, four workers at once, is seconds before its first evaluation
    script = f"""
import importlib, sys
from evotune.model.preload import PRELOAD
for entry in PRELOAD + ("evotune.search.surrogate:one_blas_thread",):
    module, _, function = entry.partition(":")
    loaded = importlib.import_module(module)
    if function:
        getattr(loaded, function)()
before = set(sys.modules)
from evotune.storage.study import make_storage
from evotune.search.surrogate import one_blas_thread
make_storage("sqlite:///{tmp_path / 'run.db'}")
with one_blas_thread():
    pass
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("sqlalchemy", "alembic", "scipy")))
"""
    got = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": PYTHONPATH},
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"

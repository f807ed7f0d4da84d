"""vLLM config files from evotune.autotune's cache: the block-fp8 linear layers' files, fp8 fused-MoE names, and the
check that reads written files back. The rows are what ``export.entries`` returns for a cache; one test tunes the
block-fp8 kernel under Triton's interpreter and exports its cache through the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from evotune.cli import main
from evotune.triton_tuning.export import (
    ExportError,
    check_vllm_folder,
    vllm_block_fp8,
    vllm_moe,
    write_vllm_block_fp8,
    write_vllm_files,
)

H100 = "NVIDIA H100 80GB HBM3"
CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
          "num_stages": 3}
BLOCK_FILE = "N=4096,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json"


def row(key: dict, config: dict | None = None, device: str = H100, kernel: str = "w8a8_block_fp8_matmul",
        dtype: str = "torch.float8_e4m3fn") -> dict:
    """One decided key of a cache, as ``export.entries`` lists it."""
    return {"kernel": kernel, "source_hash": "5f1e", "triton_version": "3.9.0", "device": device,
            "key": {**key, "A.dtype": dtype, "As.dtype": "torch.float32"}, "config": {**CONFIG, **(config or {})},
            "time_ms": 0.012, "how": "confirmed", "date": "2026-11-20T10:00:00",
            "study": f"autotune/{kernel}/5f1e/{device}/{key}"}


def test_block_fp8_files_are_vllms_one_per_n_k_and_device():
    rows = [row({"M": 16, "N": 4096, "K": 7168}, {"BLOCK_SIZE_M": 32}), row({"M": 1, "N": 4096, "K": 7168}),
            row({"M": 4, "N": 7168, "K": 18432}, {"BLOCK_SIZE_K": 64}), row({"M": 1, "N": 4096, "K": 7168},
                                                                            device="NVIDIA H200 NVL")]
    files = vllm_block_fp8(rows)
    assert sorted(files) == [BLOCK_FILE, BLOCK_FILE.replace("H100_80GB_HBM3", "H200_NVL"),  # no H200 family here
                             "N=7168,K=18432,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,"
                             "block_shape=[128,128].json"]
    # batch sizes only, in increasing order, each the six fields vLLM's kernel takes
    assert list(files[BLOCK_FILE]) == ["1", "16"]
    assert files[BLOCK_FILE]["16"] == {**CONFIG, "BLOCK_SIZE_M": 32}
    assert list(vllm_block_fp8(rows[:1], block_shape=(128, 256))) == [BLOCK_FILE.replace("[128,128]", "[128,256]")]


def test_fp8_fused_moe_files_carry_vllms_dtype_block_shape_and_h200_name():
    fp8 = [row({"M": 1, "E": 8, "N": 14336}, kernel="fused_moe_kernel", device="NVIDIA H200 NVL")]
    assert list(vllm_moe(fp8, n_divisor=2)) == ["E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json"]
    assert list(vllm_moe(fp8, block_shape=(128, 128))) == [
        "E=8,N=14336,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"]
    bf16 = [row({"M": 1, "E": 8, "N": 14336}, kernel="fused_moe_kernel", dtype="torch.bfloat16")]
    (name, doc), = vllm_moe(bf16).items()
    assert name == "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json" and list(doc) == ["triton_version", "1"]


@pytest.mark.parametrize(("rows", "says"), [
    ([row({"M": 1, "N": 4096, "K": 7168}, {"BLOCK_SIZE_K": 256})],
     "config field 'BLOCK_SIZE_K': 256 does not divide the block's K 128"),
    ([row({"M": 1, "N": 4096, "K": 7168}, dtype="torch.bfloat16")], "key: no e4m3 tensor (A.dtype = torch.bfloat16"),
    ([row({"M": 1, "N": 4096})], "key field 'K' missing"),
    ([row({"M": 1, "N": 4096, "K": 7168}), row({"M": 2, "N": 4096, "K": 7168}, kernel="other")],
     "kernels w8a8_block_fp8_matmul and other both have it"),
])
def test_a_block_fp8_export_refuses_what_vllm_could_not_run(tmp_path, rows, says):
    with pytest.raises(ExportError, match="^" + ("autotune/" if "both" not in says else "N=4096")) as exc:
        write_vllm_block_fp8(rows, tmp_path / "out")
    assert says in str(exc.value) and not (tmp_path / "out").exists()


GOOD = {BLOCK_FILE: {"1": CONFIG, "16": {**CONFIG, "BLOCK_SIZE_M": 32}},
        "E=8,N=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8.json": {"triton_version": "3.9.0", "1": CONFIG}}
BAD = [  # (file name, contents, what the one line names)
    ("N=4096,K=7168,device_name=NVIDIA_H100_80GB_HBM3.json", {"1": CONFIG}, "(name): neither vLLM's"),
    ("E=8,N=7168,device_name=NVIDIA_H200_NVL,dtype=fp8_w8a8.json", {"1": CONFIG}, "device_name: vLLM's fused MoE"),
    (BLOCK_FILE, {"triton_version": "3.9.0", "1": CONFIG}, "triton_version: not a batch size"),
    (BLOCK_FILE, {"1": CONFIG, "1.5": CONFIG}, "1.5: not a batch size"),
    (BLOCK_FILE, {"1": {**CONFIG, "BLOCK_SIZE_K": 256}}, "1.BLOCK_SIZE_K: 256 does not divide the block's K 128"),
    (BLOCK_FILE, {"1": {**CONFIG, "num_warps": 6}}, "1.num_warps: expected a power of two, got 6"),
    (BLOCK_FILE, {"1": {**CONFIG, "SPLIT_K": 2}}, "1: expected the fields BLOCK_SIZE_M"),
    (BLOCK_FILE, [CONFIG], "(contents): expected a JSON object of batch sizes, got list"),
    (BLOCK_FILE, {}, "(contents): no batch size in it"),
]


def test_the_check_reads_written_files_back(tmp_path, capsys):
    paths = write_vllm_files(GOOD, tmp_path / "ok")
    assert check_vllm_folder(tmp_path / "ok") == paths
    assert main(["export-configs", "--check", str(tmp_path / "ok")]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{p}: ok" for p in paths]


@pytest.mark.parametrize(("name", "doc", "says"), BAD, ids=[b[2].split(":")[0] for b in BAD])
def test_the_check_names_the_file_and_field_of_what_vllm_would_not_read(tmp_path, capsys, name, doc, says):
    with pytest.raises(ExportError):  # nothing is written that fails the check
        write_vllm_files({name: doc}, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    folder = tmp_path / "written"
    folder.mkdir()
    (folder / name).write_text(json.dumps(doc))
    assert main(["export-configs", "--check", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{folder / name}: {says}" in err, err


def test_the_check_of_a_folder_without_config_files(tmp_path, capsys):
    assert main(["export-configs", "--check", str(tmp_path)]) == 2
    assert "no vLLM config files" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("{not json")
    assert main(["export-configs", "--check", str(tmp_path)]) == 2
    assert f"{tmp_path / 'x.json'}: (syntax): cannot read it as JSON" in capsys.readouterr().err
    assert main(["export-configs", "--check", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["export-configs", "--format", "vllm-block-fp8", "--block-shape", "128"]) == 2
    assert "--block-shape: expected two positive integers N,K" in capsys.readouterr().err


TUNE = """
import sys
import triton
import evotune
from evotune.core.problem import Problem, get_workload
from evotune.measurement.workloads import gemm
from search_spaces import _triton_block_fp8 as kernels

CONFIGS = [triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1},
                         num_warps=4, num_stages=2),
           triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16},
                         num_warps=8, num_stages=3)]
tuned = evotune.autotune(configs=CONFIGS, key=["M", "N", "K"], cache=sys.argv[1])(kernels._block_scaled_gemm)
# one 128 x 128 weight block: what is exported does not depend on the size, the interpreter's work does
for m in (1, 16):
    problem = Problem.gemm(m, 128, 128, "fp8", "tn", "block")
    a, b, sa, sb, c = gemm.make_inputs(problem, seed=1, device="cpu")
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(128, meta["BLOCK_SIZE_N"]),)
    tuned[grid](a, b, sa, sb, c, m, 128, 128, a.stride(0), b.stride(1), sa.stride(0), sa.stride(1), sb.stride(0),
                sb.stride(1), c.stride(0), SCALE_GROUP=128)
    assert get_workload("gemm").verify(problem, (a, b, sa, sb, c))[0]
"""


@pytest.mark.slow  # the kernel tuned under Triton's interpreter, in another process
def test_the_block_fp8_kernel_tuned_by_evotune_autotune_exports_as_vllms_file(tmp_path, capsys):
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", TUNE, str(tmp_path / "cache")], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "vllm"
    assert main(["export-configs", "--cache", str(tmp_path / "cache"), "--format", "vllm-block-fp8", "--out",
                 str(out)]) == 0
    (path,) = out.iterdir()
    assert path.name == "N=128,K=128,device_name=cpu-interpreter,dtype=fp8_w8a8,block_shape=[128,128].json"
    assert capsys.readouterr().out.strip() == str(path)
    # as vLLM's get_w8a8_block_fp8_configs reads it: every key a batch size, every value the kernel's launch options
    configs = {int(key): value for key, value in json.loads(path.read_text()).items()}
    assert sorted(configs) == [1, 16]
    assert all(set(c) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
               for c in configs.values())
    # the cache's decisions, as the JSON export lists them
    assert main(["export-configs", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "all.json")]) == 0
    decided = json.loads((tmp_path / "all.json").read_text())
    assert {r["key"]["M"]: r["config"] for r in decided} == configs
    assert main(["export-configs", "--check", str(out)]) == 0
    # the same cache as a fused-MoE file: its key has no E
    assert main(["export-configs", "--cache", str(tmp_path / "cache"), "--format", "vllm-moe", "--out",
                 str(tmp_path / "moe")]) == 2
    assert "key field 'E' missing" in capsys.readouterr().err and not (tmp_path / "moe").exists()

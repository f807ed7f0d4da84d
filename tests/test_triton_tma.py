"""Prefill fp8 GEMMs: triton_matmul's per-tensor scaled epilogue and the TMA family triton_tma_matmul (CPU: what
the space prunes and why, the prefill experiment; Triton's interpreter: both kernels against the dequantized
product; on a GPU: verified, and as close to torch._scaled_mm as the verification allows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.space import Context
from search_spaces import triton_matmul, triton_tma_matmul

H100 = get_hardware("H100")
SPACE = triton_tma_matmul.SPACE
POINT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "GRID": "persistent", "FLATTEN": 1,
         "num_warps": 8, "num_stages": 3}
PREFILL = Problem.gemm(4096, 28672, 4096, "fp8", "tn", "tensor")
LLAMA3_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),  # 8B
             (2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168)]  # 70B at tensor parallelism 4


def why(point: dict, problem: Problem, gpu: str = "H100") -> str | None:
    return SPACE.check(point, Context(get_hardware(gpu), problem))


# -- the spaces (no Triton needed)
def test_each_pruned_point_says_why():
    assert why(POINT, PREFILL) is None
    assert why({**POINT, "GRID": "tiles", "FLATTEN": 0}, PREFILL) is None
    assert "FLATTEN=1 pipelines a persistent program's tiles" in why({**POINT, "GRID": "tiles"}, PREFILL)
    assert "TMA needs sm_90 or newer; A100 is sm_80" in why(POINT, Problem.gemm(4096, 4096, 4096, "bf16"), "A100")
    assert "layout tn only, not nn" in why(POINT, Problem.gemm(4096, 4096, 4096, "bf16", "nn"))
    assert "K=4100 inputs" in why(POINT, Problem.gemm(4096, 4096, 4100, "fp8", "tn", "tensor"))
    assert "not fp8 row-scaled" in why(POINT, Problem.gemm(4096, 4096, 4096, "fp8", "tn", "row"))
    assert "not int8" in why(POINT, Problem.gemm(4096, 4096, 4096, "int8"))
    # 5 stages of (256 + 256) x 128 fp8 and a 256 x 256 bf16 C tile: 448 KiB
    assert "shared memory" in why({**POINT, "BLOCK_M": 256, "num_stages": 5}, PREFILL)


def test_triton_matmul_takes_fp8_scaled_per_tensor_and_only_that_scaling():
    point = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1, "num_warps": 8,
             "num_stages": 3, "num_ctas": 1}
    check = triton_matmul.SPACE.check
    assert check(point, Context(H100, PREFILL)) is None
    assert "not fp8 row-scaled" in check(point, Context(H100, Problem.gemm(4096, 4096, 4096, "fp8", "tn", "row")))
    assert "not fp8 block-scaled" in check(point, Context(H100, Problem.gemm(4096, 4096, 4096, "fp8", "tn",
                                                                              "block")))


def test_every_prefill_problem_has_both_grids_and_hoppers_fp8_choices():
    m = 1024  # no rule of the space reads M
    for n, k in LLAMA3_NK:
        ctx = Context(H100, Problem.gemm(m, n, k, "fp8", "tn", "tensor"))
        fs = SPACE.feasible(ctx)
        points = [fs.point(r) for r in range(len(fs))]
        assert {(p["GRID"], p["FLATTEN"]) for p in points} == {("tiles", 0), ("persistent", 0), ("persistent", 1)}
        # BLOCK_K 128 with 3 to 5 stages and 8 warps, on tiles of 128 x 128 and up
        assert {p["num_stages"] for p in points if p["BLOCK_K"] == 128 and p["num_warps"] == 8
                and p["BLOCK_M"] * p["BLOCK_N"] >= 128 * 128} >= {3, 4, 5}
        assert all(SPACE.estimate(p, ctx) > 0 for p in points[::97])


def test_the_prefill_experiment_covers_llama3_at_1024_to_4096_tokens_within_8_minutes():
    from evotune.running.experiment import load_experiment

    exp = load_experiment(ROOT / "experiments" / "fp8_prefill.toml")
    assert sorted((p.m, p.n, p.k) for p in exp.problems) == sorted((m, n, k) for m in (1024, 2048, 4096)
                                                                   for n, k in LLAMA3_NK)
    assert {(p.dtype, p.scaling, p.layout) for p in exp.problems} == {("fp8", "tensor", "tn")}
    assert exp.spaces == ["triton_matmul", "triton_tma_matmul"] and exp.oracle == "gpu"
    assert exp.oracle_options.confirm.top_k > 0
    # each study's clock holds its confirmation stage: both spaces' studies of the 24 problems
    assert exp.budget.seconds is not None
    assert len(exp.spaces) * len(exp.problems) * exp.budget.seconds <= 8 * 60 * 0.85


# -- the kernels under Triton's interpreter, in a process of their own (tests/interpreted_scaled_gemm.py)
TMA = {**POINT, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 2, "num_warps": 4}
PLAIN = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3,
         "num_ctas": 1}
# edges in M and N (a partial tile each way) and in K (a partial last step: TMA's zero fill)
CASES = [{"space": "triton_tma_matmul", "m": 150, "n": 136, "k": k, "dtype": dtype, "scaling": scaling,
          "point": {**TMA, "GRID": grid, "FLATTEN": flatten}}
         for dtype, scaling, k in (("fp8", "tensor", 192), ("fp8", "tensor", 176), ("bf16", "", 192))
         for grid, flatten in (("tiles", 0), ("persistent", 0), ("persistent", 1))]
CASES += [{"space": "triton_matmul", "m": 50, "n": 40, "k": 256, "dtype": "fp8", "scaling": "tensor",
           "point": {**PLAIN, "SPLIT_K": split}} for split in (1, 2)]


@pytest.fixture(scope="module")
def interpreted() -> list[dict]:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "interpreted_scaled_gemm.py"), json.dumps(CASES)],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{c['space']}-{c['dtype']}{c['scaling']}-k{c['k']}-" + (
                             f"{c['point']['GRID']}{c['point']['FLATTEN']}" if "GRID" in c["point"]
                             else f"split{c['point']['SPLIT_K']}") for c in CASES])
@pytest.mark.slow  # Triton kernels through the interpreter, in another process
def test_the_kernels_match_the_reference(interpreted, case):
    result = interpreted[case]
    assert result["ok"] and result["out_dtype"] == "torch.bfloat16", result


# -- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("space", ["triton_matmul", "triton_tma_matmul"])
def test_on_a_gpu_the_scaled_kernels_verify_and_match_torch_scaled_mm(space, tmp_path, monkeypatch):
    import torch

    from evotune.measurement.workloads.gemm import baselines, make_inputs
    from evotune.measurement.workloads.gemm_fp8 import verify_scaled
    from search_spaces import _triton_kernel, _triton_tma

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    kernels, points = (_triton_tma, [POINT, {**POINT, "GRID": "tiles", "FLATTEN": 0}]) if space == \
        "triton_tma_matmul" else (_triton_kernel, [{"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8,
                                                    "SPLIT_K": 1, "num_warps": 8, "num_stages": 4, "num_ctas": 1}])
    for m, n, k in ((1024, 2560, 8192), (4096, 6144, 4096), (1000, 4104, 4096)):  # the last with edge tiles
        problem = Problem.gemm(m, n, k, "fp8", "tn", "tensor")
        (name, scaled_mm), = baselines(problem).items()
        assert name.startswith("torch._scaled_mm")
        for point in points:
            fn = kernels.build(point, problem)
            inputs = make_inputs(problem, seed=3)
            fn(*inputs)
            torch.cuda.synchronize()
            ok, _, message = verify_scaled(problem, inputs)
            assert ok, (m, n, k, point, message)
            if n % 16 or k % 16:  # cuBLASLt takes no such shape (torch refuses it): the reference alone judges
                continue
            ours = inputs[-1].float().clone()
            scaled_mm(*inputs)
            theirs = inputs[-1].float()
            assert float((ours - theirs).norm() / theirs.norm()) < 1e-2, (m, n, k, point)

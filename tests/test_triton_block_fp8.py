"""The block-scaled fp8 GEMM space: vLLM's tuning grid, what it prunes and why (CPU), its kernel against the
dequantized reference under Triton's interpreter (CPU, small shapes), and on a GPU: verified, a wrong kernel
rejected, a cache hit, and the same numbers as cuBLAS's block-scaled GEMM where torch offers it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.space import Context
from search_spaces import triton_block_fp8 as block

H100 = get_hardware("H100")
SPACE = block.SPACE
POINT = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 4,
         "num_stages": 3}
# DeepSeek-V3's dense and attention projections (N, K), as vLLM's tuning script lists them
SHAPES = [(4096, 7168), (7168, 18432), (24576, 1536), (7168, 2048), (7168, 16384)]


def scaled(m: int, n: int, k: int) -> Problem:
    return Problem.gemm(m, n, k, "fp8", "tn", "block")


def why(point: dict, problem: Problem, hw=H100) -> str | None:
    return SPACE.check(point, Context(hw, problem))


# -- the space (no Triton needed)
def test_the_parameters_are_vllms_tuning_grid_and_its_default_is_named():
    grid = {"BLOCK_SIZE_M": [16, 32, 64, 128, 256], "BLOCK_SIZE_N": [32, 64, 128, 256], "BLOCK_SIZE_K": [64, 128],
            "GROUP_SIZE_M": [1, 16, 32, 64], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
    assert {p.name: list(p.choices) for p in SPACE.params} == grid
    assert SPACE.named == {"vLLM default": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128,
                                            "GROUP_SIZE_M": 32, "num_warps": 4, "num_stages": 2}}
    assert why(block.VLLM_DEFAULT, scaled(64, 4096, 7168)) is None


@pytest.mark.parametrize("m", [1, 16, 64, 512, 4096])
def test_every_shape_has_feasible_points_on_an_h100(m):
    for n, k in SHAPES:
        ctx = Context(H100, scaled(m, n, k))
        fs = SPACE.feasible(ctx)
        assert len(fs) > 100, (n, k, fs.pruned)
        assert all(SPACE.estimate(fs.point(r), ctx) > 0 for r in range(0, len(fs), 53))


def test_each_pruned_point_says_why():
    problem = scaled(16, 4096, 7168)
    assert why(POINT, problem) is None
    assert "wider than M=16" in why({**POINT, "BLOCK_SIZE_M": 32}, problem)
    assert why({**POINT, "BLOCK_SIZE_M": 64}, scaled(33, 4096, 7168)) is None
    assert "shared memory" in why({**POINT, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_stages": 5},
                                  scaled(4096, 4096, 7168))
    assert "registers per thread" in why({**POINT, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256, "num_stages": 2},
                                         scaled(4096, 4096, 7168))
    assert "FP8 tensor cores; A100 has none" in why(POINT, problem, get_hardware("A100"))
    assert "takes fp8 inputs (fp8 block-scaled), not fp8 row-scaled" in why(POINT, Problem.gemm(16, 4096, 7168,
                                                                                                "fp8", "tn", "row"))
    assert "not bf16" in why(POINT, Problem.gemm(16, 4096, 7168, "bf16"))
    # the rule behind BLOCK_SIZE_K's choices: a step that spanned two scale groups would need two scales
    rule = next(c for c in SPACE.constraints if c.name == "block-k")
    assert rule.reason({**POINT, "BLOCK_SIZE_K": 256}, Context(H100, problem)).startswith("block-k: BLOCK_SIZE_K=256")


def test_under_autotune_the_rows_rule_reads_the_launchs_m():
    from evotune.triton_tuning.configs import Candidates, LaunchContext

    point = {**block.VLLM_DEFAULT, "BLOCK_SIZE_M": 64}
    assert "wider than M=4 needs" in block.SPACE.check(point, LaunchContext(args={"M": 4}))
    assert block.SPACE.check(point, LaunchContext(args={"M": 400})) is None
    candidates = Candidates.from_space(block.SPACE)  # what evotune.autotune offers at a launch: 16 rows at M = 1
    one_row = candidates.feasible(LaunchContext(args={"M": 1}))
    assert {one_row.point(r)["BLOCK_SIZE_M"] for r in range(len(one_row))} == {16} and len(one_row) == 256
    assert len(candidates.feasible(LaunchContext(args={"M": 4096}))) == 1280


def test_evotune_spaces_lists_it_for_a_block_scaled_problem(capsys):
    assert main(["spaces", "--problem", "16x4096x7168", "--dtype", "fp8", "--scaling", "block"]) == 0
    out = capsys.readouterr().out
    assert "16x4096x7168 fp8 block-scaled tn" in out
    assert re.search(r"triton_block_fp8\s*│\s*1280\s*│\s*256\s*│", out)  # size, feasible
    assert main(["spaces", "--scaling", "block"]) == 2  # bf16
    assert "--scaling: scaling: only fp8 inputs are scaled, not bf16" in capsys.readouterr().err


# -- the kernel under Triton's interpreter, in a process of its own (tests/interpreted_block_fp8.py)
CASES = [
    # rows past M in a 16-row tile, K steps of half a scale group, one tile row per band
    {"m": 20, "n": 384, "k": 256, "point": {**POINT, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}},
    # vLLM's default at decode size: 3 rows of a 64-row tile, three scale groups
    {"m": 3, "n": 384, "k": 384, "point": block.VLLM_DEFAULT},
    # columns past N (384 in two 256-wide tiles), bands taller than the 3 tile rows
    {"m": 40, "n": 384, "k": 256, "point": {**POINT, "BLOCK_SIZE_N": 256, "num_warps": 8}},
    # a square problem: scales read along a wrong axis would still find their lengths
    {"m": 256, "n": 256, "k": 256, "point": {**POINT, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "GROUP_SIZE_M": 1}},
]


@pytest.fixture(scope="module")
def interpreted() -> list[dict]:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "interpreted_block_fp8.py"), json.dumps(CASES)],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"m{c['m']}-n{c['n']}-k{c['k']}" for c in CASES])
@pytest.mark.slow  # a Triton kernel through the interpreter, in another process
def test_the_kernel_matches_the_dequantized_reference(interpreted, case):
    result = interpreted[case]
    assert result["ok"] and result["error"] < 5e-3, result


def test_the_cache_key_leaves_out_what_the_binary_does_not_depend_on():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from search_spaces import _triton_block_fp8 as module

    same = module.specialization(scaled(16, 4096, 7168))
    assert same == module.specialization(scaled(32, 12288, 7168))
    assert same != module.specialization(scaled(1, 4096, 7168))  # M = 1 is specialised
    assert same != module.specialization(scaled(16, 4096, 2048))  # K / 128 = 16, the scales' row stride


# -- on a GPU
@pytest.mark.gpu
def test_on_a_gpu_points_verify_a_wrong_kernel_is_rejected_and_a_second_shape_hits_the_cache(tmp_path, monkeypatch):
    import torch

    from evotune.measurement.workloads.gemm import make_inputs
    from evotune.measurement.workloads.gemm_fp8 import verify_scaled
    from search_spaces import _triton_block_fp8 as kernels

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    hits = []
    for m in (1, 64, 1000):  # three specialisations: M = 1, a multiple of 16, neither
        problem = scaled(m, 4096, 7168)
        for point in (block.VLLM_DEFAULT, {**POINT, "BLOCK_SIZE_K": 64},
                      {**POINT, "BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "num_warps": 8}):
            fn = kernels.build(point, problem)
            hits.append(fn.cache_hit)
            for seed in (3, 4):
                inputs = make_inputs(problem, seed=seed)
                fn(*inputs)
                torch.cuda.synchronize()
                ok, _, message = verify_scaled(problem, inputs)
                assert ok, (m, point, seed, message)
    assert not any(hits)  # a fresh cache: each was compiled
    # a kernel that reads half of K is caught by the verification the worker runs
    problem = scaled(64, 4096, 7168)
    inputs = make_inputs(problem, seed=3)
    kernels.launcher(POINT, scaled(64, 4096, 3584))[0](*inputs)
    ok, _, message = verify_scaled(problem, inputs)
    assert not ok and "relative error" in message
    # another shape with the specialisation of M = 64, for a point built above at M = 64: the kernel index counts a hit
    assert kernels.build({**POINT, "BLOCK_SIZE_K": 64}, scaled(32, 4096, 7168)).cache_hit


@pytest.mark.gpu
def test_on_a_gpu_it_computes_what_cublas_block_scaled_gemm_computes():
    import torch

    from evotune.measurement.workloads.gemm import baselines, make_inputs
    from evotune.measurement.workloads.gemm_fp8 import verify_scaled
    from search_spaces import _triton_block_fp8 as kernels

    problem = scaled(256, 4096, 7168)
    inputs = make_inputs(problem, seed=5)
    kernels.launcher(block.VLLM_DEFAULT, problem)[0](*inputs)
    ours = inputs[-1].float().clone()
    (name, cublas), = baselines(problem).items()
    try:
        cublas(*cublas.prepare(inputs))
    except RuntimeError as exc:  # torch < 2.9, cuBLAS < 12.9, or not sm_90
        pytest.skip(f"{name} is not offered here: {exc}")
    torch.cuda.synchronize()
    assert verify_scaled(problem, inputs)[0]
    theirs = inputs[-1].float()
    assert float((ours - theirs).norm() / theirs.norm()) < 1e-2

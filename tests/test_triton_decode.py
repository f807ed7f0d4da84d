"""The decode GEMM space: what it prunes and why (CPU), its kernels against the torch reference under Triton's
interpreter (CPU, tiny shapes), and on a GPU: verified, a wrong kernel rejected, a cache hit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.space import Context
from evotune.measurement.workloads.gemm import TOLERANCE
from evotune.measurement.workloads.gemm_fp8 import SCALED_TOLERANCE
from search_spaces import triton_decode_gemm as decode

H100 = get_hardware("H100")
SPACE = decode.SPACE
POINT = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4, "REDUCE": "sum", "num_warps": 4,
         "num_stages": 4}
DECODE_NK = [(4096, 4096), (4096, 11008), (12288, 4096), (22016, 4096)]


def why(point: dict, problem: Problem) -> str | None:
    return SPACE.check(point, Context(H100, problem))


# -- the space (no Triton needed)
@pytest.mark.parametrize(("dtype", "scaling"), [(d, "") for d in decode.DTYPES] + [("fp8", "row")])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_every_decode_shape_has_feasible_points_on_an_h100(m, dtype, scaling):
    for n, k in DECODE_NK:
        problem = Problem.gemm(m, n, k, dtype, "tn", scaling)
        fs = SPACE.feasible(Context(H100, problem))
        assert len(fs) > 100, (problem.key, fs.pruned)
        assert all(SPACE.estimate(fs.point(r), Context(H100, problem)) > 0 for r in range(0, len(fs), 97))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 256, 256), (16, 256, 256), (64, 128, 64), (8, 48, 32)])
def test_a_small_layer_keeps_the_configurations_with_half_the_programs_it_can_have(m, n, k):
    problem = Problem.gemm(m, n, k, "bf16", "tn")
    most = decode.most_programs(problem)
    assert most * decode.MIN_SM_SHARE < 2 * H100.sm_count  # too small to fill half the SMs whatever its tiles
    fs = SPACE.feasible(Context(H100, problem))
    assert len(fs) > 0, fs.pruned
    counts = [decode.programs(fs.point(r), problem) for r in range(len(fs))]
    assert max(counts) <= most and min(counts) * decode.MIN_SM_SHARE >= most


def test_each_pruned_point_says_why():
    problem = Problem.gemm(16, 4096, 4096, "bf16")
    assert why(POINT, problem) is None
    assert "nothing to reduce" in why({**POINT, "SPLIT_K": 1, "REDUCE": "atomic"}, problem)
    assert "wider than M=16" in why({**POINT, "BLOCK_M": 32}, problem)
    assert "wider than M" not in (why({**POINT, "BLOCK_M": 64}, Problem.gemm(33, 4096, 4096, "bf16")) or "")
    # 4096 = 8 blocks of 512: a 16-way split leaves half the splits without work
    assert "8 blocks of BLOCK_K=512" in why({**POINT, "BLOCK_K": 512, "SPLIT_K": 16}, problem)
    assert "layout tn only" in why(POINT, Problem.gemm(16, 4096, 4096, "bf16", "nt"))
    assert "fp8 unscaled/tensor-scaled/row-scaled), not fp8 block-scaled" in why(
        POINT, Problem.gemm(16, 4096, 4096, "fp8", "tn", "block"))
    assert "not fp32" in why(POINT, Problem.gemm(16, 4096, 4096, "fp32"))
    assert "fp8 tensor cores; A100 has none" in SPACE.check(POINT, Context(get_hardware("A100"),
                                                                            Problem.gemm(16, 4096, 4096, "fp8")))
    # 4096 / 256 columns, no split: 16 programs for 132 SMs
    assert "16 programs leave more than half of the 132 SMs" in why({**POINT, "BLOCK_N": 256, "SPLIT_K": 1}, problem)
    assert "16-byte vector" in why({**POINT, "BLOCK_N": 16, "BLOCK_K": 64, "num_warps": 8}, problem)
    assert "shared memory" in why({**POINT, "BLOCK_N": 256, "BLOCK_K": 512, "SPLIT_K": 8, "num_stages": 6}, problem)


def test_the_last_split_sums_no_more_partial_tiles_than_a_thread_loads_quickly():
    # an H200 built this one in 15-19 s, 6-8x slower than its key's best: 32 partials of 128 values a thread
    heavy = {"BLOCK_M": 32, "BLOCK_N": 256, "BLOCK_K": 128, "SPLIT_K": 32, "REDUCE": "last", "num_warps": 2,
             "num_stages": 2}
    problem = Problem.gemm(24, 3072, 4096, "bf16", "tn")
    assert decode.last_sum_loads(heavy) == 4096
    assert "sums 32 partial 32x256 tiles over 2 warps unrolled: 4096 loads a thread, over 512" in why(heavy, problem)
    assert why({**heavy, "REDUCE": "sum"}, problem) is None  # the second kernel sums them instead
    # the same tile over 8 warps and 8 splits: 256 loads a thread
    assert why({**heavy, "SPLIT_K": 8, "num_warps": 8}, problem) is None
    # at the limit: within 5% of its key's best on an H200
    edge = {"BLOCK_M": 16, "BLOCK_N": 256, "BLOCK_K": 64, "SPLIT_K": 8, "REDUCE": "last", "num_warps": 2,
            "num_stages": 5}
    assert decode.last_sum_loads(edge) == decode.LAST_SUM_LOADS
    assert why(edge, Problem.gemm(1, 3072, 4096, "bf16", "tn")) is None


def test_the_gemv_path_takes_all_of_a_small_m_in_one_tile_and_fits_its_registers():
    gemv = {**POINT, "BLOCK_M": 1, "BLOCK_N": 32, "SPLIT_K": 1}
    assert why(gemv, Problem.gemm(1, 4096, 4096, "fp8", "tn", "tensor")) is None
    assert why({**gemv, "BLOCK_M": 4}, Problem.gemm(3, 4096, 4096, "int8")) is None  # 3 rows, one wrapped
    assert "takes all of M=3 in one tile" in why(gemv, Problem.gemm(3, 4096, 4096, "bf16"))
    assert "takes all of M=16" in why({**gemv, "BLOCK_M": 8}, Problem.gemm(16, 4096, 4096, "bf16"))
    # a 256 x 256 weight tile over 2 warps: 1024 fp32 values a thread
    wide = {**gemv, "BLOCK_N": 256, "BLOCK_K": 256, "num_warps": 2, "num_stages": 2}
    assert "GEMV path's 256x256 weight tile" in why(wide, Problem.gemm(1, 28672, 4096, "fp8", "tn", "tensor"))
    for m, rows in ((1, {1, 16}), (2, {2, 16}), (5, {8, 16}), (16, {16}), (64, {16, 32, 64})):
        fs = SPACE.feasible(Context(H100, Problem.gemm(m, 4096, 4096, "bf16")))
        assert {fs.point(r)["BLOCK_M"] for r in range(len(fs))} == rows, m


def _first(problem: Problem, gpu: str) -> dict:
    """The point `default`'s hardware seeding tries first: the space's best estimate."""
    ctx = Context(get_hardware(gpu), problem)
    fs = SPACE.feasible(ctx)
    return fs.point(min(range(len(fs)), key=lambda r: SPACE.estimate(fs.point(r), ctx)))


@pytest.mark.parametrize(("gpu", "n", "k"), [("H200", 4096, 4096)] + [  # the others take seconds each: slow
    pytest.param(gpu, n, k, marks=pytest.mark.slow) for gpu in ("H100", "H200")
    for n, k in ((4096, 4096), (28672, 4096), (4096, 14336)) if (gpu, n, k) != ("H200", 4096, 4096)])
def test_the_estimate_ranks_one_weight_stream_first(gpu, n, k):
    # M = 64: one M tile, over whole warpgroups (wgmma), not the weight streamed once per M tile on mma.sync
    first = _first(Problem.gemm(64, n, k, "fp8", "tn", "tensor"), gpu)
    assert first["BLOCK_M"] == 64 and first["num_warps"] % 4 == 0, first
    # M = 1: the GEMV path, not a tensor-core tile of which 15 rows of 16 are copies
    for dtype, scaling in (("fp8", "tensor"), ("fp8", "row"), ("bf16", ""), ("int8", "")):
        assert decode.gemv(_first(Problem.gemm(1, n, k, dtype, "tn", scaling), gpu)), (dtype, scaling)
    # M = 16 fills the tensor-core tile
    assert _first(Problem.gemm(16, n, k, "fp8", "tn", "tensor"), gpu)["BLOCK_M"] == 16


def test_the_estimates_first_points_hold_a_near_best_of_each_shipped_m64_landscape():
    from evotune.core.landscape import load_landscape

    for path in sorted((ROOT / "evotune" / "landscapes" / "h100_decode").glob("*_64x*.json.gz")):
        ls = load_landscape(path)
        ctx = Context(H100, ls.problem)
        timed = [(SPACE.estimate(dict(zip(ls.names, key, strict=True)), ctx), r.time_ms)
                 for key, r in ls.entries.items() if r.time_ms is not None]
        best = min(t for _, t in timed)
        # the five best estimated of the 48 sampled points (the seeded half of `default`'s first ten), ties in
        # the recorded order, as the seeding's stable sort leaves them
        first = sorted(timed, key=lambda et: et[0])[:5]
        assert min(t for _, t in first) <= 1.15 * best, path.name


def test_evotune_spaces_lists_it(capsys):
    assert main(["spaces"]) == 0
    assert "triton_decode_gemm" in capsys.readouterr().out


# -- the kernels under Triton's interpreter, in a process of their own (tests/interpreted_decode.py)
REDUCTIONS = [(1, "sum"), (3, "sum"), (2, "atomic"), (3, "last")]
CASES = [{"dtype": dtype, "m": 3, "n": 40, "k": k,  # rows and columns past the edges of a 16 x 32 tile
          "point": {**POINT, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": split, "REDUCE": reduce}}
         for dtype in ("bf16", "fp16", "int8") for split, reduce in REDUCTIONS
         for k in (256, 200)]  # K a multiple of BLOCK_K, and one with a tail
# fp8, unscaled and with the scaled epilogue in every reduction; per-row scales with a K tail as well
CASES += [{"dtype": "fp8", "scaling": scaling, "m": 3, "n": 40, "k": k,
           "point": {**POINT, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": split, "REDUCE": reduce}}
          for scaling, ks in (("", (256,)), ("tensor", (256,)), ("row", (256, 200)))
          for split, reduce in REDUCTIONS for k in ks]
# one row (M = 1): its reduction kernel over several programs of the smallest block
CASES += [{"dtype": "fp8", "scaling": "row", "m": 1, "n": 300, "k": 256,
           "point": {**POINT, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 3, "REDUCE": "sum"}}]
# the GEMV path (no tl.dot): one row, and 3 rows in a tile of 4 (one wrapped), with a K tail, in every reduction
GEMV = {**POINT, "BLOCK_N": 32, "BLOCK_K": 64, "num_warps": 2, "num_stages": 3}
CASES += [{"dtype": dtype, "scaling": scaling, "m": m, "n": 40, "k": k,
           "point": {**GEMV, "BLOCK_M": rows, "SPLIT_K": split, "REDUCE": reduce}}
          for dtype, scaling, m, rows, k, (split, reduce) in (
              ("bf16", "", 1, 1, 200, (1, "sum")), ("fp16", "", 3, 4, 256, (3, "last")),
              ("int8", "", 3, 4, 200, (2, "atomic")), ("int8", "", 1, 1, 256, (3, "sum")),
              ("fp8", "", 1, 1, 256, (3, "last")), ("fp8", "tensor", 3, 4, 200, (3, "sum")),
              ("fp8", "row", 3, 4, 256, (2, "atomic")), ("fp8", "row", 1, 1, 200, (3, "last")))]


@pytest.fixture(scope="module")
def interpreted() -> list[dict]:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "interpreted_decode.py"), json.dumps(CASES)],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"{c['dtype']}{c.get('scaling', '')}-m{c['m']}-bm{c['point']['BLOCK_M']}-split"
                              f"{c['point']['SPLIT_K']}-{c['point']['REDUCE']}-k{c['k']}" for c in CASES])
@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_the_kernels_match_the_reference(interpreted, case):
    dtype, result = CASES[case]["dtype"], dict(interpreted[case])
    # the GEMV path multiplies without tl.dot, the tensor-core path with it
    assert (result.pop("dots") > 0) == (CASES[case]["point"]["BLOCK_M"] >= decode.MMA_ROWS), result
    if dtype == "int8":
        assert result == {"error": 0, "int32": True}  # every int32 output exact
    elif dtype == "fp8":  # bf16 out; scaled: against the dequantized product
        tolerance = SCALED_TOLERANCE if CASES[case]["scaling"] else TOLERANCE["fp8"]
        assert result["out_dtype"] == "torch.bfloat16" and result["error"] <= tolerance, result
    else:
        assert result["same_dtype"] and result["error"] <= TOLERANCE[dtype], result


def test_the_cache_key_leaves_out_what_the_binary_does_not_depend_on():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from search_spaces import _triton_decode as module

    same = module.specialization(Problem.gemm(16, 4096, 4096, "bf16"))
    assert same == module.specialization(Problem.gemm(32, 12288, 11008, "bf16"))
    assert same != module.specialization(Problem.gemm(1, 4096, 4096, "bf16"))  # M = 1 is specialised
    assert same != module.specialization(Problem.gemm(16, 4096, 4096, "int8"))


def test_the_reduction_spreads_a_single_row_over_many_programs():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from search_spaces import _triton_decode as module

    def programs(mn: int) -> int:
        return -(-mn // module.reduce_block(mn))

    # M = 1: N outputs over N / 128 programs, not N / 1024 (2560 x 8192 took 3 programs of 1024)
    assert [programs(n) for n in (2560, 4096, 8192)] == [20, 32, 64]
    assert module.reduce_block(16 * 4096) == 512 and module.reduce_block(64 * 28672) == module.REDUCE_BLOCK
    assert all(programs(mn) >= module.REDUCE_PROGRAMS for mn in (16384, 65536, 10**6))


# -- on a GPU
@pytest.mark.gpu
def test_on_a_gpu_points_verify_a_wrong_kernel_is_rejected_and_a_second_shape_hits_the_cache(tmp_path, monkeypatch):
    import torch

    from evotune.measurement.workloads.gemm import make_inputs, verify
    from search_spaces import _triton_decode as kernels

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    hits = []
    for dtype in decode.DTYPES:
        problem = Problem.gemm(16, 4096, 11008, dtype)
        # split-K with a reduction kernel, without (128 programs of BLOCK_N = 32 keep the SMs busy), with atomics,
        # and reduced by each tile's last split (launched twice: its counts are back at zero after a launch)
        for point in (POINT, {**POINT, "SPLIT_K": 1, "BLOCK_N": 32}, {**POINT, "REDUCE": "atomic"},
                      {**POINT, "REDUCE": "last"}):
            assert why(point, problem) is None
            fn = kernels.build(point, problem)
            hits.append(fn.cache_hit)
            for seed in (3, 4):
                a, b, c = make_inputs(problem, seed=seed)
                fn(a, b, c)
                torch.cuda.synchronize()
                ok, _, message = verify(problem, a, b, c)
                assert ok, (dtype, point, seed, message)
        # a K with a tail: the masked loads of the last block
        tail = Problem.gemm(16, 4096, 4000, dtype)
        a, b, c = make_inputs(tail, seed=5)
        kernels.build(POINT, tail)(a, b, c)
        torch.cuda.synchronize()
        assert verify(tail, a, b, c)[0], (dtype, verify(tail, a, b, c))
    assert not any(hits)  # a fresh cache: each was compiled
    # a kernel that reduces only half of K is caught by the verification the worker runs
    problem = Problem.gemm(16, 4096, 4096, "bf16")
    a, b, c = make_inputs(problem, seed=3)
    kernels.launcher(POINT, Problem.gemm(16, 4096, 2048, "bf16"))[0](a, b, c)
    ok, _, message = verify(problem, a, b, c)
    assert not ok and "relative error" in message
    # another shape with the same specialisation as the first build (and the same M x N class, so the same
    # reduction block): the kernel index counts a hit
    assert kernels.build(POINT, Problem.gemm(32, 2048, 4096, "bf16")).cache_hit


@pytest.mark.gpu
def test_on_a_gpu_the_gemv_path_and_the_64_row_tile_verify_in_every_reduction(tmp_path, monkeypatch):
    import torch

    from evotune.measurement.workloads.gemm import make_inputs, verify
    from evotune.measurement.workloads.gemm_fp8 import verify_scaled
    from search_spaces import _triton_decode as kernels

    monkeypatch.setenv("EVOTUNE_KERNEL_CACHE", str(tmp_path / "kernels"))
    gemv = {"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 2, "num_stages": 6}
    wide = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 5}
    cases = [(m, {**gemv, "BLOCK_M": rows}) for m, rows in ((1, 1), (3, 4))] + [(64, wide)]
    for dtype, scaling in [(d, "") for d in decode.DTYPES] + [("fp8", "tensor"), ("fp8", "row")]:
        for m, tile in cases:
            # every reduction, and a K with a tail (the masked loads of the last block)
            for k, split, reduce in ((4096, 1, "sum"), (4096, 4, "sum"), (4096, 4, "atomic"), (4096, 4, "last"),
                                     (4000, 4, "last")):
                problem = Problem.gemm(m, 4096, k, dtype, "tn", scaling)
                point = {**tile, "SPLIT_K": split, "REDUCE": reduce}
                assert why(point, problem) is None, (problem.key, point)
                fn = kernels.build(point, problem)
                inputs = make_inputs(problem, seed=3)
                fn(*inputs)
                torch.cuda.synchronize()
                ok, _, message = verify_scaled(problem, inputs) if scaling else verify(problem, *inputs)
                assert ok, (problem.key, point, message)


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_on_a_gpu_the_scaled_epilogue_verifies_and_matches_torch_scaled_mm(scaling):
    import torch

    from evotune.measurement.workloads.gemm import baselines, make_inputs
    from evotune.measurement.workloads.gemm_fp8 import verify_scaled
    from search_spaces import _triton_decode as kernels

    for m in (1, 16, 64):
        problem = Problem.gemm(m, 4096, 11008, "fp8", "tn", scaling)
        (name, scaled_mm), = baselines(problem).items()
        assert name.startswith("torch._scaled_mm")
        for point in (POINT, {**POINT, "SPLIT_K": 1, "BLOCK_N": 32}, {**POINT, "REDUCE": "atomic"},
                      {**POINT, "REDUCE": "last"}):
            fn = kernels.build(point, problem)
            inputs = make_inputs(problem, seed=3)
            fn(*inputs)
            torch.cuda.synchronize()
            ok, _, message = verify_scaled(problem, inputs)
            assert ok, (m, point, message)
            ours = inputs[-1].float().clone()
            scaled_mm(*inputs)
            torch.cuda.synchronize()
            theirs = inputs[-1].float()
            assert float((ours - theirs).norm() / theirs.norm()) < 1e-2, (m, point)


def test_the_decode_experiment_covers_the_decode_shapes_with_a_confirmation_stage():
    from evotune.running.experiment import load_experiment

    exp = load_experiment(ROOT / "experiments" / "decode_gemm.toml")
    shapes = {(p.dtype, p.m, p.n, p.k) for p in exp.problems}
    assert shapes == {(d, m, n, k) for d, ms in (("bf16", (16, 64)), ("int8", (16, 32, 64))) for m in ms
                      for n, k in DECODE_NK}
    assert exp.spaces == ["triton_decode_gemm"] and exp.oracle == "gpu"
    assert exp.oracle_options.confirm.top_k > 0 and exp.budget.seconds is not None


LLAMA3_NK = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),  # 8B
             (2560, 8192), (8192, 2048), (14336, 8192), (8192, 7168)]  # 70B at tensor parallelism 4


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_the_fp8_decode_experiments_cover_llama3_at_1_16_and_64_tokens_within_their_budget(scaling):
    from evotune.running.experiment import load_experiment

    exp = load_experiment(ROOT / "experiments" / f"fp8_decode_{scaling}.toml")
    assert sorted((p.m, p.n, p.k) for p in exp.problems) == sorted((m, n, k) for m in (1, 16, 64)
                                                                   for n, k in LLAMA3_NK)
    assert {(p.dtype, p.scaling, p.layout) for p in exp.problems} == {("fp8", scaling, "tn")}
    assert exp.spaces == ["triton_decode_gemm"] and exp.oracle == "gpu" and exp.oracle_options.confirm.top_k > 0
    # both files' 48 problems in under 8 minutes: each problem's clock (the confirmation stage within it)
    assert exp.budget.seconds is not None and 2 * len(exp.problems) * exp.budget.seconds <= 8 * 60 * 0.85


@pytest.mark.slow  # 48 feasible sets
@pytest.mark.parametrize("gpu", ["H100", "H200"])
def test_every_llama3_fp8_decode_problem_has_points_with_every_reduction(gpu):
    for m in (1, 16, 64):
        for n, k in LLAMA3_NK:
            for scaling in ("tensor", "row"):
                problem = Problem.gemm(m, n, k, "fp8", "tn", scaling)
                fs = SPACE.feasible(Context(get_hardware(gpu), problem))
                points = [fs.point(r) for r in range(len(fs))]
                assert len(fs) > 1000, problem.key
                assert {p["REDUCE"] for p in points if p["SPLIT_K"] > 1} == {"sum", "atomic", "last"}
                assert {p["BLOCK_M"] for p in points} == {1: {1, 16}, 16: {16}, 64: {16, 32, 64}}[m]

"""CPU tests of the built-in GEMM search spaces: feasibility per GPU, pruning reasons, and the estimate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from evotune.core.hardware import Hardware, get_hardware
from evotune.core.plugins import builtin_names, load_space
from evotune.core.problem import Problem
from evotune.core.space import Context, Point, SearchSpace
from search_spaces import _gemm_model as gm
from search_spaces import _gemm_rules as gr
from search_spaces import cute_blackwell_gemm, cute_hopper_gemm, triton_matmul

H100, H200, A100, B200 = (get_hardware(n) for n in ("H100", "H200", "A100", "B200"))
BF16 = Problem.gemm(4096, 4096, 4096, "bf16")
HOPPER = cute_hopper_gemm.SPACE
BLACKWELL = cute_blackwell_gemm.SPACE
TRITON = triton_matmul.SPACE
SPACES = [HOPPER, BLACKWELL, TRITON]

HOPPER_POINT = {"tile_m": 128, "tile_n": 256, "cluster": (1, 1), "swizzle": 1, "raster": "m", "stages": 4}
BLACKWELL_POINT = {"mma_m": 256, "mma_n": 128, "cluster": (2, 1), "use_2cta_instrs": True, "use_tma_store": True}
TRITON_POINT = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
                "num_warps": 8, "num_stages": 3, "num_ctas": 1}


def ctx(hw: Hardware, problem: Problem | None = BF16) -> Context:
    return Context(hw, problem)


def all_points(space: SearchSpace, context: Context) -> list[Point]:
    fs = space.feasible(context)
    return [fs.point(r) for r in range(len(fs))]


# -- the modules as a whole ------------------------------------------------------
def test_builtins_are_found_and_the_shared_modules_are_private():
    names = builtin_names()
    for name in ("cute_hopper_gemm", "cute_blackwell_gemm", "triton_matmul"):
        assert name in names
        assert load_space(name).name == name
    assert "_gemm_model" not in names and "_gemm_rules" not in names


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_space_metadata(space: SearchSpace):
    assert space.description and "\n" not in space.description
    assert space.default_problem == Problem.gemm(4096, 4096, 4096, "bf16")
    assert space.estimate is not None
    assert space.workload == "gemm"  # the GEMM workload's inputs, launch convention and reference
    assert all(p.doc for p in space.params)
    assert len({c.name for c in space.constraints}) == len(space.constraints)
    assert space.size < 100_000


def test_param_choices():
    assert HOPPER.param("cluster").choices == ((1, 1), (1, 2), (2, 1), (2, 2))
    assert HOPPER.param("stages").choices == tuple(range(2, 9))
    assert BLACKWELL.param("mma_n").choices == tuple(range(32, 257, 32))
    clusters = BLACKWELL.param("cluster").choices
    assert all(math.prod(c) <= 16 for c in clusters) and (16, 1) in clusters and (4, 4) in clusters
    assert TRITON.param("BLOCK_M").choices == (16, 32, 64, 128, 256)
    assert TRITON.param("SPLIT_K").choices == (1, 2, 4, 8, 16)


# -- feasibility per GPU -------------------------------------------------------------
@pytest.mark.parametrize("space", [HOPPER, TRITON], ids=lambda s: s.name)
@pytest.mark.parametrize("hw", [H100, H200], ids=lambda h: h.name)
def test_hopper_class_gpus_have_feasible_points(space: SearchSpace, hw: Hardware):
    assert len(space.feasible(ctx(hw))) > 0


def test_blackwell_is_entirely_pruned_on_h100_for_the_architecture():
    context = ctx(H100)
    assert len(BLACKWELL.feasible(context)) == 0
    for point in BLACKWELL.points():
        reason = BLACKWELL.check(point, context)
        assert reason is not None and "needs sm_100" in reason
    assert BLACKWELL.constraints[0].name == "arch"
    assert set(BLACKWELL.feasible(context).pruned) == {"arch"}


def test_blackwell_has_feasible_points_on_b200():
    fs = BLACKWELL.feasible(ctx(B200))
    assert len(fs) > 0
    assert BLACKWELL_POINT in fs
    assert {"mma-m", "2cta-cluster"} <= set(fs.pruned)


def test_hopper_needs_sm90():
    for hw in (A100, B200):  # A100 has no WGMMA; neither has sm_100, which dropped it
        fs = HOPPER.feasible(ctx(hw))
        assert len(fs) == 0 and set(fs.pruned) == {"arch"}
    assert "needs sm_90" in HOPPER.check(HOPPER_POINT, ctx(A100))


def test_triton_on_a100_drops_clusters_but_keeps_the_rest():
    fs = TRITON.feasible(ctx(A100))
    assert len(fs) > 0
    assert all(fs.point(r)["num_ctas"] == 1 for r in range(len(fs)))
    assert "clusters" in TRITON.check(dict(TRITON_POINT, num_ctas=2), ctx(A100))
    assert TRITON.check(dict(TRITON_POINT, num_ctas=2), ctx(H100)) is None


# -- shared memory -----------------------------------------------------------------------
def test_hopper_deep_pipeline_of_big_tiles_exceeds_shared_memory():
    point = dict(HOPPER_POINT, stages=8)
    reason = HOPPER.check(point, ctx(H100))
    assert reason is not None and reason.startswith("smem:")
    assert "shared memory" in reason and str(H100.smem_per_block) in reason
    assert str(cute_hopper_gemm.smem_bytes(point, BF16)) in reason
    # 4 stages of 128x256 (48 KiB each) + 32 KiB of epilogue staging fit; 5 do not
    assert HOPPER.check(dict(HOPPER_POINT, stages=4), ctx(H100)) is None
    assert HOPPER.check(dict(HOPPER_POINT, stages=5), ctx(H100)).startswith("smem:")


def test_hopper_smem_counts_stages_epilogue_barriers_and_static_memory():
    one = cute_hopper_gemm.smem_bytes(dict(HOPPER_POINT, stages=1), BF16)
    two = cute_hopper_gemm.smem_bytes(dict(HOPPER_POINT, stages=2), BF16)
    assert two - one == (128 + 256) * 64 * 2  # one stage: 64-element (128-byte) K slice of A and B
    epilogue = one - (two - one) - gr.MBARRIER_RESERVE - gr.CUTE_STATIC_SMEM
    assert epilogue == 4 * 128 * 32 * 2  # four 128x32 bf16 TMA-store buffers with two MMA warpgroups


def test_int8_uses_one_byte_elements():
    int8 = Problem.gemm(4096, 4096, 4096, "int8")
    # Hopper: a stage is still a 128-byte K slice, which is 128 int8 elements (64 bf16 ones) ...
    assert gr.k_tile(int8.in_bytes) == 128 and gr.k_tile(BF16.in_bytes) == 64

    def stage(problem: Problem) -> int:
        points = [dict(HOPPER_POINT, stages=s) for s in (1, 2)]
        return cute_hopper_gemm.smem_bytes(points[1], problem) - cute_hopper_gemm.smem_bytes(points[0], problem)

    assert stage(int8) == stage(BF16) == (128 + 256) * 128 * 1
    # ... and the int32 output makes its epilogue twice as large
    assert cute_hopper_gemm.smem_bytes(HOPPER_POINT, int8) > cute_hopper_gemm.smem_bytes(HOPPER_POINT, BF16)
    # Triton: BLOCK_K is in elements, so 1-byte inputs fit more stages of the same tile
    tile = {**TRITON_POINT, "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128}

    def max_stages(problem: Problem) -> int:
        ok = [s for s in TRITON.param("num_stages").choices
              if TRITON.check(dict(tile, num_stages=s), ctx(H100, problem)) is None]
        return max(ok, default=0)

    assert max_stages(BF16) == 2
    assert max_stages(int8) == 4
    assert triton_matmul.TILE.smem_bytes(tile, int8) * 2 == triton_matmul.TILE.smem_bytes(tile, BF16)


def test_int8_is_feasible_on_hopper_and_triton():
    int8 = Problem.gemm(4096, 4096, 4096, "int8")
    assert len(HOPPER.feasible(ctx(H100, int8))) > 0
    assert TRITON.check(dict(TRITON_POINT, SPLIT_K=4), ctx(H100, int8)) is None  # int32 atomics


def test_blackwell_needs_only_two_stages_to_fit():
    assert cute_blackwell_gemm.auto_stages(BLACKWELL_POINT, BF16, B200.smem_per_block) >= 2
    tiny = replace(B200, smem_per_block=64 * 1024)
    reason = BLACKWELL.check(dict(BLACKWELL_POINT, mma_m=128, mma_n=256, use_2cta_instrs=False, cluster=(1, 1)),
                             ctx(tiny))
    assert reason is not None and reason.startswith("smem:") and "shared memory" in reason


# -- clusters --------------------------------------------------------------------------
def test_hopper_cluster_2x2():
    point = dict(HOPPER_POINT, cluster=(2, 2))
    assert HOPPER.check(point, ctx(H100)) is None
    # A100 has no clusters (max 1), but it has no WGMMA either, so the architecture prunes first
    assert A100.max_cluster_portable == 1 and not A100.has("wgmma")
    assert "needs sm_90" in HOPPER.check(point, ctx(A100))
    # the cluster limit itself, on a Hopper with a smaller portable cluster
    small = replace(H100, max_cluster_portable=2)
    reason = HOPPER.check(point, ctx(small))
    assert reason is not None and reason.startswith("cluster-size:")
    assert HOPPER.check(dict(point, cluster=(2, 1)), ctx(small)) is None


def test_blackwell_cluster_rules():
    assert BLACKWELL.check(dict(BLACKWELL_POINT, cluster=(16, 1)), ctx(B200)) is None  # non-portable 16
    assert BLACKWELL.check(dict(BLACKWELL_POINT, cluster=(16, 1)), ctx(replace(B200, max_cluster=8))).startswith(
        "cluster-size:")
    assert BLACKWELL.check(dict(BLACKWELL_POINT, cluster=(1, 2)), ctx(B200)).startswith("2cta-cluster:")
    assert BLACKWELL.check(dict(BLACKWELL_POINT, mma_m=64), ctx(B200)).startswith("mma-m:")
    assert BLACKWELL.check(dict(BLACKWELL_POINT, mma_m=256, use_2cta_instrs=False), ctx(B200)).startswith("mma-m:")
    assert BLACKWELL.check(dict(BLACKWELL_POINT, mma_m=64, use_2cta_instrs=False, cluster=(1, 1)), ctx(B200)) is None


# -- problem-dependent rules -----------------------------------------------------------------
def test_alignment_of_the_contiguous_dimension():
    odd_k = Problem.gemm(4096, 4096, 4100, "bf16", "tn")  # K is contiguous: 8200 B, not a multiple of 16
    for space, point in ((HOPPER, HOPPER_POINT), (BLACKWELL, BLACKWELL_POINT)):
        hw = H100 if space is HOPPER else B200
        reason = space.check(point, ctx(hw, odd_k))
        assert reason is not None and reason.startswith("alignment:") and "8200 B" in reason
        assert space.check(point, ctx(hw, Problem.gemm(4096, 4096, 4104, "bf16"))) is None
        assert len(space.feasible(ctx(hw, odd_k))) == 0
    # with layout nn, A is M-contiguous (B stays K-contiguous), so an odd M prunes
    assert "A (M=4100" in HOPPER.check(HOPPER_POINT, ctx(H100, Problem.gemm(4100, 4096, 4096, "bf16", "nn")))
    # C is row-major: N must span a multiple of 16 bytes; 4100 int32 outputs do, 4098 bf16 ones do not
    assert "C (N=4098" in HOPPER.check(HOPPER_POINT, ctx(H100, Problem.gemm(4096, 4098, 4096, "bf16", "nt")))
    # Triton masks its loads, so it has no alignment rule
    assert TRITON.check(TRITON_POINT, ctx(H100, odd_k)) is None


def test_hopper_8bit_operands_must_be_k_major():
    reason = HOPPER.check(HOPPER_POINT, ctx(H100, Problem.gemm(4096, 4096, 4096, "fp8", "nt")))
    assert reason is not None and reason.startswith("8bit-k-major:")
    assert HOPPER.check(HOPPER_POINT, ctx(H100, Problem.gemm(4096, 4096, 4096, "fp8", "tn"))) is None
    assert HOPPER.check(HOPPER_POINT, ctx(H100, Problem.gemm(4096, 4096, 4096, "bf16", "nt"))) is None


def test_dtype_rule():
    fp32 = Problem.gemm(4096, 4096, 4096, "fp32")
    assert HOPPER.check(HOPPER_POINT, ctx(H100, fp32)).startswith("dtype:")
    assert BLACKWELL.check(BLACKWELL_POINT, ctx(B200, fp32)).startswith("dtype:")


def test_blackwell_direct_store_needs_whole_tiles():
    point = dict(BLACKWELL_POINT, mma_n=96, use_tma_store=False)
    assert BLACKWELL.check(point, ctx(B200)).startswith("no-tma-store-oob:")
    assert BLACKWELL.check(dict(point, use_tma_store=True), ctx(B200)) is None
    assert BLACKWELL.check(point, ctx(B200, Problem.gemm(4096, 4128, 4096, "bf16"))) is None  # 4128 = 43 * 96


def test_triton_split_k_rule():
    k1536 = Problem.gemm(4096, 4096, 1536, "bf16")
    small = {**TRITON_POINT, "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}
    assert TRITON.check(dict(small, SPLIT_K=2, BLOCK_K=256), ctx(H100, k1536)) is None  # 2 x 768 = 2 x 3 x 256
    reason = TRITON.check(dict(small, SPLIT_K=8, BLOCK_K=256), ctx(H100, k1536))  # 8 x 192
    assert reason is not None and reason.startswith("split-k:") and "1536" in reason
    assert TRITON.check(dict(small, SPLIT_K=16, BLOCK_K=256), ctx(H100)) is None  # 4096 = 16 x 256
    # an unsplit K may be ragged (the K loop masks its tail)
    assert TRITON.check(dict(TRITON_POINT, SPLIT_K=1), ctx(H100, Problem.gemm(4096, 4096, 1000, "bf16"))) is None
    fs = TRITON.feasible(ctx(H100, k1536))
    assert all(1536 % (p["SPLIT_K"] * p["BLOCK_K"]) == 0 for p in all_points(TRITON, ctx(H100, k1536))
               if p["SPLIT_K"] > 1)
    assert fs.pruned["split-k"] > 0


def test_triton_register_limits():
    reason = TRITON.check(dict(TRITON_POINT, BLOCK_M=256, BLOCK_N=128, num_warps=4), ctx(H100))
    assert reason is not None and reason.startswith("regs-per-thread:") and "255" in reason
    assert TRITON.check(dict(TRITON_POINT, BLOCK_M=256, BLOCK_N=128, num_warps=8), ctx(H100)) is None
    few_regs = replace(H100, regs_per_sm=32768)
    reason = TRITON.check(dict(TRITON_POINT, BLOCK_M=256, BLOCK_N=128, num_warps=8), ctx(few_regs))
    assert reason is not None and reason.startswith("regs-per-block:") and "32768" in reason


def test_triton_fp8_needs_fp8_hardware():
    fp8 = Problem.gemm(4096, 4096, 4096, "fp8")
    assert TRITON.check(TRITON_POINT, ctx(A100, fp8)).startswith("fp8:")
    assert TRITON.check(TRITON_POINT, ctx(H100, fp8)) is None


def test_unknown_context_skips_what_it_cannot_check():
    # no GPU: no hardware limits; no problem: no shape rules; kernel rules on the point still apply
    assert len(HOPPER.feasible(Context())) == HOPPER.size
    assert len(TRITON.feasible(Context())) == TRITON.size
    fs = BLACKWELL.feasible(Context())
    assert 0 < len(fs) < BLACKWELL.size and set(fs.pruned) == {"mma-m", "2cta-cluster"}
    # a GPU but no problem: shared memory is sized for the default problem's dtype
    assert HOPPER.check(dict(HOPPER_POINT, stages=8), Context(H100)).startswith("smem:")


@pytest.mark.parametrize("space,hw", [(HOPPER, H100), (BLACKWELL, B200), (TRITON, A100)],
                         ids=["hopper", "blackwell", "triton"])
def test_every_pruning_message_is_fully_formatted(space: SearchSpace, hw: Hardware):
    problems = [BF16, Problem.gemm(4096, 4098, 4100, "fp8", "nt"), Problem.gemm(3000, 4096, 1536, "fp32")]
    seen = set()
    for problem in problems:
        for point in space.points():
            reason = space.check(point, ctx(hw, problem))
            if reason is not None:
                name = reason.split(":", 1)[0]
                if name not in seen:
                    seen.add(name)
                    assert "{" not in reason and "}" not in reason, reason
    assert len(seen) >= 3


# -- the estimate --------------------------------------------------------------------------
def test_estimate_prefers_big_tiles_for_big_problems():
    big = ctx(H100, Problem.gemm(8192, 8192, 8192, "bf16"))
    large = dict(HOPPER_POINT, tile_m=128, tile_n=256, stages=4)
    small = dict(HOPPER_POINT, tile_m=64, tile_n=64, stages=4)
    assert HOPPER.check(large, big) is None and HOPPER.check(small, big) is None
    assert HOPPER.estimate(large, big) < HOPPER.estimate(small, big)
    t_large = dict(TRITON_POINT, BLOCK_M=128, BLOCK_N=256, num_warps=8)
    t_small = dict(TRITON_POINT, BLOCK_M=64, BLOCK_N=64, num_warps=4)
    assert TRITON.check(t_large, big) is None and TRITON.check(t_small, big) is None
    assert TRITON.estimate(t_large, big) < TRITON.estimate(t_small, big)


def test_estimate_is_plausible_against_the_roofline():
    big = ctx(H100, Problem.gemm(8192, 8192, 8192, "bf16"))
    ms = HOPPER.estimate(HOPPER_POINT, big)
    roofline_ms = big.problem.flops / (H100.peak("bf16") * 1e12) * 1e3
    assert roofline_ms < ms < 2 * roofline_ms


def test_estimate_rewards_multicast_when_l2_bound():
    problem = Problem.gemm(8192, 8192, 8192, "bf16")
    t = gm.Tiling(tile_m=128, tile_n=128, tile_k=64, stages=6, smem_bytes=200_000, persistent=True)
    clustered = replace(t, cluster=(2, 2))
    assert gm.estimate_ms(clustered, problem, H100) < gm.estimate_ms(t, problem, H100)


@pytest.mark.parametrize("space,hws", [(HOPPER, [H100, H200]), (BLACKWELL, [B200]), (TRITON, [H100, A100, B200])],
                         ids=["hopper", "blackwell", "triton"])
def test_estimate_is_finite_and_positive_on_every_feasible_point(space: SearchSpace, hws: list[Hardware]):
    for hw in hws:
        context = ctx(hw)
        for point in all_points(space, context):
            ms = space.estimate(point, context)
            assert math.isfinite(ms) and ms > 0, point


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_estimate_without_a_context_uses_the_default_problem_and_h100(space: SearchSpace):
    point = all_points(space, Context())[0]
    assert space.estimate(point, Context()) == space.estimate(point, Context(H100, space.default_problem))
    odd = Context(H100, Problem.gemm(1000, 333, 77, "fp8"))
    assert math.isfinite(space.estimate(point, odd)) and space.estimate(point, odd) > 0


def test_message_fields():
    msg = gr.Message("{a} needs {need} B on {ctx.hardware.name}", lambda p, c: {"need": 2 * p["a"]})
    assert msg.format(a=3, ctx=ctx(H100)) == "3 needs 6 B on H100"
    assert isinstance(msg, str) and str(msg) == "{a} needs {need} B on {ctx.hardware.name}"


def test_a_space_made_from_a_builtin_is_loaded_by_workers_from_its_own_file(tmp_path):
    # workers load a space again from its source: a file whose SPACE is dataclasses.replace(builtin.SPACE)
    # must name that file, not the built-in it copied
    base = load_space("cute_hopper_gemm")
    assert base.source == "cute_hopper_gemm"
    path = tmp_path / "mine.py"
    path.write_text("import dataclasses\nfrom search_spaces import cute_hopper_gemm\n"
                    "SPACE = dataclasses.replace(cute_hopper_gemm.SPACE, name='mine', _feasible={})\n")
    mine = load_space(str(path))
    assert mine.name == "mine" and mine.source == str(path)
    assert load_space(mine.source).name == "mine" and base.source == "cute_hopper_gemm"

"""Search-space API: parameters, named constraints, hardware pruning, encoding and repair."""

from __future__ import annotations

import numpy as np
import pytest

from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.space import (
    Context,
    SearchSpace,
    boolean,
    categorical,
    constraint,
    hardware_limit,
    int_range,
    ordinal,
    power_of_two,
    tuples,
)


def toy_space() -> SearchSpace:
    def smem(p, ctx):  # bytes of a made-up kernel: stages of (block x 128) bf16 tiles
        return p["stages"] * p["block"] * 128 * 2

    return SearchSpace(
        "toy",
        [
            power_of_two("block", 16, 256),
            int_range("stages", 2, 6),
            categorical("raster", ["m", "n"]),
            tuples("cluster", [(1, 1), (1, 2), (2, 1), (2, 2)]),
            boolean("tma_store"),
        ],
        constraints=[
            constraint("tma-needs-big-block", lambda p, ctx: not p["tma_store"] or p["block"] >= 64,
                       "TMA store needs block >= 64, got {block}"),
            hardware_limit("shared-memory", lambda p, ctx: smem(p, ctx) <= ctx.hardware.smem_per_block,
                           "needs more shared memory than {ctx.hardware.name} allows"),
            hardware_limit("cluster", lambda p, ctx: p["cluster"][0] * p["cluster"][1] <= ctx.hardware.max_cluster,
                           "cluster {cluster} exceeds the chip's limit"),
        ],
    )


def test_param_kinds():
    assert power_of_two("b", 16, 128).choices == (16, 32, 64, 128)
    assert int_range("s", 2, 8, 2).choices == (2, 4, 6, 8)
    assert boolean("t").choices == (False, True)
    assert tuples("c", [(2, 2), (1, 1), (2, 1)]).choices == ((1, 1), (2, 1), (2, 2))
    assert not categorical("r", ["m", "n"]).ordered
    with pytest.raises(ValueError):
        ordinal("x", [1, 1])
    with pytest.raises(ValueError):
        power_of_two("x", 3, 16)


def test_constraint_reasons_name_the_rule_and_the_values():
    space = toy_space()
    ctx = Context(get_hardware("H100"), Problem.gemm(4096, 4096, 4096))
    p = {"block": 32, "stages": 2, "raster": "m", "cluster": (1, 1), "tma_store": True}
    assert space.check(p, ctx) == "tma-needs-big-block: TMA store needs block >= 64, got 32"
    p = {"block": 256, "stages": 6, "raster": "m", "cluster": (1, 1), "tma_store": False}
    assert space.check(p, ctx) == "shared-memory: needs more shared memory than H100 allows"
    p = {"block": 64, "stages": 2, "raster": "n", "cluster": (2, 2), "tma_store": True}
    assert space.check(p, ctx) is None


def test_hardware_pruning_depends_on_the_chip():
    space = toy_space()
    h100 = space.feasible(Context(get_hardware("H100")))
    a100 = space.feasible(Context(get_hardware("A100")))
    # A100 has no thread-block clusters: every cluster other than 1x1 is pruned there
    assert a100.pruned["cluster"] > 0 and h100.pruned["cluster"] == 0
    assert all(a100.point(r)["cluster"] == (1, 1) for r in range(len(a100)))
    # the enumeration agrees with check() point by point
    ctx = Context(get_hardware("H100"))
    feasible = sum(space.check(p, ctx) is None for p in space.points())
    assert feasible == len(h100)
    assert len(h100) + sum(h100.pruned.values()) == space.size


def test_encode_decode_and_storage_round_trip():
    space = toy_space()
    for p in space.points():
        assert space.decode(space.encode(p)) == p
        assert space.from_storage(space.to_storage(p)) == p
    assert space.to_storage({"block": 16, "stages": 2, "raster": "m", "cluster": (2, 1), "tma_store": False})[
        "cluster"] == "2x1"


def test_nearest_repair_lands_on_a_fresh_feasible_point():
    space = toy_space()
    ctx = Context(get_hardware("A100"))
    fs = space.feasible(ctx)
    bad = {"block": 16, "stages": 2, "raster": "m", "cluster": (2, 2), "tma_store": True}
    assert space.check(bad, ctx) is not None
    row = fs.nearest(space.encode(bad))
    fixed = fs.point(row)
    assert space.check(fixed, ctx) is None
    exclude = np.zeros(len(fs), dtype=bool)
    exclude[row] = True
    other = fs.nearest(space.encode(bad), exclude=exclude)
    assert other != row and space.check(fs.point(other), ctx) is None
    assert fs.nearest(space.encode(bad), exclude=np.ones(len(fs), dtype=bool)) is None


def test_problem_keys_and_buckets():
    p = Problem.gemm(4000, 11008, 4096, "int8")
    assert p.key == "gemm_int8_tn_4000x11008x4096"
    assert p.bucket().key == "gemm_int8_tn_4096x8192x4096"
    with pytest.raises(ValueError, match="m: must be a positive integer"):
        Problem.gemm(-1, 1, 1)


def _every_point(space: SearchSpace, context: Context) -> tuple[list[tuple[int, ...]], dict[str, int], dict[str, str]]:
    """What the feasible set must hold, by checking every point of the product in turn."""
    codes, pruned, reasons = [], {}, {}
    for point in space.points():
        reason = space.check(point, context)
        if reason is None:
            codes.append(space.encode(point))
        else:
            name = reason.split(":", 1)[0]
            pruned[name] = pruned.get(name, 0) + 1
            reasons.setdefault(name, reason)
    return codes, pruned, reasons


def _guarded(p, ctx) -> bool:
    try:  # a rule with its own broad except must still wait for the parameters it reads
        return p["c"] != 1 or p["d"]
    except Exception:
        return False


def test_the_staged_walk_prunes_exactly_like_checking_every_point():
    # rules that read early, late, none (context only) and p.get of a parameter and of a missing key
    space = SearchSpace(
        "walk",
        [ordinal("a", [1, 2, 3]), categorical("b", ["x", "y"]), ordinal("c", [1, 2, 4]), boolean("d")],
        constraints=[
            hardware_limit("gpu", lambda p, ctx: ctx.hardware is None or ctx.hardware.name != "A100", "not on A100"),
            constraint("late", lambda p, ctx: p["d"] or p["c"] < 4, "c {c} needs d"),
            constraint("early", lambda p, ctx: p["a"] != 2, "a {a}"),
            constraint("get", lambda p, ctx: p.get("b") != "y" or (p.get("missing", 1) == 1 and p["a"] < 3), "b {b}"),
            constraint("in", lambda p, ctx: "c" not in p or p["c"] != 2 or p["a"] != 3, "c {c}, a {a}"),
            # whole-point predicates: sum over the values, the length, the items
            constraint("sum", lambda p, ctx: sum(v for v in p.values() if isinstance(v, int)) % 3 != 1, "sum"),
            constraint("all", lambda p, ctx: len(p) == 4 and all(k for k, _ in p.items()) and {**p} != {}, "all"),
            constraint("guarded", _guarded, "guarded"),
        ],
    )
    for hw in (None, get_hardware("H100"), get_hardware("A100")):
        context = Context(hw)
        fs = space.feasible(context)
        codes, pruned, reasons = _every_point(space, context)
        assert [tuple(c) for c in fs.codes] == codes
        assert dict(fs.pruned) == pruned and fs.reasons == reasons
    assert len(space.feasible(Context(get_hardware("A100")))) == 0


@pytest.mark.parametrize("name", ["cute_hopper_gemm", "cute_blackwell_gemm", "triton_matmul"])
def test_the_staged_walk_agrees_on_the_builtin_spaces(name):
    from evotune.core.plugins import load_space

    space = load_space(name)
    for hw, problem in [("H100", Problem.gemm(4096, 4096, 4096, "bf16")),
                        ("B200", Problem.gemm(16, 4096, 11008, "int8")),
                        ("A100", Problem.gemm(100, 30, 64, "fp16", "nn"))]:
        context = Context(get_hardware(hw), problem)
        fs = space.feasible(context)
        codes, pruned, reasons = _every_point(space, context)
        assert [tuple(c) for c in fs.codes] == codes
        assert dict(fs.pruned) == pruned and fs.reasons == reasons


def test_a_rule_with_its_own_broad_except_waits_for_what_it_reads():
    space = SearchSpace("guard", [ordinal("a", [1, 2]), ordinal("c", [1, 2]), boolean("d")],
                        constraints=[constraint("guarded", _guarded, "guarded")])
    fs = space.feasible(Context())
    codes, pruned, reasons = _every_point(space, Context())
    assert [tuple(c) for c in fs.codes] == codes and dict(fs.pruned) == pruned == {"guarded": 2}
    assert fs.reasons == reasons

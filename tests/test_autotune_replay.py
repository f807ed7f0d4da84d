"""benchmarks/autotune_replay.py: evotune.autotune's per-key search replayed over recorded landscapes.

The landscapes are built here: 288 configurations of a matmul-like space per key, on three GEMM shapes
whose times share one structure (the same configurations are fast for every shape, the best one moving
with the shape), a few configurations recorded as compile errors, the largest shape's recording sampled.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import pytest

from evotune.core.landscape import landscape_document, write_landscape
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import ordinal

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [512, 1024, 2048]  # M = N = K; neighbours are 3 apart in key distance, the ends 6 (beyond transfer)
SAMPLED = 2048  # this shape's landscape holds 4 of every 5 points
PARAMS = [ordinal("BLOCK_M", [16, 32, 64, 128]), ordinal("BLOCK_N", [16, 32, 64, 128]),
          ordinal("BLOCK_K", [16, 32, 64]), ordinal("num_warps", [2, 4, 8]), ordinal("num_stages", [2, 3])]


def _replay():
    spec = importlib.util.spec_from_file_location("autotune_replay", ROOT / "benchmarks" / "autotune_replay.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["autotune_replay"] = mod
    spec.loader.exec_module(mod)
    return mod


def _time(p: dict, size: int) -> float:
    """A smooth, shape-dependent landscape: the best tile is 64 up to 1024 and 128 beyond; block K, warps and
    stages matter less (a handful of points lie within 1% of the optimum)."""
    best_tile = 64 if size <= 1024 else 128
    tile = math.log2(p["BLOCK_M"] / best_tile) ** 2 + math.log2(p["BLOCK_N"] / best_tile) ** 2
    k = math.log2(p["BLOCK_K"] / 32) ** 2
    warps = math.log2(p["num_warps"] / 4) ** 2
    return (size / 512) ** 3 * 0.1 * (1 + 0.3 * tile + 0.05 * k + 0.008 * warps
                                      + (0.005 if p["num_stages"] == 2 else 0))


def _write(folder: Path, size: int) -> Path:
    names = [p.name for p in PARAMS]
    rows = []
    for i, values in enumerate(itertools.product(*(p.choices for p in PARAMS))):
        point = dict(zip(names, values, strict=True))
        if size == SAMPLED and i % 5 == 0:
            continue  # a sampled recording: the search must keep to the recorded points
        if point["BLOCK_M"] == 128 and point["BLOCK_N"] == 128 and point["num_warps"] == 2:
            rows.append((point, EvalResult(Status.COMPILE_ERROR, message="out of shared memory")))
            continue
        t = _time(point, size)
        rows.append((point, EvalResult(Status.OK, t, [t * 0.99, t, t * 1.01])))
    doc = landscape_document(PARAMS, rows, Problem.gemm(size, size, size, dtype="fp16"),
                             {"device": "synthetic", "complete": size != SAMPLED}, "matmul_test")
    return write_landscape(folder / f"mm_{size:05d}.json.gz", doc)


@pytest.fixture(scope="module")
def landscapes(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("landscapes")
    for size in SHAPES:
        _write(folder, size)
    return folder


@pytest.fixture(scope="module")
def replayed(landscapes):
    mod = _replay()
    keys = mod.load_keys([str(landscapes)])
    runs = mod.replay_seed(keys, seed=0, budget=40, confirm=3, storage="sqlite")
    return mod, keys, runs


def test_keys_in_file_order_with_gemm_fields(replayed):
    _, keys, _ = replayed
    assert [k.fields["M"] for k in keys] == SHAPES
    assert [len(k.landscape) for k in keys] == [288, 288, 288 - 58]  # every 5th of 288 left out


def test_later_keys_take_the_earlier_keys_as_sources(replayed):
    _, _, runs = replayed
    assert [len(r.sources) for r in runs] == [0, 1, 1]  # 512 <-> 2048 is beyond the transfer distance
    assert runs[1].sources == ["key:M=512,N=512,K=512,dtype=fp16"]
    assert runs[2].sources == ["key:M=1024,N=1024,K=1024,dtype=fp16"]


def test_evaluations_stay_within_the_budget_and_decide(replayed):
    _, _, runs = replayed
    for r in runs:
        assert 1 <= r.evals <= 40
        assert r.trials == r.evals  # every evaluation is a trial of the key's study, and nothing else is
        assert r.how == "confirmed"
        assert 0 < r.decided_fraction <= 1
        assert all(a <= b for a, b in zip(r.fractions, r.fractions[1:], strict=False))  # best so far


def test_transfer_reaches_099_sooner_than_a_fresh_cache(landscapes, replayed):
    mod, keys, runs = replayed
    alone = mod.replay_seed([keys[1]], seed=0, budget=40, confirm=3, storage="sqlite")[0]
    assert alone.sources == []
    with_source = runs[1].evals_to()
    assert with_source is not None
    assert alone.evals_to() is None or with_source < alone.evals_to()


def test_main_writes_the_summary(landscapes, tmp_path, capsys):
    mod = _replay()
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--order", "mm_01024,mm_00512", "--seeds", "2",
                   "--budget", "12", "--out", str(out), "--storage", "journal"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["order"] == ["mm_01024", "mm_00512"]
    assert [k["limit"] for k in doc["keys"]] == [40, 10]
    assert len(doc["runs"]) == 4 and all(len(r["fractions"]) <= 12 for r in doc["runs"])
    printed = capsys.readouterr().out
    assert "01024" in printed and "00512" in printed and ("PASS" in printed or "FAIL" in printed)


def test_bad_order_is_one_line_exit_2(landscapes, tmp_path, capsys):
    mod = _replay()
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--order", "mm_00512,nope", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: --order: nope") and "\n" not in err
    assert not out.exists()


#: the example kernel's module imports torch and triton: without them (``pip install '.[test]'`` alone) its grid
#: cannot be read, and these cases are skipped
EXAMPLE = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "triton")),
                             reason="the example kernel needs torch and triton")


@EXAMPLE
def test_grid_rule_counts_the_example_launch_and_feeds_the_search(landscapes, tmp_path, capsys):
    mod = _replay()
    rule = mod.GridRule(str(ROOT / "examples" / "triton_autotune" / "matmul.py") + ":grid")
    point = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
    assert rule.programs({"M": 256, "N": 4096, "K": 4096, "dtype": "fp16"}, point) == 4 * 32
    assert rule.programs({"M": 100, "N": 100, "K": 7, "dtype": "fp16"}, point) == 2 * 1
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--seeds", "1", "--budget", "12", "--out", str(out),
                   "--grid", str(ROOT / "examples" / "triton_autotune" / "matmul.py") + ":grid", "--sms", "132"])
    assert rc == 0 and "launch features from" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["sms"] == 132 and len(doc["runs"]) == len(SHAPES)
    assert doc["runs"][1]["sources"] == ["key:M=512,N=512,K=512,dtype=fp16"]


@pytest.mark.parametrize(("spec", "message"), [
    ("nofile.py:grid", "--grid: nofile.py does not exist"),
    pytest.param("examples/triton_autotune/matmul.py:nothing", "has no function 'nothing'", marks=EXAMPLE),
    ("examples/triton_autotune/matmul.py", "expected FILE:FUNCTION"),
])
def test_bad_grid_is_one_line_exit_2(landscapes, tmp_path, capsys, monkeypatch, spec, message):
    monkeypatch.chdir(ROOT)
    mod = _replay()
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--grid", spec, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and err.startswith("error: --grid") and "\n" not in err
    assert not out.exists()


def test_sources_are_the_keys_within_one_of_the_nearest():
    """A key further than the nearest tuned one by more than NEAR weighs under exp(-2) of it in the prior, yet
    its fastest point would be a transferred winner: it is left out."""
    from types import SimpleNamespace

    from optuna.trial import TrialState

    from evotune.core.space import SearchSpace
    from evotune.triton_tuning.neighbours import sources

    space = SearchSpace("s", [ordinal("BLOCK_M", [16, 32])])
    trials = [SimpleNamespace(params={"BLOCK_M": 16}, value=1.0, state=TrialState.COMPLETE, user_attrs={}),
              SimpleNamespace(params={"BLOCK_M": 32}, value=2.0, state=TrialState.COMPLETE, user_attrs={})]
    keys = [{"M": m, "N": 4096} for m in (16, 32, 64, 128, 512)]
    cache = SimpleNamespace(kernel=SimpleNamespace(prefix="k/"), decided_trials=lambda name, decision: trials,
                            tuned=lambda: [(k, f"k/M={k['M']}", None) for k in keys])
    got = sources(cache, {"M": 256, "N": 4096}, space)  # type: ignore[arg-type]
    assert [s.name for s in got] == ["key:M=128", "key:M=512", "key:M=64"]  # 1, 1, 2; not 32 (3) nor 16 (4)


def _ok(key, point_key: str) -> bool:
    """Whether the landscape recorded a time for the point named by ``space.key`` (the stand-ins' values are ints)."""
    point = {name: int(value) for name, value in (item.split("=") for item in point_key.split(","))}
    got = key.landscape.lookup(point)
    return got is not None and got.value is not None


@pytest.mark.parametrize("cost", [0.0, 7.5])
def test_compile_cost_counts_the_earlier_keys_points_as_built(landscapes, monkeypatch, cost):
    """The stand-in keys share one specialisation (M, N, K all multiples of 16): every point measured with a time
    for an earlier key is built for the later ones; the search is handed them, as the Autotuner hands them, only
    with a cost, and the new compiles are the measured points outside them either way."""
    mod = _replay()
    jobs = []
    real = mod.tune_key
    monkeypatch.setattr(mod, "tune_key", lambda job: jobs.append(job) or real(job))
    keys = mod.load_keys([str(landscapes)])
    runs = mod.replay_seed(keys, seed=0, budget=12, confirm=2, storage="sqlite", compile_cost=cost)
    built: set[str] = set()
    for key, run, job in zip(keys, runs, jobs, strict=True):
        assert job.compile_cost == cost
        assert job.built == (frozenset(built) if cost > 0 else frozenset())
        assert run.built == len(built) and len(run.measured) == run.evals
        assert run.new_compiles == len(set(run.measured) - built)
        built |= {p for p in run.measured if _ok(key, p)}
    assert runs[0].new_compiles == runs[0].evals  # nothing built before the first key
    if cost > 0:  # weighed, the later keys' first points are drawn among the built ones
        assert all(r.new_compiles < r.evals for r in runs[1:])


def test_main_reports_new_compiles_and_refuses_a_bad_cost(landscapes, tmp_path, capsys):
    mod = _replay()
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--seeds", "1", "--budget", "8", "--compile-cost", "0.54",
                   "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["compile_cost"] == 0.54
    assert [k["new_compiles"] for k in doc["keys"]] == [[r["new_compiles"] for r in doc["runs"]][i:i + 1]
                                                       for i in range(len(SHAPES))]
    assert doc["keys"][0]["median_new_compiles"] == 8
    printed = capsys.readouterr().out
    assert "compile cost 0.54" in printed and "new" in printed.splitlines()[1].split()
    bad = tmp_path / "bad.json"
    rc = mod.main(["--landscapes", str(landscapes), "--compile-cost", "-1", "--out", str(bad)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: --compile-cost: expected a number >= 0, got -1.0" and not bad.exists()


@EXAMPLE
@pytest.mark.parametrize("m", [1, 16, 2048])
def test_fused_moe_grid_counts_the_kernels_blocks_of_an_even_routing(m):
    """The key's grid is the kernel's own (search_spaces/_triton_fused_moe.py: a program per padded row block and
    column block) for a routing that gives every routed expert the same share of the slots."""
    import torch

    from search_spaces._triton_fused_moe import align

    spec = importlib.util.spec_from_file_location("fused_moe_grid", ROOT / "benchmarks" / "fused_moe_grid.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    experts, n = 8, 14336
    ids = (torch.arange(m * mod.TOP_K) % experts).view(m, mod.TOP_K)
    rule = mod.grid(M=m, N=n, E=experts)
    for bm, bn in [(16, 32), (64, 128), (256, 256)]:
        _, owners = align(ids, experts, bm)  # one entry per row block
        assert rule({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}) == (len(owners) * -(-n // bn),)


#: a stand-in kernel's space whose constraint reads the launch: BLOCK_M at most a 16th of the rows, so at M = 512
#: BLOCK_M 64 and 128 are pruned (the optimum's tile among them), at 1024 BLOCK_M 128, at 2048 nothing
STAND_IN_SPACE = """
from evotune.authoring import SearchSpace, constraint, ordinal

SPACE = SearchSpace("stand_in", [ordinal("BLOCK_M", [16, 32, 64, 128]), ordinal("BLOCK_N", [16, 32, 64, 128]),
                                 ordinal("BLOCK_K", [16, 32, 64]), ordinal("num_warps", [2, 4, 8]),
                                 ordinal("num_stages", [2, 3])],
                    constraints=[constraint("block-m-within-rows", lambda p, ctx: p["BLOCK_M"] * 16 <= ctx.args["M"],
                                            "BLOCK_M {BLOCK_M} is over a 16th of the rows")])


def launch(M, K):
    return {"M": M, "K": K}
"""


def _pruned_by_stand_in(point_key: str, m: int) -> bool:
    return int(dict(item.split("=") for item in point_key.split(","))["BLOCK_M"]) * 16 > m


def test_space_keeps_the_points_its_constraints_accept_in_each_launch(landscapes, replayed, tmp_path):
    mod, _, unpruned = replayed
    (tmp_path / "stand_in.py").write_text(STAND_IN_SPACE)
    rule = mod.SpaceRule(f"{tmp_path / 'stand_in.py'}:SPACE", f"{tmp_path / 'stand_in.py'}:launch")
    keys = [rule.apply(k) for k in mod.load_keys([str(landscapes)])]
    # 512: BLOCK_M 64 and 128, half of the 288 points; 1024: BLOCK_M 128, a quarter; 2048 (sampled): none
    assert [k.pruned for k in keys] == [{"block-m-within-rows": 144}, {"block-m-within-rows": 72}, {}]
    assert [len(k.candidates) for k in keys] == [144, 216, 288 - 58]
    assert keys[0].kept_fraction() < 1 and keys[2].kept_fraction() == 1  # 512's fastest tile (64) is pruned
    # over every recorded point the search proposes pruned ones; over the space's, never
    assert any(_pruned_by_stand_in(p, k.fields["M"]) for k, r in zip(keys, unpruned, strict=True)
               for p in r.measured)
    runs = mod.replay_seed(keys, seed=0, budget=16, confirm=2, storage="sqlite")
    for key, run in zip(keys, runs, strict=True):
        assert run.evals == min(16, len(key.candidates))
        assert not any(_pruned_by_stand_in(p, key.fields["M"]) for p in run.measured)
    summary = mod.summarize(keys, runs)
    assert [s.pruned for s in summary] == [144, 72, 0] and summary[0].kept_fraction < 1


@pytest.mark.parametrize(("extra", "message"), [
    (["--space", "{f}:SPACE"], "error: --launch: missing"),
    (["--space", "{f}:launch", "--launch", "{f}:launch"], "expected a SearchSpace, found function"),
    (["--space", "{f}:SPACE", "--launch", "{f}:SPACE"], "error: --launch: {f} has no function 'SPACE'"),
])
def test_bad_space_is_one_line_exit_2(landscapes, tmp_path, capsys, extra, message):
    mod = _replay()
    f = tmp_path / "stand_in.py"
    f.write_text(STAND_IN_SPACE)
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--out", str(out), *(e.format(f=f) for e in extra)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message.format(f=f) in err and "\n" not in err
    assert not out.exists()


@EXAMPLE
def test_fused_moe_space_prunes_the_recorded_grid_at_its_launch():
    """At M = 16 an expert gets 16 x 2 / 8 = 4 tokens on average: every BLOCK_SIZE_M over 16 is mostly padding
    (4 of the 5 choices of 1,920 points), and of the rest the 256-wide tiles' deepest pipelines exceed the shared
    memory."""
    mod = _replay()
    rule = mod.SpaceRule(f"{ROOT / 'search_spaces' / '_triton_fused_moe.py'}:SPACE",
                         f"{ROOT / 'benchmarks' / 'fused_moe_grid.py'}:launch_args")
    key, = mod.load_keys([str(ROOT / "evotune" / "landscapes" / "autotune_moe"
                              / "vllm_fused_moe_E8_N14336_K4096_M16_bf16.json.gz")])
    kept = rule.apply(key)
    assert kept.pruned["block-m-vs-tokens-per-expert"] == 1920 * 4 // 5
    assert set(kept.pruned) == {"block-m-vs-tokens-per-expert", "shared-memory"}
    assert {row[0] for row in kept.candidates} == {16} and kept.kept_fraction() == 1.0


def test_unspecialised_fields_share_one_build_across_every_key():
    """M = 4 and 8 are specialised apart from M = 16 (neither 1 nor a multiple of 16, against a multiple of 16):
    apart, nothing measured for them is built for M = 16; for a kernel not specialised on M (``--unspecialised M``,
    the package's fused MoE) every configuration measured with a time for the earlier keys is."""
    mod = _replay()
    folder = ROOT / "evotune" / "landscapes" / "autotune_moe_h200"
    stems = [f"vllm_fused_moe_E8_N14336_K4096_M{m}_bf16" for m in (4, 8, 16)]
    keys = mod.load_keys([str(folder / f"{stem}.json.gz") for stem in stems], stems)
    apart, shared = (mod.replay_seed(keys, seed=0, budget=8, confirm=2, storage="sqlite", compile_cost=0.54,
                                     unspecialised=free) for free in (frozenset(), frozenset({"M"})))
    assert apart[1].built > 0 and apart[2].built == 0  # M = 8 shares M = 4's specialisation, M = 16 does not
    timed = {p for key, run in zip(keys[:2], shared, strict=False) for p in run.measured if _ok(key, p)}
    assert shared[2].built == len(timed) > 0
    assert shared[2].new_compiles == len(set(shared[2].measured) - timed)


def test_bad_unspecialised_is_one_line_exit_2(landscapes, tmp_path, capsys):
    mod = _replay()
    out = tmp_path / "replay.json"
    rc = mod.main(["--landscapes", str(landscapes), "--unspecialised", "M,Q", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: --unspecialised: Q: not a field of the keys (M, N, K, dtype)" and not out.exists()

"""Compiles across batch sizes: a fused-MoE configuration built for one key is built for every key Triton
specialises the same (M = 1, a multiple of 16, or neither; any M for a kernel not specialised on M, as the
package's fused MoE), and a key's search weighs the configurations not built
yet by their compile (``compile_cost``). A stand-in measures each configuration on a synthetic landscape and counts
a compile the first time a configuration is measured for a specialisation, as Triton's shared on-disk cache does."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, FeasibleSet, Point, SearchSpace, ordinal
from evotune.search.compile_cost import Kernels
from evotune.triton_tuning.builds import built_points, later_points, not_specialised_on, specialisation
from evotune.triton_tuning.cache import DecisionStore, KernelId
from evotune.triton_tuning.compile_count import CompileCount
from evotune.triton_tuning.configs import Candidates, LaunchContext
from evotune.triton_tuning.neighbours import sources
from evotune.triton_tuning.search import KeyJob, _search, tune_key
from evotune.triton_tuning.timers import WallClockTimer

pytest.importorskip("torch")
from search_spaces._triton_fused_moe import SPACE

N, K, E, TOP_K = 2 * 14336 // 2, 4096, 8, 2  # Mixtral-8x7B at tp 2: gate-up N = 2 x 14336 / 2
BUDGET = 16
COMPILE_COST = 7.5  # a 1.5 s build against a 0.2 s evaluation, one build at a time


class Half:
    """What the space's shared-memory rule reads of the activations: 16-bit elements."""

    def element_size(self) -> int:
        return 2


class CountingCompiles:
    """Times a configuration by a smooth landscape of the key (large tiles pay off with M); a configuration's first
    measurement for a specialisation is a compile."""

    def __init__(self, unspecialised: frozenset[str] = frozenset()) -> None:
        self.built: set[tuple[tuple[str, ...], str]] = set()
        self.compiles: dict[int, int] = {}
        self.unspecialised = unspecialised

    def measure(self, key: dict[str, Any], point: Point) -> EvalResult:
        spec = (specialisation(key, self.unspecialised), SPACE.key(point))
        if spec not in self.built:
            self.built.add(spec)
            self.compiles[key["M"]] = self.compiles.get(key["M"], 0) + 1
        m = key["M"]
        best_m = 16 if m <= 32 else 64
        tile = math.log2(point["BLOCK_SIZE_M"] / best_m) ** 2 + math.log2(point["BLOCK_SIZE_N"] / 64) ** 2
        extra = 0.05 * math.log2(point["BLOCK_SIZE_K"] / 128) ** 2 + 0.02 * abs(point["num_stages"] - 3) \
            + 0.01 * (point["num_warps"] == 8) + 0.01 * math.log2(point["GROUP_SIZE_M"] + 1)
        return EvalResult(Status.OK, 0.01 * (1 + m / 64) * (1 + 0.3 * tile + extra))


def key_job(cache: DecisionStore, standin: CountingCompiles, m: int, compile_cost: float) -> KeyJob:
    """The job ``evotune.autotune`` makes of a fused-MoE key (tune-model's compile cost, the built points; the
    stand-in's arguments not specialised on as the kernel's)."""
    key = {"M": m, "N": N, "K": K, "E": E}
    ctx = LaunchContext(args={"M": m, "N": N, "K": K, "E": E, "top_k": TOP_K, "a": Half()})
    # the candidates the Autotuner keeps for this launch (the space's own cache is keyed by hardware and problem, not
    # by the launch's arguments)
    feasible = Candidates.from_space(SPACE).feasible(ctx)
    return KeyJob(cache, key, SPACE, feasible, None, BUDGET, lambda p: standin.measure(key, p),
                  lambda p: lambda: None, WallClockTimer(), confirm=1, ctx=ctx, compile_cost=compile_cost,
                  built=built_points(cache, key, SPACE, standin.unspecialised) if compile_cost > 0 else frozenset())


def store(tmp_path: Path) -> DecisionStore:
    return DecisionStore(f"sqlite:///{tmp_path}/autotune.db", KernelId("moe", "0" * 16, "3", "cpu"))


def tune_keys(tmp_path: Path, ms: list[int], compile_cost: float,
              unspecialised: frozenset[str] = frozenset()) -> dict[int, int]:
    """Each key's compiles, the keys tuned in order."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cache, standin = store(tmp_path), CountingCompiles(unspecialised)
    for m in ms:
        tune_key(key_job(cache, standin, m, compile_cost))
    return standin.compiles


def test_keys_of_one_specialisation_share_their_builds() -> None:
    assert specialisation({"M": 16, "N": 7168}) == specialisation({"M": 48, "N": 7168})
    assert len({specialisation({"M": m}) for m in (1, 2, 4, 16)}) == 3  # 1; 2 and 4 (neither); 16


def test_a_kernel_not_specialised_on_m_shares_its_builds_across_every_batch_size(tmp_path) -> None:
    """The package's fused MoE is not specialised on M (M only bounds its routed slots): what M = 16 built is built
    for M = 1 and 2 too, and their searches count it so; fewer keys of the sweep compile."""
    from search_spaces import _triton_fused_moe as moe

    assert not_specialised_on(moe.moe_gemm_kernel) == {"M"}  # the jit function, as a GPU run loads it
    assert len({specialisation({"M": m, "N": N}, frozenset({"M"})) for m in (1, 2, 4, 16, 48)}) == 1
    cache, standin = store(tmp_path), CountingCompiles(frozenset({"M"}))
    tune_key(key_job(cache, standin, 16, COMPILE_COST))
    measured = {k for _, k in standin.built}
    assert all(key_job(cache, standin, m, COMPILE_COST).built == measured for m in (1, 2))
    ms = [1, 2, 4, 8, 16, 32]
    shared = tune_keys(tmp_path / "shared", ms, COMPILE_COST, frozenset({"M"}))
    apart = tune_keys(tmp_path / "apart", ms, COMPILE_COST)
    assert sum(shared.values()) < sum(apart.values())


def feasible_at(m: int) -> FeasibleSet:
    """The fused MoE's candidates at M = ``m`` (Mixtral-8x7B tp 2)."""
    ctx = LaunchContext(args={"M": m, "N": N, "K": K, "E": E, "top_k": TOP_K, "a": Half()})
    return Candidates.from_space(SPACE).feasible(ctx)


def test_what_is_built_ahead_for_later_keys_puts_their_new_tiles_first() -> None:
    """While M = 16 is searched (16-row tiles only), its processes build for M = 48 and 64 first the 32-row tiles
    no search has built, nearest key first, then the 16-row tiles M = 16 offers too; none built already, none twice,
    in an order that does not depend on the key asking (the next key takes up where this one ended)."""
    now, m48, m64 = feasible_at(16), feasible_at(48), feasible_at(64)
    rows = lambda fs: [fs.point(r) for r in range(len(fs))]  # noqa: E731
    assert {p["BLOCK_SIZE_M"] for p in rows(now)} == {16} and {p["BLOCK_SIZE_M"] for p in rows(m64)} == {32}
    built = {SPACE.key(p) for p in rows(m48)[::3]}
    got = later_points(SPACE, now, [m48, m64], built)
    keys = [SPACE.key(p) for p in got]
    assert len(keys) == len(set(keys)) and not set(keys) & built
    assert set(keys) == {SPACE.key(p) for p in rows(m48) + rows(m64)} - built
    tiles = [p["BLOCK_SIZE_M"] for p in got]
    assert tiles == sorted(tiles, key=lambda bm: bm != 32)  # the new 32-row tiles, then the 16-row ones
    new48 = {SPACE.key(p) for p in rows(m48) if p["BLOCK_SIZE_M"] == 32} - built
    assert set(keys[:len(new48)]) == new48  # M = 48's before M = 64's
    # asked by M = 1 (16-row tiles too), the same configurations come in the same order
    assert later_points(SPACE, feasible_at(1), [m48, m64], built) == got


def test_a_space_that_compiles_every_parameter_counts_the_built_points() -> None:
    space = SearchSpace("s", [ordinal("BLOCK", (16, 32, 64, 128))])
    fs = FeasibleSet.from_codes(space, [space.encode({"BLOCK": b}) for b in (16, 32, 64, 128)])
    assert Kernels.of(space, fs, Context()) is None  # nothing said about builds: nothing to weigh
    done = {32, 128}
    space.built = lambda p, problem: p["BLOCK"] in done
    kernels = Kernels.of(space, fs, Context(problem=Problem(kind="triton", label="M=16")))
    assert kernels is not None and kernels.count == 4
    assert kernels.new(np.arange(4)).tolist() == [True, False, True, False]


def test_a_later_keys_search_knows_which_configurations_an_earlier_key_built(tmp_path) -> None:
    cache, standin = store(tmp_path), CountingCompiles()
    first = key_job(cache, standin, 16, COMPILE_COST)
    assert not first.built  # nothing tuned yet
    tune_key(first)
    measured = {k for _, k in standin.built}
    later = key_job(cache, standin, 48, COMPILE_COST)  # M = 48: the specialisation of M = 16
    assert later.built == measured and len(measured) == BUDGET
    strategy = _search(later, sources(cache, later.key, later.space))
    assert strategy.kernels is not None and float(strategy.options.compile_cost) == COMPILE_COST
    built_rows = {r for r in range(len(later.feasible)) if SPACE.key(later.feasible.point(r)) in measured}
    assert built_rows and set(np.flatnonzero(~strategy.kernels.new(np.arange(len(later.feasible))))) == built_rows
    # M = 2 is specialised otherwise: nothing of M = 16's is built for it
    assert not key_job(cache, standin, 2, COMPILE_COST).built


def test_each_searched_key_records_the_keys_it_transferred_from(tmp_path) -> None:
    cache, standin = store(tmp_path), CountingCompiles()
    first, later = key_job(cache, standin, 16, COMPILE_COST), key_job(cache, standin, 48, COMPILE_COST)
    tune_key(first)
    expected = [s.name for s in sources(cache, later.key, later.space)]
    tune_key(later)
    recorded = {k: cache.study(job.key, job.space).study.user_attrs["sources"] for k, job in
                (("first", first), ("later", later))}
    assert recorded == {"first": [], "later": expected} and len(expected) == 1 and expected[0].startswith("key:")


def test_a_decided_keys_trials_are_read_once_for_every_later_key(tmp_path, monkeypatch) -> None:
    cache, standin = store(tmp_path), CountingCompiles()
    tune_key(key_job(cache, standin, 16, COMPILE_COST))
    reads: list[int] = []
    real = cache.storage.get_all_trials
    monkeypatch.setattr(cache.storage, "get_all_trials", lambda sid, *a, **kw: reads.append(sid) or real(sid, *a, **kw))
    first = (key_job(cache, standin, 48, COMPILE_COST).built, sources(cache, {"M": 48, "N": N, "K": K, "E": E}, SPACE))
    again = (key_job(cache, standin, 32, COMPILE_COST).built, sources(cache, {"M": 32, "N": N, "K": K, "E": E}, SPACE))
    assert len(reads) == 1 and first[0] == again[0] and len(first[0]) == BUDGET  # M = 16's study, read once
    assert [len(s.results) for s in first[1]] == [len(s.results) for s in again[1]] == [BUDGET]
    # the same key decided again (its study holds more trials): read anew
    sid = cache.storage.get_study_id_from_name(cache.study_name({"M": 16, "N": N, "K": K, "E": E}))
    attrs = cache.storage.get_study_user_attrs(sid)
    cache.storage.set_study_user_attr(sid, "autotune", {**attrs["autotune"], "date": "2099-01-01T00:00:00+00:00"})
    key_job(cache, standin, 48, COMPILE_COST)
    assert len(reads) == 2


@pytest.mark.slow  # four keys searched by the default strategy
def test_later_keys_compile_fewer_configurations_than_the_first(tmp_path) -> None:
    ms = [16, 32, 48, 64]  # one specialisation: M a multiple of 16
    compiles = tune_keys(tmp_path, ms, COMPILE_COST)
    assert compiles[16] == BUDGET  # the first key builds every configuration it measures
    assert all(compiles.get(m, 0) < compiles[16] for m in ms[1:])


def test_triton_compiles_are_counted_while_a_key_is_tuned(monkeypatch) -> None:
    knobs = pytest.importorskip("triton").knobs
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    heard: list[bool] = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: heard.append(kw["cache_hit"]))
    before = knobs.compilation.listener
    with CompileCount() as count:
        for hit in (False, False, True):  # as triton.compile calls it: two built, one found in the cache
            knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=hit)
    assert (count.compiles, count.loads) == (2, 1)
    assert heard == [False, False, True] and knobs.compilation.listener is before  # the earlier listener kept
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with CompileCount() as count:
        pass
    assert (count.compiles, count.loads) == (None, None)  # the interpreter compiles nothing: not counted


def test_tune_models_compile_cost_is_a_builds_share_of_its_build_processes(monkeypatch) -> None:
    from evotune.model.tuning import compile_cost

    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "14")
    assert compile_cost() == pytest.approx(1.5 / (0.2 * 14))
    monkeypatch.setenv("EVOTUNE_COMPILE_THREADS", "1")
    assert compile_cost() == pytest.approx(7.5)

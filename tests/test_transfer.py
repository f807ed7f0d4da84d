"""Transfer: ``default`` learning from related results (sources), and staying as it was without them."""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics

import numpy as np
import pytest
from conftest import LANDSCAPES, PNPOLY, ROOT

from evotune.core.problem import Problem
from evotune.core.space import Context
from evotune.reporting.compare import Case
from evotune.reporting.compare.metrics import run_metrics
from evotune.reporting.compare.runs import run_evotune
from evotune.search.strategies import Source, make_strategy
from evotune.search.strategies.base import OptionError
from evotune.search.transfer import device_distance, from_landscape, problem_distance

H100 = ROOT / "evotune" / "landscapes" / "h100"
INT8 = "cute_hopper_gemm_gemm_int8_tn_{}.json.gz"

#: the rows ``default`` handed out on pnpoly_RTX_2080_Ti (seeds 0 and 7, ask(1) / tell), before sources existed
BEFORE = {
    0: [
        299, 4017, 30, 3200, 2003, 3598, 891, 1138, 2704, 2316, 1509, 3489, 90, 3093, 3062, 3121, 512, 1079,
        515, 2136, 497, 3753, 3596, 3101, 517, 42, 4071, 3581, 3590, 3128, 506, 3588, 520, 1542, 3570, 3589,
        4050, 3456, 3571, 3126, 524, 3594, 3328, 3595, 4083, 1014, 3720, 3329, 3586, 262, 2565, 1245, 2572,
        2571, 3159, 1549, 2558, 2566, 2556, 2573
    ],
    7: [
        3248, 723, 4059, 893, 1092, 3002, 29, 3129, 1897, 2542, 690, 756, 789, 921, 888, 822, 855, 1020,
        657, 558, 426, 294, 360, 162, 228, 459, 2029, 327, 2023, 393, 1977, 456, 2003, 720, 230, 357, 461,
        582, 1753, 621, 1945, 224, 71, 323, 453, 717, 1253, 2210, 2255, 3266, 394, 289, 441, 619, 1575,
        1115, 1482, 192, 525, 447
    ],
}


def rows_of(target: Case, seed: int, n: int, sources=(), **options) -> list[int]:
    space, fs, times = target.replay()
    s = make_strategy("default", space, fs, seed=seed, ctx=Context(problem=target.landscape.problem),
                      sources=sources, **options)
    rows = []
    for _ in range(n):
        (p,) = s.ask(1)
        r = fs.row(p)
        rows.append(r)
        t = float(times[r])
        s.tell([(p, None if math.isnan(t) else t)])
    return rows


@pytest.fixture(scope="module")
def pnpoly() -> Case:
    return Case.load(str(PNPOLY), 60)


def test_without_sources_default_proposes_exactly_what_it_did_before(pnpoly):
    for seed, before in BEFORE.items():
        assert rows_of(pnpoly, seed, 60) == before


def test_transfer_false_ignores_the_sources(pnpoly):
    other = Case.load(str(LANDSCAPES / "pnpoly_RTX_3060_laptop.json.gz"), 60)
    sources = [from_landscape(other.landscape, pnpoly.landscape.problem, "NVIDIA GeForce RTX 2080 Ti")]
    assert rows_of(pnpoly, 0, 60, sources, transfer=False) == BEFORE[0]
    assert rows_of(pnpoly, 0, 60, sources) != BEFORE[0]


def int8(shape: str) -> Case:
    return Case.load(str(H100 / INT8.format(shape)), 100)


def test_distances_follow_sizes_dtype_and_gpu():
    a = Problem.gemm(64, 4096, 4096, "int8")
    assert problem_distance(a, a) == 0
    assert problem_distance(a, Problem.gemm(128, 4096, 4096, "int8")) == pytest.approx(1.0)
    assert problem_distance(a, Problem.gemm(64, 4096, 4096, "bf16")) == pytest.approx(3.0)
    assert device_distance("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3") == 0
    assert device_distance("NVIDIA RTX A4000", "NVIDIA RTX A6000") == 1
    assert device_distance("NVIDIA RTX A4000", "AMD Radeon PRO W6600") == 2


def test_the_nearest_sources_winners_come_first():
    target, near, far = int8("64x4096x11008"), int8("64x4096x4096"), int8("256x4096x4096")
    problem = target.landscape.problem
    sources = [from_landscape(far.landscape, problem, None), from_landscape(near.landscape, problem, None)]
    assert sources[1].distance < sources[0].distance
    space, fs, times = target.replay()
    s = make_strategy("default", space, fs, seed=0, ctx=Context(problem=problem), sources=sources)
    assert not s.transfer.lone_source()  # two sources: their winners come before plain default's first points
    first, second = s.ask(1)[0], s.ask(1)[0]
    assert near.landscape.lookup(first).time_ms == near.landscape.optimum_ms  # the nearest source's winner
    # then the next source's fastest that this shape can run (its own winner, unless that was the first)
    ranked = sorted((r.time_ms, key) for key, r in far.landscape.entries.items() if key in target.landscape.entries)
    assert far.landscape.key(second) == next(k for _, k in ranked if k != far.landscape.key(first))
    # the transferred winner is within 2% of this shape's optimum, which plain default takes 20-odd evaluations for
    assert target.optimum / float(times[fs.row(first)]) >= 0.98


def test_a_batch_asked_before_any_result_takes_the_checks_then_the_winner_then_what_the_prior_ranks_best():
    # the GPU evaluator asks a compile pool's worth of points at once, before any result is told
    target, near = int8("64x4096x11008"), int8("64x4096x4096")
    problem = target.landscape.problem
    space, fs, times = target.replay()
    s = make_strategy("default", space, fs, seed=0, ctx=Context(problem=problem),
                      sources=[from_landscape(near.landscape, problem, None)])
    batch = s.ask(14)
    assert len(batch) == 14 and len({space.key(p) for p in batch}) == 14
    assert all(p in fs for p in batch)
    assert [fs.row(p) for p in batch[:5]] == rows_of(target, 0, 5)  # plain default's first points: the checks
    assert near.landscape.lookup(batch[5]).time_ms == near.landscape.optimum_ms
    s.tell([(p, float(times[fs.row(p)])) for p in batch])
    assert len(s.ask(14)) == 14  # and the search goes on from what was told


def test_a_landscape_of_another_kernel_is_no_source(pnpoly):
    target = int8("64x4096x11008")
    other = from_landscape(pnpoly.landscape, target.landscape.problem, None)
    space, fs, _ = target.replay()
    s = make_strategy("default", space, fs, seed=0, ctx=Context(problem=target.landscape.problem), sources=[other])
    assert s.prior is None
    assert rows_of(target, 0, 30, [other]) == rows_of(target, 0, 30)


def shuffled(source: Source, seed: int = 0) -> Source:
    values = [v for _, v in source.results]
    np.random.default_rng(seed).shuffle(values)
    return Source("shuffled", tuple((p, v) for (p, _), v in zip(source.results, values, strict=True)), 0.0)


def _misleading(job: tuple[str, str, int]) -> tuple[float, float, bool]:
    """One seed of a target beside a shuffled source: evaluations to 0.99 without it and with it, and whether
    fifteen results found it out."""
    shape, source_shape, seed = job
    target = int8(shape)
    bad = shuffled(from_landscape(int8(source_shape).landscape, target.landscape.problem, None))
    # each run stops once it has reached 0.99 of the optimum: its evaluations to 0.99 are the whole run's
    without = run_metrics(run_evotune(target, "default", seed, 100, until_fraction=0.99), target, 100)["evals_to_99"]
    with_bad = run_metrics(run_evotune(target, "default", seed, 100, sources=[bad], until_fraction=0.99), target,
                           100)["evals_to_99"]
    space, fs, times = target.replay()
    s = make_strategy("default", space, fs, seed=seed, ctx=Context(problem=target.landscape.problem), sources=[bad])
    for _ in range(15):
        (p,) = s.ask(1)
        s.tell([(p, float(times[fs.row(p)]))])
    return without, with_bad, not s.transfer.in_use


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
def test_a_misleading_source_costs_at_most_ten_percent_more_evaluations():
    """Times shuffled, at distance 0 (the most trusted a source can be): the checks drop it. The seeds run side by
    side (processes forked from this one, as tests/test_transfer_floor.py runs them)."""
    jobs = [(shape, source_shape, seed)
            for shape, source_shape in [("64x4096x11008", "64x4096x4096"), ("256x4096x4096", "256x4096x11008"),
                                        ("16x4096x4096", "16x4096x11008")]
            for seed in range(8)]
    with multiprocessing.get_context("fork").Pool(max(1, min(4, os.cpu_count() or 1))) as pool:
        without, with_bad, dropped = zip(*pool.map(_misleading, jobs, chunksize=1), strict=True)
    assert sum(dropped) >= 22  # of 24: after fifteen results, the shuffled times have been found out
    assert statistics.mean(with_bad) <= 1.10 * statistics.mean(without)


def test_transfer_option_is_typed():
    target = int8("64x4096x4096")
    space, fs, _ = target.replay()
    with pytest.raises(OptionError, match="transfer"):
        make_strategy("default", space, fs, transfer="yes")


def run_h100(tmp_path, name: str, options: str = "", shapes=("64x4096x4096", "64x4096x11008"),
             top: str = "") -> list[dict]:
    from evotune.cli import main

    files = [H100 / INT8.format(shape) for shape in shapes]
    exp = tmp_path / f"{name}.toml"
    exp.write_text(f"""
name = "{name}"
space = "cute_hopper_gemm"
{top}
[oracle]
kind = "replay"
landscapes = {[str(p) for p in files]}
[strategy]
name = "default"
{f"options = {{ {options} }}" if options else ""}
[budget]
trials = 12
[storage]
url = "journal:{tmp_path / (name + '.journal')}"
[outputs]
best = "{tmp_path / (name + '_best.json')}"
plots = "{tmp_path / 'plots'}"
""")
    assert main(["run", str(exp), "--no-progress"]) == 0
    import json

    return json.loads((tmp_path / f"{name}_best.json").read_text())


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
def test_run_transfers_from_the_experiments_own_studies_and_says_so(tmp_path, capsys):
    best = {b["problem_key"]: b for b in run_h100(tmp_path, "tx", top="sources = []")}
    # the first problem had nothing to learn from; the second learnt from the first one's study
    assert best["gemm_int8_tn_64x4096x4096"]["sources"] == []
    assert [s["name"] for s in best["gemm_int8_tn_64x4096x11008"]["sources"]] == ["study:tx/gemm_int8_tn_64x4096x4096"]
    assert "transferred from 1 source, nearest: study:tx/gemm_int8_tn_64x4096x4096" in capsys.readouterr().out
    from evotune.reporting.plots import load_runs

    runs = {r.problem_key: r for r in load_runs(f"journal:{tmp_path / 'tx.journal'}", "tx")}
    assert runs["gemm_int8_tn_64x4096x11008"].sources["default"][0]["name"] == "study:tx/gemm_int8_tn_64x4096x4096"
    assert runs["gemm_int8_tn_64x4096x4096"].sources == {}
    off = {b["problem_key"]: b for b in run_h100(tmp_path, "off", "transfer = false")}  # shipped ones neither
    assert off["gemm_int8_tn_64x4096x11008"]["sources"] == []


@pytest.mark.slow  # about 1.6 s: kept out of the fast lane (its 3-minute margin)
def test_an_experiment_names_landscapes_as_sources(tmp_path):
    source = H100 / INT8.format("64x4096x4096")
    (got,) = run_h100(tmp_path, "named", shapes=("64x4096x11008",), top=f"sources = [{str(source)!r}]")
    assert [s["name"] for s in got["sources"]] == ["landscape:cute_hopper_gemm_gemm_int8_tn_64x4096x4096"]
    assert got["fraction_of_optimum"] >= 0.98  # its winner, measured first


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
def test_without_a_sources_key_the_shipped_landscapes_of_the_space_are_the_sources_but_never_the_target(tmp_path):
    from evotune.search.transfer import shipped_landscapes

    target = "cute_hopper_gemm_gemm_int8_tn_64x4096x11008"
    (got,) = run_h100(tmp_path, "shipped", shapes=("64x4096x11008",))
    names = {s["name"] for s in got["sources"]}
    assert "landscape:cute_hopper_gemm_gemm_int8_tn_64x4096x4096" in names
    assert f"landscape:{target}" not in names  # the file the run is measured on is never a source
    # the space's shipped landscapes within reach, and no other space's (the Triton ones)
    space = run_space("cute_hopper_gemm")
    shipped = {f"landscape:{p.name.removesuffix('.json.gz')}" for p in shipped_landscapes(space)}
    assert len(shipped) == 43 and names <= shipped and not any("triton" in n for n in names)
    assert got["fraction_of_optimum"] >= 0.98
    (off,) = run_h100(tmp_path, "none", shapes=("64x4096x11008",), top="sources = []")
    assert off["sources"] == []


@pytest.mark.parametrize("hardware", ["H100", None])
def test_a_replayed_landscape_is_never_its_own_source_however_the_experiment_names_the_gpu(tmp_path, hardware):
    """A user's copy of a shipped landscape, replayed for the GPU table's "H100" (or, with no ``hardware``, the
    landscape's own device): the shipped file of the very problem, recorded on an "NVIDIA H100 80GB HBM3", is the
    answer, not a source."""
    import shutil

    from evotune.running.experiment import load_experiment
    from evotune.running.session import transfer_sources
    from evotune.running.targets import resolve_targets
    from evotune.storage.study import make_storage

    name = INT8.format("64x4096x11008")
    shutil.copy(H100 / name, tmp_path / name)
    exp_path = tmp_path / "own.toml"
    exp_path.write_text(f"""
space = "cute_hopper_gemm"
{f'hardware = "{hardware}"' if hardware else ""}
[oracle]
kind = "replay"
landscapes = ["{name}"]
[strategy]
name = "default"
[budget]
trials = 5
""")
    exp = load_experiment(exp_path)
    (target,) = resolve_targets(exp)
    sources = transfer_sources(exp, target, make_storage(f"sqlite:///{tmp_path / 'own.db'}"), "default", {})
    names = {s.name for s in sources}
    assert "landscape:cute_hopper_gemm_gemm_int8_tn_64x4096x4096" in names  # another shape: a source
    assert f"landscape:{name.removesuffix('.json.gz')}" not in names
    nearest = min(sources, key=lambda s: s.distance)
    assert nearest.distance == pytest.approx(problem_distance(Problem.gemm(64, 4096, 4096, "int8"),
                                                              target.problem))  # the same GPU: no device distance


def test_gpu_names_compare_as_the_gpu_table_knows_them():
    assert device_distance("H100", "NVIDIA H100 80GB HBM3") == 0
    assert device_distance("h100", "H100_SXM") == 0
    assert device_distance("NVIDIA H200", "H200") == 0
    assert device_distance("H100", "NVIDIA H200") == 1
    assert device_distance("A100", "NVIDIA A100-SXM4-80GB") == 0


def run_space(name: str):
    from evotune.core.plugins import load_space

    return load_space(name)


def test_a_missing_source_is_refused_before_anything_runs(tmp_path):
    from evotune.running.experiment import ExperimentError, load_experiment

    exp = tmp_path / "bad.toml"
    exp.write_text(f"""
space = "cute_hopper_gemm"
sources = ["nowhere.json.gz"]
[oracle]
kind = "replay"
landscapes = [{str(H100 / INT8.format("64x4096x4096"))!r}]
[strategy]
name = "default"
[budget]
trials = 5
""")
    with pytest.raises(ExperimentError, match=r"sources: no such file 'nowhere\.json\.gz'"):
        load_experiment(exp)


def test_the_tuning_caches_winner_of_a_nearby_shape_is_tried_first():
    from evotune.core.plugins import load_space
    from evotune.search.transfer import from_cache

    target = int8("64x4096x11008")
    space, fs, _ = target.replay()
    config = {"tile_m": 64, "tile_n": 128, "cluster": "1x1", "swizzle": 1, "raster": "n", "stages": 5}
    entries = [{"space": "cute_hopper_gemm", "problem_key": "gemm_int8_tn_64x4096x4096", "hardware": "H100",
                "problem": Problem.gemm(64, 4096, 4096, "int8").to_dict(), "config": config, "time_ms": 0.0144},
               {"space": "triton_matmul", "problem_key": "gemm_int8_tn_64x4096x4096", "hardware": "H100",
                "problem": Problem.gemm(64, 4096, 4096, "int8").to_dict(), "config": {}, "time_ms": 0.01}]
    sources = from_cache(entries, load_space("cute_hopper_gemm"), target.landscape.problem, "H100")
    assert [s.name for s in sources] == ["cache:gemm_int8_tn_64x4096x4096"]  # the other space's entry is not one
    s = make_strategy("default", space, fs, seed=0, ctx=Context(problem=target.landscape.problem), sources=sources)
    assert space.to_storage(s.ask(1)[0]) == config

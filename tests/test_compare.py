"""``evotune compare``: its files, its definitions, the exact random baseline, determinism, bad arguments."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math

import numpy as np
import pytest
from conftest import GEMM, PNPOLY, ROOT

from evotune.cli import main
from evotune.reporting.compare import (
    KT_CAVEAT,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    Case,
    Run,
    best_so_far,
    evals_to,
    expected_random_best,
    fraction_curve,
    run_metrics,
    run_score,
)

DATA = ROOT / "tests" / "data"

# A 3 x 3 space: 8 recorded points (a=3, b=4 is missing), 2 of them failed, 6 valid times.
TINY_TIMES = {(1, 1): 4.0, (1, 2): 2.0, (1, 4): "RuntimeFailedConfig", (2, 1): 3.0, (2, 2): 1.0,
              (2, 4): 6.0, (3, 1): "CompilationFailedConfig", (3, 2): 2.5}


@pytest.fixture
def tiny(tmp_path):
    cache = {f"{a},{b}": {"a": a, "b": b, "time": t} for (a, b), t in TINY_TIMES.items()}
    doc = {"device_name": "toy", "kernel_name": "toy", "problem_size": [8], "tune_params_keys": ["a", "b"],
           "tune_params": {"a": [1, 2, 3], "b": [1, 2, 4]}, "cache": cache}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(doc))
    return path


def compare_cli(*args: str) -> int:
    return main(["compare", *args])


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.slow  # about 1.8 s: kept out of the fast lane (its 3-minute margin)
def test_files_have_exactly_the_specified_columns(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    rc = compare_cli("--landscape", str(tiny), "--landscape", str(GEMM), "--strategy", "ga", "--strategy", "random",
                     "--strategy", "exhaustive", "--budget", "3", "--budget", "8", "--repeats", "2", "--seed", "5",
                     "--out", str(out))
    assert rc == 0
    summary, runs = read_csv(out / "summary.csv"), read_csv(out / "runs.csv")
    assert summary[0] == SUMMARY_COLUMNS == ["landscape", "strategy", "budget", "repeats", "median_fraction",
                                             "p25_fraction", "p75_fraction", "median_evals_to_95",
                                             "median_evals_to_99", "score"]
    assert runs[0] == RUN_COLUMNS == ["landscape", "strategy", "budget", "seed", "fraction", "evals_to_95",
                                      "evals_to_99", "best_ms", "optimum_ms", "ask_ms_mean", "ask_ms_max"]
    assert len(summary) - 1 == 2 * 3 * 2 and len(runs) - 1 == 2 * 3 * 2 * 2
    assert {r[0] for r in summary[1:]} == {"tiny", "gemm_RTX_2080_Ti"}
    assert {r[3] for r in runs[1:]} == {"5", "6"}  # seed + r
    assert (out / "tiny.png").stat().st_size > 0 and (out / "gemm_RTX_2080_Ti.png").stat().st_size > 0
    assert KT_CAVEAT in (out / "README.md").read_text()
    printed = capsys.readouterr().out
    assert KT_CAVEAT not in printed and "exhaustive" in printed and "gemm_RTX_2080_Ti" in printed  # no kt: asked for


@pytest.mark.slow  # about 1.9 s: kept out of the fast lane (its 3-minute margin)
def test_deterministic_for_a_seed(tmp_path):
    def run(out, seed="11"):
        assert compare_cli("--landscape", str(PNPOLY), "--strategy", "ga", "--strategy", "tpe", "--strategy", "random",
                           "--budget", "30", "--budget", "10", "--repeats", "2", "--seed", seed, "--out", str(out)) == 0
        timings = [RUN_COLUMNS.index("ask_ms_mean"), RUN_COLUMNS.index("ask_ms_max")]
        runs = [[v for i, v in enumerate(row) if i not in timings] for row in read_csv(out / "runs.csv")]
        return (out / "summary.csv").read_bytes(), runs

    first, again, other = run(tmp_path / "a"), run(tmp_path / "b"), run(tmp_path / "c", seed="12")
    assert first == again  # every column but the ask_ms timings
    assert first[1] != other[1]


def test_evals_to_and_fraction_definitions(tiny):
    nan = math.nan
    best = best_so_far([nan, 5.0, 2.0, 1.04, 1.0], 7)  # the run stopped after 5: it keeps its best
    assert np.isnan(best[0]) and list(best[1:]) == [5.0, 2.0, 1.04, 1.0, 1.0, 1.0]
    frac = fraction_curve(best, 1.0)
    assert frac[0] == 0.0 and frac[-1] == 1.0
    assert evals_to(frac, 0.95) == 4 and evals_to(frac, 0.99) == 5  # 1/1.04 = 0.9615...
    assert evals_to(frac[:4], 0.99) == 5 == 4 + 1  # never reached within a budget of 4: budget + 1
    assert evals_to(frac[:3], 0.95) == 4
    assert evals_to(np.zeros(6), 0.95) == 7

    target = Case.load(str(tiny), 8)
    assert (target.n_points, target.optimum, target.worst) == (8, 1.0, 6.0)
    m = run_metrics(Run(np.array([nan, nan, 6.0]), np.array([0.1, 0.3, 0.2])), target, 3)
    assert m["fraction"] == pytest.approx(1 / 6) and m["evals_to_95"] == m["evals_to_99"] == 4
    assert m["best_ms"] == 6.0 and m["optimum_ms"] == 1.0 and m["ask_ms_max"] == 0.3
    m = run_metrics(Run(np.array([nan, nan]), np.array([0.1, 0.1])), target, 2)
    assert m["fraction"] == 0.0 and m["best_ms"] is None and m["evals_to_95"] == 3


def test_a_run_stopped_at_a_fraction_of_the_optimum_is_the_whole_runs_prefix_and_scores_alike(tiny):
    """``until_fraction``: the run ends at its first evaluation that reaches that fraction of the optimum; stopped at
    the optimum itself (1.0), every metric at every budget is the whole run's."""
    from evotune.reporting.compare.runs import run_evotune

    target = Case.load(str(tiny), 8)
    for seed in range(6):
        whole = run_evotune(target, "random", seed, 8)
        reached = [i for i, t in enumerate(whole.times) if target.optimum / t >= 0.45]  # 2.0 or 1.0
        at_half = run_evotune(target, "random", seed, 8, until_fraction=0.45)
        assert np.array_equal(at_half.times, whole.times[:reached[0] + 1], equal_nan=True)  # nan: a failed point
        at_optimum = run_evotune(target, "random", seed, 8, until_fraction=1.0)
        stop = list(whole.times).index(1.0) + 1
        assert np.array_equal(at_optimum.times, whole.times[:stop], equal_nan=True) and len(whole.times) == 8
        for budget in (2, 5, 8):
            got, want = run_metrics(at_optimum, target, budget), run_metrics(whole, target, budget)
            for metric in ("fraction", "evals_to_95", "evals_to_99", "best_ms", "score"):
                assert got[metric] == want[metric], (seed, budget, metric)


def test_exhaustive_reaches_the_optimum_at_full_budget(tiny, tmp_path):
    out = tmp_path / "out"
    assert compare_cli("--landscape", str(tiny), "--strategy", "exhaustive", "--strategy", "ga", "--budget", "8",
                       "--budget", "20", "--repeats", "3", "--out", str(out)) == 0
    rows = [dict(zip(RUN_COLUMNS, r, strict=True)) for r in read_csv(out / "runs.csv")[1:]]
    assert len(rows) == 2 * 2 * 3
    for r in rows:  # 8 points: every strategy has seen them all, failed ones included
        assert float(r["fraction"]) == 1.0 and r["best_ms"] == r["optimum_ms"] == "1"
        assert int(r["evals_to_99"]) <= 8


def _brute_force_expectation(times: list[float], n_points: int, n: int) -> float:
    """Every subset of n points, equally likely; a subset of failed points counts as the slowest valid time."""
    points = [*times, *([math.nan] * (n_points - len(times)))]
    worst = max(times)
    bests = []
    for subset in itertools.combinations(points, min(n, n_points)):
        valid = [t for t in subset if not math.isnan(t)]
        bests.append(min(valid) if valid else worst)
    return float(np.mean(bests))


def test_expected_random_best_matches_brute_force_and_simulation():
    times = [t for t in TINY_TIMES.values() if not isinstance(t, str)] + [2.0]  # a tie, for good measure
    n_points = 10  # 7 valid, 3 failed
    exact = expected_random_best(times, n_points, 12)
    assert exact[0] == pytest.approx((sum(times) + 3 * max(times)) / 10)  # one point: the mean, failures as worst
    for n in range(1, 13):
        assert exact[n - 1] == pytest.approx(_brute_force_expectation(times, n_points, n), rel=1e-12)
    assert exact[-1] == exact[9] == min(times)  # the whole landscape holds the optimum

    rng = np.random.default_rng(0)  # and a plain simulation of random sampling without replacement
    pool = np.array([*times, *[np.inf] * 3])
    for n in (1, 2, 4):
        picks = np.sort(rng.random((40_000, n_points)).argsort(axis=1)[:, :n], axis=1)
        best = pool[picks].min(axis=1)
        best[np.isinf(best)] = max(times)
        assert exact[n - 1] == pytest.approx(best.mean(), rel=0.02)


def test_random_search_scores_zero_on_average():
    """The score's 0 is uniform random search: its mean over every order of the points is exactly 0."""
    times = [3.0, 1.0, 2.5, math.nan, 4.0, math.nan]
    valid = [t for t in times if not math.isnan(t)]
    rnd = expected_random_best(valid, len(times), 6)
    scores = [run_score(best_so_far(order, 4), rnd, 1.0, 4.0) for order in itertools.permutations(times)]
    assert np.mean(scores) == pytest.approx(0.0, abs=1e-12)
    assert run_score(np.array([1.0, 1.0, 1.0]), rnd, 1.0, 4.0) == pytest.approx(1.0)


@pytest.mark.parametrize("args, needle", [
    ([], "--landscape"),
    (["--landscape", "{tiny}", "--budget", "5", "--out", "{out}"], "--strategy"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--out", "{out}"], "--budget"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "5"], "--out"),
    (["--landscape", "{tiny}", "--strategy", "nope", "--budget", "5", "--out", "{out}"], "unknown 'nope'"),
    (["--landscape", "{tiny}", "--strategy", "kt:nope", "--budget", "5", "--out", "{out}"], "kt:nope"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "0", "--out", "{out}"], "--budget"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "ten", "--out", "{out}"], "--budget"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "5", "--repeats", "0", "--out", "{out}"], "--repeats"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "5", "--seed", "-1", "--out", "{out}"], "--seed"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--strategy", "ga", "--budget", "5", "--out", "{out}"], "twice"),
    (["--landscape", "{tiny}", "--landscape", "{tiny}", "--strategy", "ga", "--budget", "5", "--out", "{out}"],
     "named"),
    (["--landscape", "{missing}", "--strategy", "ga", "--budget", "5", "--out", "{out}"], "cannot read"),
    (["--landscape", "{tiny}", "--strategy", "ga", "--budget", "5", "--out", "{tiny}"], "not a folder"),
])
def test_bad_arguments_end_with_one_line_and_exit_2(args, needle, tiny, tmp_path, capsys):
    paths = {"tiny": str(tiny), "out": str(tmp_path / "out"), "missing": str(tmp_path / "missing.json")}
    assert compare_cli(*(a.format(**paths) for a in args)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evotune: error: ") and needle in lines[0], captured.err
    assert not (tmp_path / "out").exists()


def test_optuna_gp_without_torch_is_named_unavailable(tiny, tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed: optuna-gp is available")
    assert compare_cli("--landscape", str(tiny), "--strategy", "optuna-gp", "--budget", "5",
                       "--out", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "optuna-gp is unavailable here: needs torch" in err


def test_kernel_tuner_strategies_in_simulation_mode(tmp_path):
    pytest.importorskip("kernel_tuner")

    def run(out):
        assert compare_cli("--landscape", str(PNPOLY), "--strategy", "kt:genetic_algorithm", "--strategy",
                           "kt:simulated_annealing", "--strategy", "kt:random_sample", "--budget", "10", "--budget",
                           "20", "--repeats", "2", "--out", str(out)) == 0
        return read_csv(out / "summary.csv"), read_csv(out / "runs.csv")

    summary, runs = run(tmp_path / "a")
    assert summary[0] == SUMMARY_COLUMNS and len(summary) - 1 == 3 * 2 and len(runs) - 1 == 3 * 2 * 2
    assert {r[1] for r in summary[1:]} == {"kt:genetic_algorithm", "kt:simulated_annealing", "kt:random_sample"}
    rows = [dict(zip(RUN_COLUMNS, r, strict=True)) for r in runs[1:]]
    for r in rows:  # Kernel Tuner only visits error-free entries: every run has a valid best
        assert 0.0 < float(r["fraction"]) <= 1.0 and r["best_ms"] != ""
    again_summary, _ = run(tmp_path / "b")
    assert again_summary == summary  # seeded: the same evaluations for the same seeds


def test_a_fixed_seed_comparison_gives_the_recorded_rows(tmp_path):
    """The rows of tests/data/compare_pnpoly_*.csv, as recorded: the comparison's behaviour has not moved."""
    strategies = ["default", "ga", "random", "kt:genetic_algorithm"]
    if importlib.util.find_spec("kernel_tuner") is None:
        strategies.remove("kt:genetic_algorithm")  # the rows of evotune's strategies are still checked
    out = tmp_path / "out"
    assert compare_cli("--landscape", str(PNPOLY), *(a for s in strategies for a in ("--strategy", s)),
                       "--budget", "25", "--budget", "50", "--repeats", "3", "--seed", "0", "--out", str(out)) == 0
    timings = [RUN_COLUMNS.index("ask_ms_mean"), RUN_COLUMNS.index("ask_ms_max")]
    runs = [[v for i, v in enumerate(row) if i not in timings] for row in read_csv(out / "runs.csv")]
    expected_summary = read_csv(DATA / "compare_pnpoly_summary.csv")
    expected_runs = read_csv(DATA / "compare_pnpoly_runs.csv")
    assert read_csv(out / "summary.csv") == [r for r in expected_summary if r[1] in ("strategy", *strategies)]
    assert runs == [r for r in expected_runs if r[1] in ("strategy", *strategies)]


def test_kernel_tuner_seeding_is_repeatable_and_restores_the_global_state():
    """kt: strategies are seeded through process-wide generators; nothing outside the run may notice."""
    import random

    import scipy.stats.qmc as qmc

    from evotune.reporting.compare.kernel_tuner_sim import seeded_globals

    def draws():
        return random.random(), float(np.random.random()), qmc.LatinHypercube(d=2).random(3).tolist()

    random.seed(123)
    np.random.seed(123)
    py_state, np_state, sampler = random.getstate(), np.random.get_state(), qmc.LatinHypercube
    with seeded_globals(7):
        first = draws()
        assert qmc.LatinHypercube is not sampler
    with pytest.raises(RuntimeError), seeded_globals(7):
        assert draws() == first  # the same seed, the same draws, the Latin hypercube's included
        raise RuntimeError("Kernel Tuner failed")  # restored on the way out of an error too
    assert random.getstate() == py_state and qmc.LatinHypercube is sampler
    restored = np.random.get_state()
    assert restored[0] == np_state[0] and np.array_equal(restored[1], np_state[1]) and restored[2:] == np_state[2:]

"""What ``best`` prints and exports: only what is known of a problem; and ``compare``'s Kernel Tuner caveat."""

from __future__ import annotations

import json

import optuna
import pytest
from conftest import GEMM, PNPOLY
from rich.console import Console

from evotune.cli import main
from evotune.core.landscape import load_landscape
from evotune.core.problem import Problem
from evotune.reporting.report import Best, best_table, collect_best, export_best, throughput


def table_text(rows: list[Best]) -> str:
    console = Console(width=200, record=True)
    console.print(best_table(rows))
    return console.export_text()


def cell(rows: list[Best], column: str) -> str | None:
    """The first row's text in ``column``; None where the table has no such column."""
    lines = table_text(rows).splitlines()
    header = [c.strip() for c in next(x for x in lines if "┃" in x).split("┃")]
    row = next(x for x in lines if rows[0].problem_key in x and "│" in x)
    return row.split("│")[header.index(column)].strip() if column in header else None


def tflops_cell(rows: list[Best]) -> str | None:
    return cell(rows, "TFLOP/s (% peak)")


def test_a_recorded_kernel_is_not_exported_as_a_bf16_gemm(tmp_path):
    """The quickstart's Xgemm landscape (Kernel Tuner) is a kernel name, a problem size and its fp32, nothing more."""
    problem = load_landscape(GEMM).problem
    assert problem.kind != "gemm"
    assert problem.to_dict() == {"kind": problem.kind, "label": "4096x4096", "dtype": "fp32", "extra": {}}
    assert Problem.from_dict(problem.to_dict()) == problem
    assert Problem.from_dict(Problem.gemm(64, 128, 256, "int8").to_dict()) == Problem.gemm(64, 128, 256, "int8")
    row = Best("q", problem.key, problem.to_dict(), "landscape:x", {"MWG": 64}, 11.5, "s", 0, "ga", 0, 10)
    (exported,) = json.loads(export_best([row], tmp_path / "best.json").read_text())
    assert exported["problem"] == {"kind": "Xgemm", "label": "4096x4096", "dtype": "fp32", "extra": {}}
    assert exported["problem_key"] == "Xgemm_4096x4096" and exported["tflops"] is None


def test_throughput_is_unknown_without_a_flop_count_and_never_shown_as_zero():
    kernel = load_landscape(PNPOLY).problem
    assert kernel.flops is None and throughput(kernel, 0.02, 989.4, 3000.0) == (None, None, None)
    row = Best("e", kernel.key, kernel.to_dict(), "s", {}, 0.02, "s", 0, "random", 0, 10)
    assert tflops_cell([row]) is None  # no row has one: the column is left out
    gemm = Problem.gemm(64, 64, 64, "fp32")
    other = Best("e", gemm.key, gemm.to_dict(), "s", {}, 0.05, "s", 0, "random", 0, 10, tflops=0.0105)
    assert tflops_cell([row, other]) == "-"
    # a small GEMM on the CPU: a real, small throughput, printed with its digits rather than as 0
    small = Problem.gemm(64, 64, 64, "fp32")
    tflops, _, _ = throughput(small, 0.05, None, None)
    row = Best("e", small.key, small.to_dict(), "faults", {}, 0.05, "s", 0, "exhaustive", 0, 10, tflops=tflops)
    assert tflops_cell([row]) == "0.0105"
    big = Problem.gemm(4096, 4096, 4096)
    row = Best("e", big.key, big.to_dict(), "s", {}, 0.176, "s", 0, "ga", 0, 10, "H100", "gpu",
               tflops=781.0, pct_peak=78.9)
    assert tflops_cell([row]) == "781 (79%)"


def compare(tmp_path, capsys, *strategies: str) -> str:
    """What ``evotune compare`` prints on its standard output, for a small run on pnpoly."""
    args = ["compare", "--landscape", str(PNPOLY), "--budget", "5", "--repeats", "1", "--out", str(tmp_path)]
    for s in strategies:
        args += ["--strategy", s]
    assert main(args) == 0
    return capsys.readouterr().out


def test_compare_prints_the_kernel_tuner_caveat_only_for_kernel_tuner_strategies(tmp_path, capsys):
    from evotune.reporting.compare import KT_CAVEAT

    out = compare(tmp_path / "evotune", capsys, "random", "ga")
    assert "Strategy comparison" in out  # the summary table was printed
    assert "tune_cache" not in out and KT_CAVEAT not in out
    pytest.importorskip("kernel_tuner")
    assert KT_CAVEAT in compare(tmp_path / "kt", capsys, "random", "kt:random_sample")


# -- several spaces on one problem ----------------------------------------------------------
def _study(storage, space: str, times: list[float], confirmation: dict | None = None) -> None:
    problem = Problem.gemm(64, 4096, 11008, "bf16")
    study = optuna.create_study(storage=storage, study_name=f"x/{problem.key}/{space}/default/seed0")
    attrs = {"experiment": "x", "problem_key": problem.key, "problem": problem.to_dict(), "space": space,
             "strategy": "default", "seed": 0, "hardware": "H100", "oracle": "gpu",
             "baselines": {"torch.matmul": {"time_ms": 0.050}}}
    if confirmation is not None:
        attrs["confirmation"] = confirmation
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    for i, t in enumerate(times):
        study.add_trial(optuna.trial.create_trial(params={"tile": i}, value=t, user_attrs={"key": f"tile={i}"},
                                                  distributions={"tile": optuna.distributions.IntDistribution(0, 99)}))


def test_the_winner_is_the_fastest_space_and_every_space_best_is_shown(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = optuna.storages.RDBStorage(url)
    _study(storage, "cute_hopper_gemm", [0.060, 0.052])
    _study(storage, "cutlass_sm90_gemm", [0.070, 0.045, 0.047])
    _study(storage, "triton_matmul", [0.080])
    (best,) = collect_best(url, "x")
    assert best.space == "cutlass_sm90_gemm" and best.time_ms == pytest.approx(0.045)
    assert list(best.by_space) == ["cutlass_sm90_gemm", "cute_hopper_gemm", "triton_matmul"]
    assert best.by_space["cute_hopper_gemm"] == pytest.approx(0.052)
    doc = json.loads(export_best([best], tmp_path / "best.json").read_text())[0]
    assert doc["by_space"]["triton_matmul"] == pytest.approx(0.080)
    from rich.console import Console

    console = Console(record=True, width=220)
    console.print(best_table([best]))
    text = console.export_text()
    assert "each space's best: cutlass_sm90_gemm 0.045 ms (1.00x), cute_hopper_gemm 0.052 ms (1.16x)" in text


def test_a_space_best_is_its_confirmed_time_where_it_was_confirmed(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = optuna.storages.RDBStorage(url)
    record = {"configs": {"tile=1": {"tile": 1}}, "baselines": ["torch.matmul"], "finished": "2026-11-24T00:00:00",
              "items": {"tile=1": {"median_ms": 0.0500, "ci95_ms": [0.0499, 0.0501], "search_ms": 0.045},
                        "torch.matmul": {"median_ms": 0.0510, "ci95_ms": [0.0509, 0.0511]}}}
    _study(storage, "cutlass_sm90_gemm", [0.070, 0.045], confirmation=record)
    _study(storage, "cute_hopper_gemm", [0.052])
    (best,) = collect_best(url, "x")
    assert best.by_space == {"cute_hopper_gemm": pytest.approx(0.052), "cutlass_sm90_gemm": pytest.approx(0.050)}


# -- the table in an 80-column terminal ----------------------------------------------------------------------
def narrow(rows: list[Best], title: str = "Best configurations: q") -> list[str]:
    console = Console(width=80, record=True)
    console.print(best_table(rows, title))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    return lines


def replay_row(space: str = "landscape:gemm_RTX_2080_Ti") -> Best:
    problem = load_landscape(GEMM).problem
    return Best("quickstart", problem.key, problem.to_dict(), space, {"MWG": 128}, 11.48, "s", 3, "default", 0,
                1800, optimum_ms=11.48)


def header(lines: list[str]) -> str:
    return " ".join(line for line in lines if "┃" in line)


def test_a_replay_table_leaves_out_empty_columns_and_names_its_one_space_once():
    lines = narrow([replay_row()])
    head = header(lines)
    for gone in ("confirmed", "baseline", "TFLOP/s", "HBM", "space "):
        assert gone not in head, head
    assert sum("landscape:gemm_RTX_2080_Ti" in line for line in lines) == 1  # whole, on one line: the title's
    assert "all trials" in head and "all trials: every strategy and seed of the problem together" in "\n".join(lines)
    (row,) = [line for line in lines if "Xgemm_4096x4096 " in line and "│" in line]
    assert [c.strip() for c in row.split("│")[1:-1]] == ["Xgemm_4096x4096", "11.48", "100.0%", "1800", "default s0"]


def test_a_cpu_oracle_table_keeps_the_throughput_and_drops_the_rest():
    small = Problem.gemm(64, 64, 64, "fp32")
    tflops, _, _ = throughput(small, 0.05, None, None)
    rows = [Best("faults_cpu", small.key, small.to_dict(), "faults", {"tile": 8}, 0.05, "s", 0, "exhaustive", 0, 100,
                 oracle="cpu", tflops=tflops)]
    lines = narrow(rows, "Best configurations: faults_cpu")
    head = header(lines)
    assert "TFLOP/s" in head
    for gone in ("confirmed", "optimum", "baseline", "HBM"):
        assert gone not in head, head
    (row,) = [line for line in lines if small.key in line and "│" in line]
    assert "0.0105" in row and "exhaustive s0" in row


def test_several_spaces_get_a_column_whose_names_never_wrap():
    rows = [replay_row("cute_hopper_gemm"), replay_row("cutlass_sm90_gemm")]
    rows[1].problem_key = "gemm_bf16_tn_4096x4096x4096"
    lines = narrow(rows)
    assert "space" in header(lines)
    assert any("cute_hopper_gemm" in line for line in lines) and any("cutlass_sm90_gemm" in line for line in lines)


def test_best_in_an_80_column_terminal(tmp_path, monkeypatch, capsys):
    """``best`` in a terminal 80 columns wide (Rich takes a terminal's width): the table fits it."""
    from conftest import replay_experiment

    from evotune.cli import results

    monkeypatch.chdir(tmp_path)
    exp = replay_experiment(tmp_path / "q.toml", name="q", url="journal:q.journal", trials=5, repeats=2,
                            landscapes=(GEMM,))
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(results, "make_console", lambda stderr=False: Console(width=80, stderr=stderr))
    assert main(["best", str(exp)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert sum("landscape:gemm_RTX_2080_Ti" in line for line in lines) == 1
    assert "│ 10 " in "\n".join(lines)  # both seeds' trials: the total the column is labelled with


def test_the_kernel_tuner_hint_is_the_readme_s(tmp_path, monkeypatch, capsys):
    """Kernel Tuner's strategies where it is not installed: the install command README gives (not on PyPI)."""
    import sys

    monkeypatch.setitem(sys.modules, "kernel_tuner", None)  # as if not installed
    args = ["compare", "--landscape", str(PNPOLY), "--budget", "5", "--strategy", "kt:random_sample",
            "--out", str(tmp_path)]
    assert main(args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "kt:random_sample is unavailable here: needs kernel_tuner: pip install '.[bench]'" in line
    assert "with `pip install '.[bench]'`" in (GEMM.parents[3] / "README.md").read_text()

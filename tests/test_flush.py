"""``[oracle] flush``: parsed into the timing options, recorded in every study, landscape and confirmation, and
shown by ``best``; figures that name no flush read as the one there was before ("dirty") and say so."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
from conftest import KT_EXCERPT
from rich.console import Console

from evotune.core.flush import FLUSHES
from evotune.core.hardware import get_hardware
from evotune.core.landscape import Landscape, load_landscape
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.space import Context
from evotune.measurement.options import TimingOptions
from evotune.reporting.report import best_table, collect_best, flush_text, read_bw_percent
from evotune.running.confirmation import confirm_best
from evotune.running.experiment import ExperimentError, load_experiment
from evotune.running.record import write_recorded
from evotune.running.resume import check_resume
from evotune.running.targets import Target, study_attrs, study_name
from evotune.storage.study import StudyStore

PROBLEM = Problem.gemm(16, 4096, 4096, "bf16")
GPU_EXPERIMENT = """
space = "triton_matmul"
hardware = "H100"
[oracle]
kind = "gpu"
{oracle}
[[problem]]
m = 16
n = 4096
k = 4096
[strategy]
name = "random"
[budget]
trials = 5
[storage]
url = "sqlite:///{db}"
"""


def gpu_experiment(tmp_path: Path, oracle: str = ""):
    path = tmp_path / "exp.toml"
    path.write_text(GPU_EXPERIMENT.format(oracle=oracle, db=tmp_path / "runs.db"))
    return load_experiment(path)


def target() -> Target:
    space = load_space("triton_matmul")
    return Target(PROBLEM, space, Context(get_hardware("H100"), PROBLEM))


def quiet() -> Console:
    return Console(file=io.StringIO())


# -- the experiment file
@pytest.mark.parametrize("flush", FLUSHES)
def test_the_flush_the_file_names_reaches_the_timing_options(tmp_path, flush):
    exp = gpu_experiment(tmp_path, f'flush = "{flush}"')
    assert exp.oracle_options.timing == TimingOptions(flush=flush)


def test_without_a_flush_the_default_is_the_clean_one(tmp_path):
    assert gpu_experiment(tmp_path).oracle_options.timing.flush == "clean"


@pytest.mark.parametrize("value", ['"warm"', "1", '["clean"]'])
def test_an_unknown_flush_is_one_line_naming_the_file_and_field(tmp_path, value):
    with pytest.raises(ExperimentError) as err:
        gpu_experiment(tmp_path, f"flush = {value}")
    assert err.value.field == "oracle.flush" and str(tmp_path / "exp.toml") in str(err.value)
    assert err.value.message.startswith("must be one of dirty, clean, got ")


# -- where it is recorded
def test_a_gpu_study_records_its_flush(tmp_path):
    exp = gpu_experiment(tmp_path, 'flush = "clean"')
    assert study_attrs(exp, target(), "random", 0)["flush"] == "clean"


def test_a_landscape_without_a_flush_reads_as_dirty_and_says_so():
    kt = load_landscape(KT_EXCERPT)
    assert kt.flush is None  # a Kernel Tuner file: evotune's oracle did not measure it
    recorded = Landscape(kt.params, kt.entries, PROBLEM, {"device": "H100"})
    assert recorded.flush == ("dirty", False)
    recorded.meta["flush"] = "clean"
    assert recorded.flush == ("clean", True)


def test_a_replay_study_takes_the_flush_of_its_landscape(tmp_path):
    exp = load_experiment(_replay(tmp_path))
    kt = load_landscape(KT_EXCERPT)
    t = replace(target(), landscape=Landscape(kt.params, kt.entries, PROBLEM, {"device": "H100"}))
    attrs = study_attrs(exp, t, "random", 0)
    assert (attrs["flush"], attrs["flush_recorded"]) == ("dirty", False)
    assert flush_text(attrs) == "dirty (not recorded)"


def _replay(tmp_path: Path) -> Path:
    from conftest import replay_experiment

    return replay_experiment(tmp_path / "r.toml", name="r", url=f"sqlite:///{tmp_path / 'r.db'}", trials=5)


def test_the_landscape_file_and_its_piece_name_the_flush(tmp_path):
    exp = gpu_experiment(tmp_path, 'flush = "clean"')
    t = target()
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'rec.db'}")
    store = StudyStore.open(storage, "rec", t.space, study_attrs(exp, t, "exhaustive", 0))
    point = t.space.feasible(t.ctx).point(0)
    from evotune.core.result import EvalResult, Status

    store.record(point, EvalResult(Status.OK, time_ms=0.05, samples_ms=[0.05]), 1.0)
    doc = json.loads(write_recorded(store, t, exp, 10, tmp_path / "ls.json").read_text())
    assert doc["flush"] == "clean" and doc["pieces"][-1]["flush"] == "clean"
    assert load_landscape(tmp_path / "ls.json").flush == ("clean", True)


class FakeEvaluator:
    def confirm(self, points, problem, search_ms, seconds=None):
        return {"items": {"p": {"median_ms": 0.05, "ci95_ms": [0.049, 0.051]}}, "configs": {"p": points[0]},
                "baselines": []}


def test_a_confirmation_record_names_its_flush(tmp_path):
    exp = gpu_experiment(tmp_path, 'flush = "clean"')
    record = confirm_best(PROBLEM, FakeEvaluator(), [(0.05, {"x": 1})], dict, quiet(), exp.oracle_options.confirm,
                          flush=exp.oracle_options.timing.flush)
    assert record is not None and record.flush == "clean" and record.to_attr()["flush"] == "clean"


# -- shown by best, refused on resume
def _gpu_study(storage, flush: str | None) -> None:
    study = optuna.create_study(storage=storage, study_name=f"x/{PROBLEM.key}/triton_matmul/random/seed0")
    attrs = {"experiment": "x", "problem_key": PROBLEM.key, "problem": PROBLEM.to_dict(), "space": "triton_matmul",
             "strategy": "random", "seed": 0, "hardware": "H100", "oracle": "gpu",
             "device_info": {"read_gbps": 2000.0}}
    if flush is not None:
        attrs["flush"] = flush
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    study.add_trial(optuna.trial.create_trial(params={"t": 0}, value=0.05, user_attrs={"key": "t=0"},
                                              distributions={"t": optuna.distributions.IntDistribution(0, 9)}))


@pytest.mark.parametrize(("flush", "shown"), [("clean", "clean"), (None, "dirty (not recorded)")])
def test_best_shows_the_flush_and_the_share_of_read_bandwidth(tmp_path, flush, shown):
    url = f"sqlite:///{tmp_path / 's.db'}"
    _gpu_study(optuna.storages.RDBStorage(url), flush)
    (best,) = collect_best(url, "x")
    assert best.flush == shown
    # 16 x 4096 x 4096 bf16 is memory-bound on an H100: its fewest bytes at 2000 GB/s over 0.05 ms
    assert best.pct_read_bw == pytest.approx(100 * PROBLEM.min_bytes / 2000e9 / 0.05e-3)
    console = Console(record=True, width=240)
    console.print(best_table([best]))
    text = console.export_text()
    assert "flush" in text and shown in text and "% read BW" in text


def test_a_compute_bound_problem_has_no_share_of_read_bandwidth():
    square = Problem.gemm(8192, 8192, 8192, "bf16")
    assert read_bw_percent(square, 1.5, 3000.0, 989.0) is None
    assert read_bw_percent(PROBLEM, 0.05, 3000.0, 989.0) is not None


def test_resuming_a_study_measured_after_another_flush_is_refused(tmp_path):
    exp = gpu_experiment(tmp_path, 'flush = "clean"')
    t = target()
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'runs.db'}")
    attrs = study_attrs(exp, t, "random", 0)
    del attrs["flush"]  # a study from before the flush was recorded: it had the dirty one
    StudyStore.open(storage, study_name(exp, t, "random", 0), t.space, attrs)
    with pytest.raises(ExperimentError) as err:
        check_resume(exp, [t], storage, quiet())
    assert err.value.field == "oracle.flush" and "'dirty'" in err.value.message and "'clean'" in err.value.message
    check_resume(gpu_experiment(tmp_path, 'flush = "dirty"'), [t], storage, quiet())  # the same flush resumes


def test_recording_into_a_landscape_of_another_flush_is_refused(tmp_path):
    from evotune.running.record import check_landscape_flushes, landscape_path

    dirty = gpu_experiment(tmp_path, 'flush = "dirty"')
    t = target()
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'rec.db'}")
    store = StudyStore.open(storage, "rec", t.space, study_attrs(dirty, t, "exhaustive", 0))
    from evotune.core.result import EvalResult, Status

    store.record(t.space.feasible(t.ctx).point(0), EvalResult(Status.OK, time_ms=0.05), 1.0)
    path = write_recorded(store, t, dirty, 10, landscape_path(tmp_path / "ls", t))
    check_landscape_flushes(dirty, [t], tmp_path / "ls")  # the same flush records on
    clean = gpu_experiment(tmp_path, 'flush = "clean"')
    with pytest.raises(ExperimentError) as err:
        check_landscape_flushes(clean, [t], tmp_path / "ls")
    assert err.value.field == "oracle.flush" and str(path) in err.value.message
    check_landscape_flushes(clean, [t], tmp_path / "elsewhere")  # another folder is fine


@pytest.mark.gpu
def test_on_a_gpu_both_flushes_time_a_decode_gemm_and_the_read_bandwidth_is_measured():
    import torch

    from evotune.core.hardware import detect
    from evotune.measurement.oracle import Oracle
    from evotune.measurement.workloads.gemm import make_inputs

    problem = Problem.gemm(16, 4096, 11008, "bf16")
    a, b, c = make_inputs(problem)
    for flush in FLUSHES:
        oracle = Oracle(TimingOptions(flush=flush))
        assert (oracle._sweep is not None) == (flush == "clean")
        t = oracle.time(lambda: torch.matmul(a, b, out=c))
        assert t.graph and t.median_ms > 0
    gbps = Oracle().read_bandwidth_gbps()  # a dirty oracle measures it after a clean flush all the same
    assert 0.3 * detect().hbm_gbps < gbps < 1.1 * detect().hbm_gbps

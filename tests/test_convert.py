"""``evotune convert``: a converted landscape replays exactly like its source, and bad input changes nothing."""

from __future__ import annotations

import gzip
import json
import shutil

import optuna
import pytest
from conftest import KT_EXCERPT, LANDSCAPES

from evotune.cli import main
from evotune.core.landscape import FORMAT, load_landscape
from evotune.running.experiment import load_experiment
from evotune.running.run import run_experiment
from evotune.storage.study import make_storage
from evotune.storage.summaries import study_names


def convert_cli(*args: str) -> int:
    return main(["convert", *args])


@pytest.fixture
def converted(tmp_path):
    assert convert_cli(str(KT_EXCERPT), "--out", str(tmp_path / "conv")) == 0
    return tmp_path / "conv" / KT_EXCERPT.name


def test_converted_file_holds_the_same_points_exactly(tmp_path, capsys):
    assert convert_cli(str(KT_EXCERPT), "--out", str(tmp_path / "conv")) == 0
    converted = tmp_path / "conv" / KT_EXCERPT.name
    assert capsys.readouterr().out.strip() == str(converted)
    raw = json.loads(gzip.decompress(converted.read_bytes()))
    assert raw["format"] == FORMAT and raw["converted_from"] == KT_EXCERPT.name
    src, out = load_landscape(KT_EXCERPT), load_landscape(converted)
    assert [(p.name, p.choices, p.ordered) for p in out.params] == [(p.name, p.choices, p.ordered) for p in src.params]
    assert out.problem == src.problem and out.space_name == src.space_name and out.stem == src.stem
    assert out.meta["device"] == src.meta["device"] and out.meta["problem_size"] == src.meta["problem_size"]
    assert list(out.entries) == list(src.entries) and len(src) == 205
    failed = 0
    for key, r in src.entries.items():
        s = out.entries[key]
        # exact, not approximate: the tuning clock and every comparison read these
        assert (s.status, s.time_ms, s.compile_s, s.bench_s, s.error, s.message) == \
            (r.status, r.time_ms, r.compile_s, r.bench_s, r.error, r.message)
        assert s.samples_ms == []  # none kept by default: replay reads none
        failed += s.status.failed
    assert failed == 18


def test_rounded_times_keep_every_two_times_apart_and_costs_their_digits(tmp_path):
    """--time-digits rounds every time of a file to as many digits as keep its different times apart, at least
    the number given; --cost-digits rounds each compile and benchmark time."""
    raw = json.loads(gzip.decompress(KT_EXCERPT.read_bytes()))
    ok = [row for row in raw["cache"].values() if isinstance(row["time"], float)]
    ok[0]["time"], ok[1]["time"] = 1.00000000001, 1.00000000002  # apart at the 12th significant digit only
    (tmp_path / "kt.json").write_text(json.dumps(raw))
    assert convert_cli(str(tmp_path / "kt.json"), "--out", str(tmp_path / "conv"),
                       "--time-digits", "10", "--cost-digits", "4") == 0
    src, out = load_landscape(tmp_path / "kt.json"), load_landscape(tmp_path / "conv" / "kt.json.gz")
    assert list(out.entries) == list(src.entries)
    for key, r in src.entries.items():
        s = out.entries[key]
        assert (s.status, s.message) == (r.status, r.message)
        assert s.time_ms == (None if r.time_ms is None else float(f"{r.time_ms:.12g}"))
        assert (s.compile_s, s.bench_s) == (float(f"{r.compile_s:.4g}"), float(f"{r.bench_s:.4g}"))
    first, second = (out.entries[tuple(row[k] for k in raw["tune_params_keys"])].time_ms for row in ok[:2])
    assert first < second
    assert sum(s.cost_s != r.cost_s for s, r in zip(out.entries.values(), src.entries.values(), strict=True)) > 150


@pytest.mark.parametrize("name", [
    "pnpoly_RTX_2080_Ti.json.gz",
    *(pytest.param(p.name, marks=pytest.mark.slow) for p in sorted(LANDSCAPES.glob("*.json.gz"))
      if p.name != "pnpoly_RTX_2080_Ti.json.gz"),
])
def test_a_shipped_kernel_tuner_landscape_is_what_its_conversion_writes(name, tmp_path):
    """The shipped Kernel Tuner landscapes hold costs as their README's command rounds them: converting one again
    with it writes the same bytes."""
    assert convert_cli(str(LANDSCAPES / name), "--out", str(tmp_path), "--cost-digits", "4") == 0
    assert (tmp_path / name).read_bytes() == (LANDSCAPES / name).read_bytes()


def test_samples_kept_are_spread_over_their_range(tmp_path):
    assert convert_cli(str(KT_EXCERPT), "--out", str(tmp_path), "--samples", "2") == 0
    src, out = load_landscape(KT_EXCERPT), load_landscape(tmp_path / KT_EXCERPT.name)
    for key, r in src.entries.items():
        if r.samples_ms:
            assert out.entries[key].samples_ms == pytest.approx([min(r.samples_ms), max(r.samples_ms)], rel=1e-5)


def trials(path, tmp_path, name):
    """Run GA and random search, by trials and by tuning time, on one landscape; every trial, as stored."""
    toml = tmp_path / f"{name}.toml"
    toml.write_text(f"""
name = "same"
space = "landscape"
[oracle]
kind = "replay"
landscapes = ["{path.as_posix()}"]
[[strategy]]
name = "ga"
seed = 3
repeats = 2
options = {{ population = 8, offspring = 8 }}
[[strategy]]
name = "random"
seed = 3
[budget]
trials = 150
seconds = 1.0
[storage]
url = "journal:{(tmp_path / name).as_posix()}.journal"
""")
    exp = load_experiment(toml)
    stopped = [(r.study_name, r.trials, r.stopped) for r in run_experiment(exp, progress=False)]
    storage = make_storage(exp.storage)
    out = {}
    for study in sorted(study_names(storage)):
        out[study] = [(t.number, t.state, t.value, t.params,
                       {k: v for k, v in t.user_attrs.items() if k not in ("wall_s", "samples_ms")})
                      for t in optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)]
    return stopped, out


def test_a_strategy_makes_the_same_trials_on_the_converted_file(converted, tmp_path):
    src = load_landscape(KT_EXCERPT)
    assert 1.0 < sum(r.cost_s for r in src.entries.values())  # so the seconds budget stops some runs early
    before, after = trials(KT_EXCERPT, tmp_path, "kt"), trials(converted, tmp_path, "evotune")
    assert after == before
    stopped, studies = before
    assert len(studies) == 3 and {s for _, _, s in stopped} == {"seconds"}
    assert any(t[1] == optuna.trial.TrialState.FAIL for ts in studies.values() for t in ts)


def test_a_source_converted_in_place_is_replaced(tmp_path):
    copy = tmp_path / KT_EXCERPT.name
    shutil.copy(KT_EXCERPT, copy)
    assert convert_cli(str(copy), "--out", str(tmp_path)) == 0
    assert json.loads(gzip.decompress(copy.read_bytes()))["format"] == FORMAT
    again, src = load_landscape(copy), load_landscape(KT_EXCERPT)
    assert {k: (r.status, r.time_ms, r.cost_s) for k, r in again.entries.items()} == \
        {k: (r.status, r.time_ms, r.cost_s) for k, r in src.entries.items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == [KT_EXCERPT.name]


@pytest.mark.parametrize("args, needle", [
    ([], "SRC"),
    (["{kt}"], "--out"),
    (["{kt}", "--out", "{out}", "--samples", "-1"], "--samples"),
    (["{kt}", "--out", "{out}", "--samples", "many"], "--samples"),
    (["{kt}", "--out", "{out}", "--time-digits", "0"], "--time-digits"),
    (["{kt}", "--out", "{out}", "--cost-digits", "18"], "--cost-digits"),
    (["{kt}", "--out", "{out}", "--cost-digits", "four"], "--cost-digits"),
    (["{kt}", "--out", "{file}"], "--out"),
    (["{kt}", "{missing}", "--out", "{out}"], "missing.json: cannot read"),
    (["{kt}", "{notjson}", "--out", "{out}"], "notjson.json: not JSON"),
    (["{kt}", "{kt}", "--out", "{out}"], "a second source named"),
])
def test_bad_input_ends_with_one_line_exit_2_and_creates_nothing(args, needle, tmp_path, capsys):
    (tmp_path / "notjson.json").write_text("{nope")
    (tmp_path / "file.txt").write_text("")
    paths = {"kt": str(KT_EXCERPT), "out": str(tmp_path / "out"), "file": str(tmp_path / "file.txt"),
             "missing": str(tmp_path / "missing.json"), "notjson": str(tmp_path / "notjson.json")}
    assert convert_cli(*(a.format(**paths) for a in args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evotune: error: ") and needle in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("precision", "dtype"), [([32], "fp32"), ([16], "fp16"), (None, "fp32")])
def test_a_kernel_tuner_cache_is_read_with_its_data_type(tmp_path, precision, dtype):
    """A cache names no data type: CLBlast's PRECISION parameter tells it; the hub's other kernels are fp32."""
    raw = json.loads(gzip.decompress(KT_EXCERPT.read_bytes()))
    if precision is not None:
        raw["tune_params"]["PRECISION"] = precision
        raw["tune_params_keys"].append("PRECISION")
        for row in raw["cache"].values():
            row["PRECISION"] = precision[0]
    (tmp_path / "kt.json").write_text(json.dumps(raw))
    assert load_landscape(tmp_path / "kt.json").problem.dtype == dtype
    assert convert_cli(str(tmp_path / "kt.json"), "--out", str(tmp_path / "conv")) == 0
    converted = load_landscape(tmp_path / "conv" / "kt.json.gz")
    assert converted.problem.dtype == dtype and converted.problem.kind == "cn_pnpoly"

"""``record`` (exhaustive, resumable, written as a landscape) and the runtime lookup API."""

from __future__ import annotations

import json

import numpy as np
import optuna
import pytest
from conftest import ROOT, replay_experiment
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from evotune.cli import main
from evotune.core.landscape import load_landscape
from evotune.core.problem import Problem
from evotune.core.tuned_cache import remember
from evotune.reporting.lookup import compile_best, lookup
from evotune.reporting.report import Best


@pytest.mark.slow  # a recording in several pieces
def test_record_in_pieces_resumes_and_writes_a_replayable_landscape(tmp_path, pnpoly):
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"journal:{tmp_path / 'rec.journal'}",
                            trials=10, strategy="random")
    out = tmp_path / "landscapes"
    # replay charges recorded costs to the clock: about 40 s of recorded time stops the first piece early
    assert main(["record", str(exp), "--out", str(out), "--seconds", "40"]) == 0
    (path,) = out.glob("*.json.gz")
    part = load_landscape(path)
    assert 0 < len(part) < len(pnpoly) and part.meta["complete"] is False
    assert main(["record", str(exp), "--out", str(out)]) == 0  # the rest, resumed
    full = load_landscape(path)
    assert full.meta["complete"] is True and len(full) == len(pnpoly)
    for key, r in pnpoly.entries.items():
        s = full.entries[key]
        assert s.status is r.status
        if r.time_ms is not None:
            assert s.time_ms == pytest.approx(r.time_ms, rel=1e-5)
            assert len(s.samples_ms) <= 16
    assert full.optimum_ms == pytest.approx(pnpoly.optimum_ms, rel=1e-5)


@pytest.mark.slow  # a recording in several pieces
def test_a_piece_on_a_fresh_machine_resumes_from_the_landscape_file(tmp_path, pnpoly):
    """Only the landscape file survives between pieces: its points are imported, not measured again."""
    out = tmp_path / "landscapes"
    first = replay_experiment(tmp_path / "a.toml", name="rec", url=f"journal:{tmp_path / 'a.journal'}", trials=10)
    assert main(["record", str(first), "--out", str(out), "--seconds", "40"]) == 0
    (path,) = out.glob("*.json.gz")
    part = load_landscape(path)
    second = replay_experiment(tmp_path / "b.toml", name="rec", url=f"journal:{tmp_path / 'b.journal'}", trials=10)
    assert main(["record", str(second), "--out", str(out)]) == 0
    full = load_landscape(path)
    assert full.meta["complete"] is True and len(full) == len(pnpoly)
    assert [p["new_points"] for p in full.meta["pieces"]] == [len(part), len(pnpoly) - len(part)]
    # each piece names its fastest new point, so a report can take the baselines timed beside the optimum
    later = min(r.time_ms for k, r in full.entries.items() if k not in part.entries and r.time_ms is not None)
    assert [p["best"]["time_ms"] for p in full.meta["pieces"]] == pytest.approx([part.optimum_ms, later], rel=1e-5)
    first_best = full.meta["pieces"][0]["best"]["params"]
    assert full.lookup(dict(zip(full.names, first_best, strict=True))).time_ms == pytest.approx(part.optimum_ms)
    # the recording study is in the experiment's record storage, beside its tuning journal
    recorded = JournalStorage(JournalFileBackend(str(tmp_path / "b_record.journal")))
    store_b = optuna.load_study(study_name=optuna.get_all_study_names(recorded)[0], storage=recorded)
    imported = [t for t in store_b.trials if t.user_attrs.get("imported_from") == path.name]
    assert len(imported) == len(part)  # copied from the file, with the first piece's values
    for t in imported:
        assert t.user_attrs["status"] == part.entries[tuple(t.params[n] for n in part.names)].status.value


def best_row(m, n, k, time_ms, study="s", oracle="gpu", space="triton_matmul", config=None):
    p = Problem.gemm(m, n, k, "bf16")
    return Best("exp", p.key, p.to_dict(), space, config or {"BLOCK_M": 64}, time_ms, study, 0, "ga", 0, 10,
                "NVIDIA H200", oracle)


def test_lookup_exact_then_nearest_bucket(tmp_path):
    db = tmp_path / "tuned.json"
    remember([best_row(4096, 4096, 4096, 0.2), best_row(64, 4096, 11008, 0.05)], "sqlite:///x.db", db)
    hit = lookup(Problem.gemm(4096, 4096, 4096, "bf16"), path=db)
    assert hit.exact and hit.config == {"BLOCK_M": 64} and hit.time_ms == 0.2
    with pytest.warns(UserWarning, match="never tuned"):
        near = lookup(Problem.gemm(4000, 4100, 4096, "bf16"), path=db)
    assert not near.exact and near.problem.key == "gemm_bf16_tn_4096x4096x4096"
    assert "nearest power-of-two bucket" in near.note
    with pytest.raises(LookupError):
        lookup(Problem.gemm(4096, 4096, 4096, "int8"), path=db)


def test_remember_keeps_the_fastest_per_problem(tmp_path):
    db = tmp_path / "tuned.json"
    remember([best_row(1024, 1024, 1024, 0.5, study="a")], "s", db)
    remember([best_row(1024, 1024, 1024, 0.7, study="b")], "s", db)  # slower, from another study: ignored
    assert lookup(Problem.gemm(1024, 1024, 1024, "bf16"), path=db).time_ms == 0.5
    remember([best_row(1024, 1024, 1024, 0.4, study="b")], "s", db)
    assert lookup(Problem.gemm(1024, 1024, 1024, "bf16"), path=db).time_ms == 0.4


def test_lookup_answers_from_one_oracle_and_gpu_by_default(tmp_path):
    db = tmp_path / "tuned.json"
    problem = Problem.gemm(2048, 2048, 2048, "bf16")
    # one problem and one device name, timed three ways: a replayed landscape's time is no measurement
    remember([best_row(2048, 2048, 2048, 0.3, study="g"), best_row(2048, 2048, 2048, 0.1, "r", "replay"),
              best_row(2048, 2048, 2048, 9.0, study="c", oracle="cpu")], "s", db)
    assert [(e["oracle"], e["time_ms"]) for e in json.loads(db.read_text())] == [
        ("gpu", 0.3), ("replay", 0.1), ("cpu", 9.0)]
    hit = lookup(problem, path=db)
    assert (hit.oracle, hit.time_ms, hit.hardware) == ("gpu", 0.3, "NVIDIA H200")
    assert (lookup(problem, path=db, oracle="replay").time_ms, lookup(problem, path=db, oracle="cpu").time_ms) == (
        0.1, 9.0)
    with pytest.raises(LookupError, match="timed by oracle 'replay'"):
        lookup(Problem.gemm(2048, 2048, 2048, "int8"), path=db, oracle="replay")
    with pytest.raises(ValueError, match="oracle: expected one of gpu, cpu, replay"):
        lookup(problem, path=db, oracle="landscape")
    old = [{k: v for k, v in e.items() if k != "oracle"} for e in json.loads(db.read_text()) if e["oracle"] == "gpu"]
    db.write_text(json.dumps(old))  # a cache written before entries named their oracle held GPU results only
    assert lookup(problem, path=db).time_ms == 0.3
    with pytest.raises(LookupError):
        lookup(problem, path=db, oracle="replay")


def test_lookup_returns_the_config_as_the_kernel_takes_it(tmp_path):
    db = tmp_path / "tuned.json"
    stored = {"tile_m": 128, "tile_n": 256, "cluster": "2x1", "swizzle": 1, "raster": "m", "stages": 4}
    remember([best_row(4096, 4096, 4096, 0.2, space="cute_hopper_gemm", config=stored),
              best_row(1024, 1024, 1024, 0.1, space="a_users_space", config={"cluster": "2x1"})], "s", db)
    hit = lookup(Problem.gemm(4096, 4096, 4096, "bf16"), path=db)
    assert hit.config == {**stored, "cluster": (2, 1)} and hit.source["config"] == stored  # the file keeps "2x1"
    unknown = lookup(Problem.gemm(1024, 1024, 1024, "bf16"), path=db)
    assert unknown.config == {"cluster": "2x1"}
    assert "space 'a_users_space' cannot be loaded here (not a built-in or installed space)" in unknown.note


def test_replay_and_cpu_runs_are_looked_up_like_gpu_runs(tmp_path, pnpoly, capsys, monkeypatch):
    from evotune.reporting.report import collect_best

    url = f"journal:{tmp_path / 'r.journal'}"
    exp = replay_experiment(tmp_path / "r.toml", name="rep", url=url, trials=20,
                            extra=f'[outputs]\nplots = "{tmp_path / "plots"}"\nbest = "{tmp_path / "b.json"}"\n')
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    (row,) = collect_best(url, "rep")
    hit = lookup(pnpoly.problem, oracle="replay")  # the cache this test's runs write ($EVOTUNE_TUNED)
    assert (hit.oracle, hit.space, hit.config, hit.time_ms) == ("replay", row.space, row.config, row.time_ms)
    assert hit.exact and hit.hardware == row.hardware
    with pytest.raises(LookupError):
        lookup(pnpoly.problem)  # no GPU measured it

    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "open").touch()  # tests/spaces/gated.py builds every point
    cpu = tmp_path / "c.toml"
    cpu.write_text(f"""name = "cpu"
space = "{ROOT / "tests" / "spaces" / "gated.py"}"
[oracle]
kind = "cpu"
[[problem]]
m = 8
n = 8
k = 8
dtype = "fp32"
[strategy]
name = "random"
[budget]
trials = 4
[storage]
url = "journal:{tmp_path / 'c.journal'}"
[outputs]
best = "{tmp_path / "c.json"}"
""")
    monkeypatch.setenv("EVOTUNE_TEST_GATE", str(gate))
    assert main(["run", str(cpu), "--no-progress", "--no-plots"]) == 0
    hit = lookup(Problem.gemm(8, 8, 8, "fp32"), oracle="cpu")
    assert hit.oracle == "cpu" and hit.space == "gated" and set(hit.config) == {"x", "y"}
    assert "tuning-result cache" in capsys.readouterr().err
    # a user's space is loaded again from its file, by name alone it could not be: the config decoded, the
    # kernel built
    assert "cannot be loaded" not in hit.note
    fn = compile_best(Problem.gemm(8, 8, 8, "fp32"), space="gated", oracle="cpu")
    a, b = np.arange(64.0).reshape(8, 8), np.eye(8)
    assert np.array_equal(fn(a, b), a)


def test_record_rewrites_the_landscape_while_it_measures(tmp_path, pnpoly, monkeypatch):
    """A piece killed from outside keeps what it measured: the file is rewritten every WRITE_EVERY_S."""
    import evotune.running.record as record

    writes = []
    real = record.write_recorded
    monkeypatch.setattr(record, "WRITE_EVERY_S", 0.0)
    monkeypatch.setattr(record, "write_recorded",
                        lambda *a: writes.append(len(load_landscape(real(*a)))) or a[4])
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"journal:{tmp_path / 'rec.journal'}", trials=10)
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--seconds", "5"]) == 0
    assert len(writes) > 2 and writes == sorted(writes)  # points so far, growing, then the final write
    (path,) = (tmp_path / "out").glob("*.json.gz")
    assert load_landscape(path).meta["pieces"][-1]["new_points"] == writes[-1] == len(load_landscape(path))


@pytest.mark.slow  # a recording in several pieces
def test_a_piece_counts_what_the_file_gains_when_the_study_outran_it(tmp_path, pnpoly):
    """A device copies the repository's (older) file each call while its study persists: no piece is lost."""
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"journal:{tmp_path / 'rec.journal'}", trials=10)
    out = tmp_path / "out"
    assert main(["record", str(exp), "--out", str(out), "--seconds", "20"]) == 0
    (path,) = out.glob("*.json.gz")
    first, kept = load_landscape(path), path.read_bytes()
    assert main(["record", str(exp), "--out", str(out), "--seconds", "20"]) == 0
    assert len(first) < len(load_landscape(path)) < len(pnpoly)
    path.write_bytes(kept)  # the second piece's file is lost; its points live on in the study
    assert main(["record", str(exp), "--out", str(out)]) == 0
    full = load_landscape(path)
    assert full.meta["complete"] is True
    assert [p["new_points"] for p in full.meta["pieces"]] == [len(first), len(pnpoly) - len(first)]


@pytest.mark.slow  # about 1.7 s: kept out of the fast lane (its 3-minute margin)
def test_record_keeps_its_study_out_of_the_tuning_results(tmp_path, pnpoly, monkeypatch, capsys):
    """best, plot and the dashboard read the tuning storage; recording has a storage of its own."""
    from evotune.reporting.report import collect_best
    from evotune.storage.summaries import study_names

    monkeypatch.chdir(tmp_path)
    tuning = f"journal:{tmp_path / 'rec.journal'}"
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=tuning, trials=10, strategy="random",
                            extra=f'[outputs]\nplots = "{tmp_path / "plots"}"\n')
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    before = study_names(tuning)
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--seconds", "20"]) == 0
    capsys.readouterr()
    assert study_names(tuning) == before  # no ".../record" study among the tuning results
    (row,) = collect_best(tuning, "rec")
    assert row.trials == 10 and row.strategy == "random"
    recording = study_names(f"journal:{tmp_path / 'rec_record.journal'}")
    assert len(recording) == 1 and recording[0].endswith("/record")
    assert main(["plot", str(exp)]) == 0
    from evotune.reporting.plots import load_runs

    (runs,) = load_runs(tuning, "rec")
    assert {c.strategy for c in runs.curves} == {"random"}  # no "exhaustive" curve
    (path,) = (tmp_path / "out").glob("*.json.gz")
    assert not set(path.name) & set('<>:"/\\|?*'), path.name
    assert path.name == "landscape_pnpoly_RTX_2080_Ti_cn_pnpoly_20000000.json.gz"


@pytest.mark.parametrize(("url", "derived"), [
    ("sqlite:///runs/h100.db", "sqlite:///runs/h100_record.db"),
    ("sqlite:////abs/path/x.sqlite3", "sqlite:////abs/path/x_record.sqlite3"),
    ("journal:runs/quickstart.journal", "journal:runs/quickstart_record.journal"),
    ("journal:/tmp/a/b", "journal:/tmp/a/b_record"),
    ("postgresql+psycopg2://u:p%40ss@db.example:5432/evotune?sslmode=require",
     "postgresql+psycopg2://u:p%40ss@db.example:5432/evotune_record?sslmode=require"),
    ("mysql://u@127.0.0.1/tune", "mysql://u@127.0.0.1/tune_record"),
])
def test_the_record_storage_is_derived_from_the_tuning_storage(url, derived):
    from evotune.storage.study import record_storage_url

    assert record_storage_url(url) == derived


def test_record_url_can_be_named_but_not_the_tuning_storage(tmp_path):
    from evotune.running.experiment import ExperimentError, load_experiment

    exp = replay_experiment(tmp_path / "a.toml", name="a", url="sqlite:///runs/a.db", trials=5,
                            extra='record_url = "journal:elsewhere/rec.journal"\n')
    assert load_experiment(exp).record_storage == "journal:elsewhere/rec.journal"
    assert load_experiment(replay_experiment(tmp_path / "b.toml", name="b", url="sqlite:///runs/b.db",
                                             trials=5)).record_storage == "sqlite:///runs/b_record.db"
    same = replay_experiment(tmp_path / "c.toml", name="c", url="sqlite:///runs/c.db", trials=5,
                             extra='record_url = "sqlite:///runs/c.db"\n')
    with pytest.raises(ExperimentError, match=r"storage\.record_url"):
        load_experiment(same)


def test_a_sampled_recording_holds_the_searched_points_and_a_uniform_sample(tmp_path, pnpoly):
    """``--sample N``: what the experiment's search measured, best first, then N uniformly drawn points; the
    file says so and is never complete. A second piece draws the same sample and measures nothing again."""
    url = f"journal:{tmp_path / 's.journal'}"
    exp = replay_experiment(tmp_path / "s.toml", name="sam", url=url, trials=12, strategy="random",
                            extra=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    out = tmp_path / "landscapes"
    assert main(["record", str(exp), "--out", str(out), "--sample", "20"]) == 0
    (path,) = out.glob("*.json.gz")
    ls = load_landscape(path)
    coverage = ls.meta["coverage"]
    assert coverage["kind"] == "sample" and coverage["searched"] == 12 and coverage["random"] == 20
    assert coverage["seed"] == 0 and coverage["feasible"] == len(pnpoly) and len(coverage["studies"]) == 1
    assert 20 <= len(ls) <= 32 and ls.meta["complete"] is False
    searched = {tuple(t.params[n] for n in ls.names) for t in optuna.load_study(
        study_name=coverage["studies"][0], storage=optuna.storages.JournalStorage(
            JournalFileBackend(str(tmp_path / "s.journal")))).trials}
    assert searched <= set(ls.entries)
    for key, r in ls.entries.items():  # every recorded result is the landscape's own
        want = pnpoly.entries[key]
        assert r.status is want.status
        if want.time_ms is not None:
            assert r.time_ms == pytest.approx(want.time_ms, rel=1e-5)
    assert main(["record", str(exp), "--out", str(out), "--sample", "20"]) == 0
    again = load_landscape(path)
    assert set(again.entries) == set(ls.entries) and [p["new_points"] for p in again.meta["pieces"]] == [len(ls)]


@pytest.mark.parametrize("argv, message", [
    (["--sample", "0"], "--sample: expected an integer >= 1"),
    (["--sample", "5", "--compile-only"], "--sample: not with --compile-only"),
])
def test_sample_refuses_a_bad_size_or_compile_only(tmp_path, pnpoly, capsys, argv, message):
    exp = replay_experiment(tmp_path / "s.toml", name="sam", url=f"journal:{tmp_path / 's.journal'}", trials=5)
    assert main(["record", str(exp), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s_record.journal").exists()


def test_a_whole_record_takes_each_problem_from_both_ends_odd_ones_worst_first():
    """Best predicted first; or from both ends in turn, best or worst first: two workers recording problems side
    by side need the same shape-free kernels, and with the two turns their queues hold the same kernels, which
    their pools build between them."""
    from evotune.core.hardware import get_hardware
    from evotune.core.space import Context
    from evotune.running.record import whole_space
    from evotune.running.targets import Target
    from search_spaces.triton_decode_gemm import SPACE

    problem = Problem.gemm(16, 4096, 4096, "int8")
    target = Target(problem, SPACE, Context(get_hardware("H100"), problem))
    fs = SPACE.feasible(target.ctx)

    def order(strategy) -> list[dict]:
        points = []
        while more := strategy.ask(50):
            points += more
            strategy.tell([(p, 1.0) for p in more])
        return points

    forward, even, odd = (order(whole_space(target, fs, ends)) for ends in (None, 0, 1))
    assert len(forward) == len(fs) > 100
    estimates = [SPACE.estimate(p, target.ctx) for p in forward]
    assert estimates == sorted(estimates)
    assert even[:4] == [forward[0], forward[-1], forward[1], forward[-2]]
    assert odd[:4] == [forward[-1], forward[0], forward[-2], forward[1]]
    key = SPACE.key
    assert sorted(map(key, even)) == sorted(map(key, odd)) == sorted(map(key, forward))  # each point once
    assert {key(p) for p in even[:40]} == {key(p) for p in odd[:40]}  # the same kernels at the same time

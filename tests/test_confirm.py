"""The confirmation stage's logic, driven by a fake timer (no GPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evotune.measurement.retiming import ConfirmOptions, confirm_rounds


class FakeTimer:
    """Samples around a true time per item, with relative noise and an optional drift per round."""

    def __init__(self, true_ms: dict[str, float], noise: float = 0.002, drift_per_call: dict[str, float] | None = None,
                 seed: int = 0):
        self.true_ms, self.noise = dict(true_ms), noise
        self.drift = drift_per_call or {}
        self.rng = np.random.default_rng(seed)
        self.calls: list[str] = []
        self.events: list[str] = []

    def take(self, name: str, n: int) -> list[float]:
        self.calls.append(name)
        self.events.append(f"take:{name}")
        t = self.true_ms[name]
        self.true_ms[name] = t * (1.0 + self.drift.get(name, 0.0))
        return list(t * (1.0 + self.noise * self.rng.standard_normal(n)))

    def warm(self, seconds: float) -> None:
        self.events.append(f"warm:{seconds}")


def test_items_are_timed_in_interleaved_rounds_after_the_warm_up():
    timer = FakeTimer({"a": 1.0, "b": 2.0, "base": 1.5})
    result = confirm_rounds(["a", "b", "base"], timer.take, ConfirmOptions(min_rounds=4), warm=timer.warm)
    assert timer.events[0] == "warm:1.0"
    rotations = [["a", "b", "base"], ["b", "base", "a"], ["base", "a", "b"]]  # each round opens with the next item
    assert timer.calls == [n for r in range(result.rounds) for n in rotations[r % 3]]
    assert result.rounds >= 4
    assert all(it.samples == 10 * result.rounds for it in result.items.values())


class FirstOfRoundSlow(FakeTimer):
    """The item that opens a round runs ``penalty`` slower (it follows the pause between rounds)."""

    def __init__(self, true_ms: dict[str, float], penalty: float):
        super().__init__(true_ms)
        self.penalty, self.taken = penalty, 0

    def take(self, name: str, n: int) -> list[float]:
        first = self.taken % len(self.true_ms) == 0
        self.taken += 1
        return [t * (1.0 + self.penalty) if first else t for t in super().take(name, n)]


@pytest.mark.parametrize("rotate", [True, False])
def test_no_item_pays_alone_for_opening_the_rounds(rotate):
    """Three entries of one launch: rotated, each opens a third of the rounds and all confirm alike; in a fixed
    order the first pays the opening's cost in every round and looks slower than itself."""
    timer = FirstOfRoundSlow({"copy0": 1.0, "copy1": 1.0, "copy2": 1.0}, penalty=0.03)
    result = confirm_rounds(list(timer.true_ms), timer.take,
                            ConfirmOptions(min_rounds=6, max_rounds=6, rotate=rotate))
    medians = {n: it.median_ms for n, it in result.items.items()}
    spread = max(medians.values()) / min(medians.values()) - 1
    if rotate:
        assert spread < 0.01
    else:
        assert medians["copy0"] == pytest.approx(1.03, rel=0.01) and spread > 0.02


def test_the_warm_up_lasts_no_longer_than_the_gpu_idled_since_the_oracles_last_samples(monkeypatch):
    pytest.importorskip("torch")
    import evotune.measurement.oracle as oracle_module
    from evotune.measurement.oracle import Oracle

    oracle = Oracle(flush_l2=False)  # nothing on a GPU is made without a flush buffer
    assert oracle.warmup_for(0.5) == 0.5  # nothing sampled yet: the GPU may have idled for long
    now = [100.0]
    monkeypatch.setattr(oracle_module.time, "perf_counter", lambda: now[0])
    oracle.sampled_at = 99.9  # a search's evaluation 0.1 s ago
    assert oracle.warmup_for(0.5) == pytest.approx(0.1)
    now[0] = 130.0  # thirty seconds later: idle, the whole warm-up
    assert oracle.warmup_for(0.5) == 0.5
    timer = FakeTimer({"a": 1.0})
    confirm_rounds(["a"], timer.take, ConfirmOptions(warmup_s=0.0, min_rounds=3, max_rounds=3), warm=timer.warm)
    assert not any(e.startswith("warm") for e in timer.events)  # none needed: none done


def test_rounds_stop_once_every_ci_is_within_the_target():
    timer = FakeTimer({"a": 1.0, "b": 2.0}, noise=0.002)
    result = confirm_rounds(["a", "b"], timer.take, ConfirmOptions(ci_target=0.005, min_rounds=3))
    assert result.converged and result.rounds == 3  # quiet samples: the minimum is enough
    assert all(it.ci95_rel <= 0.005 for it in result.items.values())
    assert result.items["a"].median_ms == pytest.approx(1.0, rel=0.005)
    assert result.warnings == []


def test_noisy_items_take_more_rounds_and_never_beyond_the_limit():
    quiet = confirm_rounds(["a"], FakeTimer({"a": 1.0}, noise=0.002).take, ConfirmOptions(min_rounds=1))
    noisy = confirm_rounds(["a"], FakeTimer({"a": 1.0}, noise=0.03).take, ConfirmOptions(min_rounds=1))
    assert noisy.rounds > quiet.rounds
    assert noisy.converged and noisy.items["a"].ci95_rel <= 0.005
    capped = confirm_rounds(["a"], FakeTimer({"a": 1.0}, noise=0.5).take, ConfirmOptions(max_rounds=5))
    assert capped.rounds == 5 and not capped.converged
    assert any("stopped after 5 rounds" in w for w in capped.warnings)


def test_the_time_limit_ends_the_rounds():
    ticks = iter(range(1000))
    result = confirm_rounds(["a"], FakeTimer({"a": 1.0}, noise=0.5).take, ConfirmOptions(max_seconds=3.5),
                            clock=lambda: float(next(ticks)))
    assert not result.converged and result.rounds < 10


def test_a_baseline_that_drifts_during_the_stage_is_reported():
    # the baseline gets 0.5% slower every round: about 10% over 20 rounds
    timer = FakeTimer({"cfg": 1.0, "base": 1.0}, noise=0.001, drift_per_call={"base": 0.005})
    result = confirm_rounds(["cfg", "base"], timer.take, ConfirmOptions(min_rounds=20, max_rounds=20))
    assert result.items["base"].drift_rel > 0.03
    assert result.items["cfg"].drift_rel < 0.01
    moved = [w for w in result.warnings if "machine's speed moved" in w]
    assert [w.split(":")[0] for w in moved] == ["base"]


def test_a_configuration_far_from_its_search_time_is_reported():
    timer = FakeTimer({"lucky": 1.0, "honest": 1.0}, noise=0.001)
    result = confirm_rounds(["lucky", "honest"], timer.take, ConfirmOptions(),
                            search_ms={"lucky": 0.9, "honest": 1.01})
    assert result.items["lucky"].search_ms == 0.9
    assert result.items["lucky"].search_rel == pytest.approx(0.1, rel=0.05)
    assert len(result.warnings) == 1 and result.warnings[0].startswith("lucky: confirmed at")


def test_the_result_is_plain_json():
    timer = FakeTimer({"a": 1.0, "b": 2.0})
    result = confirm_rounds(["a", "b"], timer.take, ConfirmOptions(), search_ms={"a": 1.0})
    doc = json.loads(json.dumps(result.to_dict()))
    assert set(doc["items"]) == {"a", "b"} and doc["items"]["a"]["search_ms"] == 1.0
    assert doc["items"]["b"]["search_ms"] is None and len(doc["items"]["a"]["ci95_ms"]) == 2


def test_nothing_to_confirm_times_nothing():
    timer = FakeTimer({})
    result = confirm_rounds([], timer.take, ConfirmOptions(), warm=timer.warm)
    assert result.items == {} and timer.events == []


def test_configurations_race_and_only_the_leaders_are_timed_to_the_end():
    # the true winner was measured 12% slow by the search; the clearly slower ones drop out early
    true = {"winner": 1.00, "near1": 1.004, "near2": 1.006, **{f"slow{i}": 1.10 + 0.02 * i for i in range(8)}}
    search = {"winner": 1.12, "near1": 1.00, "near2": 1.01, **{f"slow{i}": 1.02 + 0.01 * i for i in range(8)}}
    timer = FakeTimer({**true, "base": 1.5}, noise=0.002)
    result = confirm_rounds([*true, "base"], timer.take, ConfirmOptions(top_k=3, min_rounds=3), search_ms=search)
    assert result.converged and result.screened == 11
    assert set(result.items) == {"winner", "near1", "near2", "base"}
    assert min((n for n in result.items if n != "base"), key=lambda n: result.items[n].median_ms) == "winner"
    assert all(timer.calls.count(f"slow{i}") == 3 for i in range(8))  # dropped once the racing starts
    assert set(result.raced_out) == {f"slow{i}" for i in range(8)} and result.raced_out["slow0"].samples == 30
    assert timer.calls.count("winner") == result.rounds == timer.calls.count("base")


def test_candidates_are_the_top_k_and_those_near_the_fastest_search_time():
    from evotune.measurement.options import ConfirmOptions as Opts
    from evotune.running.confirmation import screened

    measured = [(t, f"p{t}") for t in (1.30, 1.00, 1.10, 1.05, 1.16, 1.14, 2.0)]
    assert [p for _, p in screened(measured, Opts(top_k=2, screen=0.15))] == ["p1.0", "p1.05", "p1.1", "p1.14"]
    assert [p for _, p in screened(measured, Opts(top_k=2, screen=0.0))] == ["p1.0", "p1.05"]
    assert len(screened(measured, Opts(top_k=2, screen=0.15, screen_max=3))) == 3
    assert len(screened(measured, Opts(top_k=6, screen=0.0))) == 6
    assert screened(measured, Opts(top_k=0)) == [] and screened([], Opts()) == []


def test_a_confirmation_record_is_stored_as_the_evaluators_record_its_configs_written_then_dated_and_flushed():
    """What a study keeps (and a landscape file copies): the evaluator's keys in its order, ``configs`` where the
    evaluator put them but in the written form, then ``date`` and ``flush``."""
    from rich.console import Console

    from evotune.core.problem import Problem
    from evotune.measurement.options import ConfirmOptions as Opts
    from evotune.running.confirmation import confirm_best

    class Timed:
        def confirm(self, points, problem, search_ms, seconds=None):
            return {"items": {"k": {"median_ms": 1.0}}, "rounds": 3, "configs": {"k": points[0]},
                    "baselines": ["b"], "warnings": ["slow to settle"]}

    console = Console(record=True, width=200)
    record = confirm_best(Problem.gemm(8, 8, 8, "fp32"), Timed(), [(1.0, {"x": 4})], lambda p: [p["x"]], console,
                          Opts(), flush="clean")
    assert record is not None and record.error is None and record.warnings == ["slow to settle"]
    stored = record.to_attr()
    assert list(stored) == ["items", "rounds", "configs", "baselines", "warnings", "date", "flush"]
    assert stored["configs"] == {"k": [4]} and stored["flush"] == "clean" and stored["date"].endswith("+00:00")
    assert "slow to settle" in console.export_text()


class ConfirmingReplay:
    """A replay oracle that also confirms, as the GPU one does: each point re-times slower than the search saw
    it, the search's best by 10% (a lucky sample), the others by 1%; a baseline at 1 ms."""

    def __new__(cls, landscape):
        from evotune.measurement.replay import ReplayEvaluator

        class _Confirming(ReplayEvaluator):
            confirms = True

            def confirm(self, points, problem, search_ms, seconds=None):
                keys = [landscape.space().key(p) for p in points]
                true = {k: t * (1.10 if i == 0 else 1.01) for i, (k, t) in enumerate(zip(keys, search_ms, strict=True))}
                true["fake.blas"] = 1.0
                timer = FakeTimer(true, noise=0.001)
                result = confirm_rounds([*keys, "fake.blas"], timer.take, ConfirmOptions(),
                                        dict(zip(keys, search_ms, strict=True)), timer.warm)
                doc = result.to_dict()
                doc.update(configs=dict(zip(keys, points, strict=True)), baselines=["fake.blas"], skipped={})
                return doc

        return _Confirming(landscape)


@pytest.mark.slow  # about 2.6 s: kept out of the fast lane (its 3-minute margin)
def test_the_best_the_report_gives_is_the_confirmed_one(tmp_path, monkeypatch):
    from conftest import replay_experiment

    from evotune.reporting.report import best_table, collect_best, export_best
    from evotune.running import run, session
    from evotune.running.experiment import load_experiment

    monkeypatch.setattr(session, "make_evaluator", lambda exp, target, worker=None: ConfirmingReplay(target.landscape))
    url = f"sqlite:///{tmp_path / 'c.db'}"
    exp = load_experiment(replay_experiment(tmp_path / "c.toml", name="c", url=url, trials=40, strategy="random",
                                            repeats=2))
    run.run_experiment(exp, progress=False)
    (best,) = collect_best(url, "c")
    assert best.confirmed and best.baselines == pytest.approx({"fake.blas": 1.0}, rel=0.01)
    # the search's lucky best re-timed 10% slower: the confirmed winner is the runner-up, at 1.01 x its search time
    assert best.time_ms == pytest.approx(best.search_ms * 1.01, rel=0.01)
    assert best.search_ms > min(t.value for t in _all_trials(url) if t.value is not None)
    assert any("measured during the search" in w for w in best.warnings)
    trial = next(t for t in _all_trials(url) if t.number == best.trial and t.params == best.config)
    assert trial.value == pytest.approx(best.search_ms)
    doc = json.loads(export_best([best], tmp_path / "best.json").read_text())[0]
    assert doc["confirmed"]
    assert doc["speedup_vs"]["fake.blas"] == pytest.approx(best.baselines["fake.blas"] / best.time_ms)
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(best_table([best]))
    text = console.export_text()
    assert "±" in text and "warning:" in text


def _all_trials(url):
    import optuna

    out = []
    for s in optuna.get_all_study_summaries(url):
        out += optuna.load_study(study_name=s.study_name, storage=url).get_trials()
    return out


def test_a_recorded_landscape_holds_its_confirmed_optimum_and_baselines(tmp_path, monkeypatch, pnpoly):
    from conftest import replay_experiment

    from evotune.cli import main
    from evotune.core.landscape import load_landscape
    from evotune.running import session

    monkeypatch.setattr(session, "make_evaluator", lambda exp, target, worker=None: ConfirmingReplay(target.landscape))
    exp = replay_experiment(tmp_path / "rec.toml", name="rec", url=f"journal:{tmp_path / 'rec.journal'}",
                            trials=10, strategy="random")
    assert main(["record", str(exp), "--out", str(tmp_path / "out"), "--seconds", "40"]) == 0
    (path,) = (tmp_path / "out").glob("*.json.gz")
    part = load_landscape(path)
    confirmation = part.meta["confirmation"]
    assert confirmation["baselines"] == ["fake.blas"]
    assert 5 <= len(confirmation["configs"]) == confirmation["screened"] <= 40  # the leaders and those near them
    timed = {**confirmation["items"], **confirmation["raced_out"]}
    assert set(timed) == {*confirmation["configs"], "fake.blas"}
    for key, item in timed.items():
        if key == "fake.blas":
            continue
        point = dict(zip(part.names, confirmation["configs"][key], strict=True))
        # the file's time of a confirmed point is its confirmed median; the search's stays in the record
        assert part.lookup(point).time_ms == pytest.approx(item["median_ms"], rel=1e-5)
        assert pnpoly.lookup(point).time_ms == pytest.approx(item["search_ms"], rel=1e-5)
    recorded_best = min(item["search_ms"] for k, item in timed.items() if k != "fake.blas")
    assert part.optimum_ms > recorded_best  # the lucky sample no longer makes the optimum

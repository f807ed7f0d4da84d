"""``tune-model``'s keys of built-in spaces: decode keys (``triton_decode_gemm``; fp8 scaled per tensor), block-fp8
keys (``triton_block_fp8``, vLLM's default as the baseline), tuned in evotune's one loop (``tune_study``) with the
evaluator the run hands it, confirmed beside the untuned baseline, kept where ``lookup()`` finds it. The GPU
evaluator is stood in for by one that "times" each configuration by the space's roofline model (CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from evotune.core.hardware import get_hardware
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context, Point, SearchSpace
from evotune.measurement.base import Evaluator
from evotune.model import exports
from evotune.model.exports import write_tuned
from evotune.model.models import ModelError, load_model
from evotune.model.outcome import Outcome
from evotune.model.plan import Family, make_plan
from evotune.model.study_tuner import StudyTuner, decide
from evotune.reporting.lookup import lookup
from evotune.running.confirmation import ConfirmationRecord
from evotune.search.transfer import from_studies

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "data" / "tiny_moe_config.json"
H100 = get_hardware("H100")
BUDGET = 12
SPACE_NAME = Family.DECODE.value
CUBLAS_OVER_MODEL = 1.3  # the stand-in's cuBLAS: this much slower than the model's best
VLLM_OVER_MODEL = 1.6  # and the space's named configuration (block-fp8: vLLM's default)


class ModelTimed(Evaluator):
    """Each configuration's time is the space's estimate; the confirmation re-times them 1% slower, cuBLAS at a
    fixed multiple of the model's fastest."""

    kind = "standin"
    confirms = True

    def __init__(self, space: SearchSpace):
        self.space = space
        self.timed: list[tuple[str, str]] = []

    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        self.timed.append((problem.key, self.space.key(point)))
        assert self.space.estimate is not None
        return EvalResult(Status.OK, self.space.estimate(point, Context(H100, problem)), bench_s=0.001)

    def confirm(self, points: list[Point], problem: Problem, search_ms: list[float],
                seconds: float | None = None) -> dict[str, Any] | None:
        items: dict[str, Any] = {self.space.key(p): {"median_ms": ms * 1.01}
                                 for p, ms in zip(points, search_ms, strict=True)}
        items["torch.matmul"] = {"median_ms": min(search_ms) * CUBLAS_OVER_MODEL}
        for name in self.space.named:  # timed like a baseline, under the space's name
            items[f"{self.space.name}: {name}"] = {"median_ms": min(search_ms) * VLLM_OVER_MODEL}
        return {"items": items}


def tuner(out: Path, dtype: str = "bf16", budget: int = BUDGET) -> tuple[StudyTuner, list[ModelTimed]]:
    made: list[ModelTimed] = []

    def make(space: SearchSpace, shared: Evaluator | None) -> ModelTimed:
        made.append(ModelTimed(space))
        return made[-1]

    return StudyTuner(out, dtype, "tune-model/test", budget=budget, evaluator=make, hardware=H100), made


def decode_keys():
    plan = make_plan(load_model(str(TINY)), 1, "bf16", (1, 16, 128))
    return plan, [k for k in plan.keys if k.shape.family is Family.DECODE]


@pytest.mark.slow  # the default strategy's searches of three keys
def test_decode_keys_are_tuned_with_the_decode_family_in_one_study_each_and_confirmed(tmp_path) -> None:
    plan, keys = decode_keys()
    shape_keys = [k for k in keys if k.shape == keys[0].shape]
    assert [k.m for k in shape_keys] == [1, 16]
    dec, made = tuner(tmp_path)
    outcomes = [dec.tune(k) for k in shape_keys]
    (ev,) = made
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'autotune.db'}")
    for key, o in zip(shape_keys, outcomes, strict=True):
        problem = Problem.gemm(key.m, key.shape.n, key.shape.k, "bf16", "tn")
        study = optuna.load_study(study_name=dec.study_name(problem, dec.space(Family.DECODE)), storage=storage)
        assert len(study.trials) == BUDGET == o.evaluations == o.new
        assert study.user_attrs["space"] == SPACE_NAME and study.user_attrs["problem_key"] == problem.key
        assert o.space == SPACE_NAME and o.how == "confirmed"
        space = dec.space(Family.DECODE)
        point = space.from_storage(o.config)
        assert point in space.feasible(Context(H100, problem))
        assert o.ratio == pytest.approx(CUBLAS_OVER_MODEL / 1.01)
        assert "confirmation" in study.user_attrs
    assert len(ev.timed) == 2 * BUDGET and len(set(ev.timed)) == 2 * BUDGET
    # the first key's study is a transfer source of the second's search (the run's own studies on this GPU)
    second = dec.problem(shape_keys[1])
    srcs = from_studies(storage, dec.space(Family.DECODE), second, H100.name, experiment="tune-model/test")
    assert [s.name for s in srcs] == [f"study:tune-model/test/{dec.problem(shape_keys[0]).key}"]
    # the sources are found without counting any study's trials (a storage counts by loading every trial: the
    # run's other studies, every key's, were loaded that way before each key)
    counted: list[int] = []
    storage.get_n_trials = lambda study_id, state=None: counted.append(study_id) or 0  # type: ignore[method-assign]
    assert [s.name for s in from_studies(storage, dec.space(Family.DECODE), second, H100.name,
                                         experiment="tune-model/test")] == [s.name for s in srcs]
    assert counted == []
    del storage.get_n_trials
    # the tuner reads a done study's trials (its confirmation recorded) once, however many keys follow
    third = dec.problem(keys[-1])
    plain = from_studies(storage, dec.space(Family.DECODE), third, H100.name, experiment="tune-model/test")
    read: list[int] = []
    real = storage.get_all_trials
    storage.get_all_trials = lambda sid, *a, **kw: read.append(sid) or real(sid, *a, **kw)  # type: ignore[method-assign]
    reads = []
    for _ in range(3):
        got = from_studies(storage, dec.space(Family.DECODE), third, H100.name, experiment="tune-model/test",
                           settled=dec._settled)
        assert [(s.name, s.results) for s in got] == [(s.name, s.results) for s in plain] and len(got) == 2
        reads.append(len(read))
    # the second key's search read the first's study already; the second's is read once, then neither again
    assert reads == [1, 1, 1]
    # a key tuned again times nothing: its study holds every trial
    again = dec.tune(shape_keys[0])
    assert len(ev.timed) == 2 * BUDGET and again.new == 0 and again.config == outcomes[0].config
    # where lookup() finds the decisions: tuned.json, the decode kernel's layout
    path = write_tuned(outcomes, tmp_path, "bf16", {SPACE_NAME: "tn"}, plan.ident)
    assert path is not None
    for key, o in zip(shape_keys, outcomes, strict=True):
        found = lookup(Problem.gemm(key.m, key.shape.n, key.shape.k, "bf16", "tn"), space=SPACE_NAME, path=path,
                       oracle="cpu")
        assert found.exact and dict(dec.space(Family.DECODE).to_storage(found.config)) == o.config


def test_the_default_tuner_hands_decode_keys_to_the_decode_family(tmp_path) -> None:
    pytest.importorskip("triton")
    from evotune.model.tuning import AutotuneTuner

    plan, keys = decode_keys()
    dec, made = tuner(tmp_path, budget=3)
    outcome = AutotuneTuner(plan, tmp_path, studies=dec).tune(keys[0])
    assert outcome.family == Family.DECODE.value and outcome.space == SPACE_NAME
    assert len(made[0].timed) == 3


def test_the_decision_is_the_confirmed_fastest_against_the_baseline() -> None:
    a, b = {"BLOCK_M": 16, "x": 1}, {"BLOCK_M": 16, "x": 2}
    measured = [(1.0, a), (1.1, b)]
    key = str
    timed = {"items": {str(a): {"median_ms": 1.2}, str(b): {"median_ms": 1.05}, "torch.matmul": {"median_ms": 2.1},
                       "s: vLLM default": {"median_ms": 1.9}}}
    record = ConfirmationRecord(timed, {}, "2026-01-01T00:00:00")
    got = decide(measured, record, key, lambda name: not name.startswith("s: "))
    assert (got.point, got.time_ms, got.untuned_ms, got.how) == (b, 1.05, 2.1, "confirmed")
    got = decide(measured, record, key, lambda name: name == "s: vLLM default")
    assert got.untuned_ms == 1.9
    got = decide(measured, None, key, bool)
    assert (got.point, got.time_ms, got.untuned_ms, got.how) == (a, 1.0, None, "searched")


def test_an_fp8_decode_key_is_scaled_per_tensor(tmp_path) -> None:
    plan = make_plan(load_model("Llama-3-8B"), 1, "fp8", (16, 128))
    assert {k.shape.family for k in plan.kernels} == {Family.DECODE, Family.GEMM}  # not quantized in blocks
    key = next(k for k in plan.keys if k.shape.family is Family.DECODE)
    dec, made = tuner(tmp_path, "fp8", budget=3)
    outcome = dec.tune(key)
    problem = dec.problem(key)
    assert (problem.dtype, problem.scaling, problem.layout) == ("fp8", "tensor", "tn")
    assert outcome.space == SPACE_NAME and outcome.ratio == pytest.approx(CUBLAS_OVER_MODEL / 1.01)
    assert made[0].timed and all(k == problem.key for k, _ in made[0].timed)


def test_a_block_fp8_key_is_confirmed_against_vllms_default_and_exported(tmp_path) -> None:
    plan = make_plan(load_model("DeepSeek-V3"), 8, None, (16,))
    key = next(k for k in plan.keys if k.shape.family is Family.BLOCK_FP8)
    dec, _ = tuner(tmp_path, "fp8", budget=4)
    outcome = dec.tune(key)
    assert outcome.space == Family.BLOCK_FP8.value and outcome.how == "confirmed"
    assert outcome.ratio == pytest.approx(VLLM_OVER_MODEL / 1.01)  # vLLM's default, not cuBLAS
    written = exports.write_server_files([outcome], tmp_path, "fp8", (128, 128))
    assert sorted(p.name for p in written) == [f"N={key.shape.n},K={key.shape.k},device_name=cpu-standin,"
                                               f"dtype=fp8_w8a8,block_shape=[128, 128].json",
                                               f"N={key.shape.n},K={key.shape.k},device_name=cpu-standin,"
                                               f"dtype=fp8_w8a8,block_shape=[128,128].json"]
    path = write_tuned([outcome], tmp_path, "fp8", {}, plan.ident)
    assert path is not None
    problem = Problem.gemm(16, key.shape.n, key.shape.k, "fp8", "tn", "block")
    assert lookup(problem, space=Family.BLOCK_FP8.value, path=path, oracle="cpu").exact


def test_the_default_tuner_takes_fp8_plans_per_tensor_and_in_128_blocks(tmp_path) -> None:
    pytest.importorskip("triton")
    from evotune.model.tuning import check_supported

    check_supported(make_plan(load_model("DeepSeek-V3"), 8, None, (16,)))  # 128 x 128 blocks, the MoE included
    check_supported(make_plan(load_model("Mixtral-8x7B"), 2, "fp8", (16,)))  # per tensor
    with pytest.raises(ModelError, match="--dtype int8: the default tuner's kernels are bf16 and fp8"):
        check_supported(make_plan(load_model("Mixtral-8x7B"), 2, "int8", (16,)))


def test_a_key_whose_untuned_default_was_faster_is_not_handed_to_lookup(tmp_path) -> None:
    """cuBLAS timed faster than the best configuration found: tuned.json leaves the key out, so that ``lookup()``
    has no exact answer for it and the caller keeps cuBLAS; the other key is written."""
    def outcome(m: int, tuned_ms: float, untuned_ms: float) -> Outcome:
        return Outcome(f"triton_decode_gemm N=256 K=256 M={m}", "triton_decode_gemm N=256 K=256",
                       Family.DECODE.value, {"M": m, "N": 256, "K": 256},
                       {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "REDUCE": "sum", "num_warps": 4,
                        "num_stages": 3}, 8, 8, 1.0, tuned_ms, untuned_ms, "confirmed", "NVIDIA H200", "3.6.0",
                       SPACE_NAME)

    slower, faster = outcome(64, 0.018, 0.013), outcome(16, 0.012, 0.014)
    assert exports.untuned_wins(slower) and not exports.untuned_wins(faster)
    path = write_tuned([slower, faster], tmp_path, "bf16", {SPACE_NAME: "tn"}, "run")
    assert path is not None
    with pytest.warns(UserWarning, match="was never tuned"):
        found = lookup(Problem.gemm(64, 256, 256, "bf16", "tn"), space=SPACE_NAME, path=path, oracle="gpu")
    assert found is not None and not found.exact  # only the nearest tuned key's, said as not exact
    assert lookup(Problem.gemm(16, 256, 256, "bf16", "tn"), space=SPACE_NAME, path=path, oracle="gpu").exact
    assert write_tuned([slower], tmp_path / "none", "bf16", {SPACE_NAME: "tn"}, "run") is None

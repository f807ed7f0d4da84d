"""The conv2d workload on the CPU: its fields, key and counts, its numpy reference, the CPU oracle
over a numpy conv space, and replaying a conv2d landscape with ``evotune run``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest

from evotune import cli
from evotune.core.landscape import landscape_document
from evotune.core.problem import FieldError, Problem, get_workload
from evotune.core.result import EvalResult, Status
from evotune.core.space import ordinal
from evotune.measurement.workloads.conv2d import conv2d_nhwc
from evotune.measurement.workloads.conv2d_shape import ConvShape, to_layout, to_nhwc

ROOT = Path(__file__).parents[1]
CONV = get_workload("conv2d")
BIG = {"N": 10, "C": 128, "H": 72, "W": 120, "K": 128, "R": 3, "S": 3, "pad": 1, "dtype": "int8",
       "layout": "nc32hw32"}


def test_key_bucket_counts_and_json_round_trip():
    p = CONV.parse(BIG)
    assert p.key == "conv2d_int8_nc32hw32_n10c128h72w120k128r3s3_p1s1d1"
    assert CONV.bucket_key(p) == "conv2d_int8_nc32hw32_n8c128h64w128k128r3s3_p1s1d1"
    assert p.flops == 2 * 10 * 128 * 72 * 120 * 128 * 3 * 3  # P, Q = H, W with pad 1
    assert p.min_bytes == 10 * 128 * 72 * 120 + 128 * 128 * 9 + 10 * 128 * 72 * 120 + 4
    assert Problem.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    per_channel = CONV.parse({**BIG, "scaling": "channel"})
    assert per_channel.key.endswith("_perchannel") and per_channel.min_bytes == p.min_bytes - 4 + 4 * 128
    strided = ConvShape.of(CONV.parse({**BIG, "stride": 2, "dilation": 2, "layout": "nhwc"}))
    assert (strided.P, strided.Q) == (35, 59)


def test_lookup_falls_back_to_the_nearest_conv_bucket(tmp_path):
    from evotune.reporting.lookup import lookup

    tuned = CONV.parse(BIG)
    entry = {"space": "s", "hardware": None, "problem_key": tuned.key, "problem": tuned.to_dict(),
             "config": {"x": 1}, "time_ms": 1.0}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps([entry]))
    with pytest.warns(UserWarning, match="never tuned"):
        hit = lookup(CONV.parse({**BIG, "N": 9, "W": 128}), path=path)
    assert not hit.exact and hit.problem == tuned
    with pytest.raises(LookupError):  # another filter size is another family
        lookup(CONV.parse({**BIG, "R": 1, "S": 1, "pad": 0}), path=path)


@pytest.mark.parametrize("table, field", [
    ({**BIG, "stride": 0}, "stride"), ({**BIG, "pad": -1}, "pad"), ({**BIG, "C": 48}, "C"),
    ({**BIG, "dtype": "fp16"}, "layout"), ({**BIG, "dtype": "fp8"}, "dtype"), ({**BIG, "layout": "nchw"}, "layout"),
    ({**BIG, "scaling": "row"}, "scaling"), ({**BIG, "dtype": "fp16", "layout": "nhwc", "scaling": "tensor"},
                                             "scaling"),
    ({**BIG, "H": 1, "pad": 0}, "R"), ({k: v for k, v in BIG.items() if k != "K"}, "K"),
])
def test_bad_fields_are_named(table, field):
    with pytest.raises(FieldError) as exc:
        CONV.parse(table)
    assert exc.value.field == field


def _naive(x, w, pad, stride, dilation):
    n, h, wd, _ = x.shape
    k, r_, s_, _ = w.shape
    p = (h + 2 * pad - dilation * (r_ - 1) - 1) // stride + 1
    q = (wd + 2 * pad - dilation * (s_ - 1) - 1) // stride + 1
    out = np.zeros((n, p, q, k))
    for i in range(p):
        for j in range(q):
            for r in range(r_):
                for s in range(s_):
                    y, xx = i * stride - pad + r * dilation, j * stride - pad + s * dilation
                    if 0 <= y < h and 0 <= xx < wd:
                        out[:, i, j, :] += x[:, y, xx, :] @ w[:, r, s, :].T
    return out


def test_numpy_convolution_matches_the_definition():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 7, 6, 3)), rng.standard_normal((4, 3, 2, 3))
    for pad, stride, dilation in [(0, 1, 1), (1, 2, 1), (2, 1, 2), (1, 3, 2)]:
        np.testing.assert_allclose(conv2d_nhwc(x, w, pad, stride, dilation), _naive(x, w, pad, stride, dilation))


def test_nc32hw32_round_trips_and_keeps_32_channels_innermost():
    x = np.arange(2 * 3 * 4 * 64).reshape(2, 3, 4, 64)
    packed = to_layout(x, "nc32hw32")
    assert packed.shape == (2, 2, 3, 4, 32) and packed[1, 1, 2, 3, 5] == x[1, 2, 3, 32 + 5]
    assert (to_nhwc(packed, "nc32hw32") == x).all()


def test_int8_reference_is_exact_then_scaled_and_verification_allows_one_step():
    p = CONV.parse({**BIG, "N": 1, "C": 32, "H": 4, "W": 5, "K": 32, "scaling": "channel"})
    x, w, scale = CONV.cpu_inputs(p, seed=1)
    assert (x.dtype, w.dtype, scale.shape) == (np.int8, np.int8, (32,))
    acc = conv2d_nhwc(to_nhwc(x, "nc32hw32").astype(np.int64), to_nhwc(w, "nc32hw32").astype(np.int64), 1, 1, 1)
    ref = CONV.cpu_reference(p, (x, w, scale))
    assert (to_nhwc(ref, "nc32hw32") == np.clip(np.rint(acc * scale.astype(np.float64)), -128, 127)).all()
    assert CONV.cpu_verify(p, (x, w, scale), ref)[0]
    nudged = ref.copy()
    nudged.flat[0] = ref.flat[0] + (1 if ref.flat[0] < 127 else -1)
    assert CONV.cpu_verify(p, (x, w, scale), nudged)[0]
    nudged.flat[0] = ref.flat[0] + (3 if ref.flat[0] < 100 else -3)
    ok, _, why = CONV.cpu_verify(p, (x, w, scale), nudged)
    assert not ok and why.startswith("1 of ")
    assert CONV.cpu_verify(p, (x, w, scale), ref.astype(np.int32))[2] == "dtype int32, expected int8"


def test_cpu_oracle_runs_the_numpy_conv_space_against_the_reference(tmp_path):
    from evotune.running.experiment import load_experiment
    from evotune.running.run import run_experiment

    exp = load_experiment(ROOT / "tests/experiments/conv_cpu.toml")
    assert [p.kind for p in exp.problems] == ["conv2d", "conv2d"]
    exp.storage = f"sqlite:///{tmp_path / 'conv.db'}"
    results = run_experiment(exp, progress=False)
    assert len(results) == 2
    for result in results:
        trials = optuna.load_study(study_name=result.study_name, storage=exp.storage).get_trials(deepcopy=False)
        status = {(t.params["method"], t.params["bias"]): t.user_attrs["status"] for t in trials}
        assert status == {("im2col", 0): "ok", ("loops", 0): "ok",
                          ("im2col", 100): "wrong_result", ("loops", 100): "wrong_result"}


def test_replaying_a_conv2d_landscape_with_evotune_run(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOTUNE_TUNED", str(tmp_path / "tuned.json"))  # any lookup cache the run writes stays here
    problem = CONV.parse({"N": 1, "C": 8, "H": 6, "W": 6, "K": 8, "R": 3, "S": 3, "pad": 1, "dtype": "fp16"})
    params = [ordinal("tile", [1, 2, 4, 8])]
    rows = [({"tile": t}, EvalResult(Status.OK, time_ms=ms, samples_ms=[ms], compile_s=0.5, bench_s=0.1))
            for t, ms in [(1, 4.0), (2, 2.0), (4, 1.0), (8, 3.0)]]
    doc = landscape_document(params, rows, problem, {"device": "test"}, "landscape")
    (tmp_path / "conv.json").write_text(json.dumps(doc))
    best = tmp_path / "best.json"
    (tmp_path / "exp.toml").write_text(
        'name = "conv_replay"\nspace = "landscape"\n[oracle]\nkind = "replay"\nlandscapes = ["conv.json"]\n'
        '[[strategy]]\nname = "exhaustive"\n[budget]\ntrials = 10\n'
        f'[storage]\nurl = "sqlite:///{tmp_path / "r.db"}"\n'
        f'[outputs]\nplots = "{tmp_path / "plots"}"\nbest = "{best}"\n')
    assert cli.main(["run", str(tmp_path / "exp.toml"), "--no-progress", "--no-plots"]) == 0
    (row,) = json.loads(best.read_text())
    assert row["problem_key"] == problem.key == "conv2d_fp16_nhwc_n1c8h6w6k8r3s3_p1s1d1"
    assert row["config"] == {"tile": 4} and row["fraction_of_optimum"] == 1.0
    assert row["tflops"] == pytest.approx(problem.flops / 1e-3 / 1e12)

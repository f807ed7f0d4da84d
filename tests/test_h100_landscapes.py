"""The H100 landscapes shipped in evotune/landscapes/h100: small, complete where claimed, replayable."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, replay_experiment

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.landscape import load_landscape
from evotune.core.plugins import load_space
from evotune.core.result import Status
from evotune.core.space import Context

H100 = ROOT / "evotune" / "landscapes" / "h100"
FILES = sorted(H100.glob("*.json.gz"))


def test_the_shipped_landscapes_stay_under_4_mb():
    total = sum(p.stat().st_size for p in FILES)
    print(f"{len(FILES)} H100 landscapes, {total / 1e6:.2f} MB")
    assert len(FILES) >= 45 and total <= 4_000_000


@pytest.mark.parametrize("path", FILES, ids=[p.name.removesuffix(".json.gz") for p in FILES])
def test_each_landscape_matches_its_space_and_carries_its_baseline(path):
    ls = load_landscape(path)
    space = load_space(ls.space_name)
    ctx = Context(get_hardware("H100"), ls.problem)
    feasible = space.feasible(ctx)
    assert ls.names == space.names and ls.meta["feasible"] == len(feasible)
    assert ls.meta["complete"] and len(ls) == len(feasible)  # every listed shape, every feasible point
    for values in ls.entries:  # every recorded point is one the space calls feasible
        assert space.check(dict(zip(ls.names, values, strict=True)), ctx) is None
    assert ls.meta["device"] == "NVIDIA H100 80GB HBM3" and ls.meta["pieces"]
    (baseline,) = ls.baselines.values()
    assert baseline["verified"] and baseline["time_ms"] > 0 and len(baseline["samples_ms"]) >= 10
    ok = [r for r in ls.entries.values() if r.status is Status.OK]
    assert ok and all(0 < len(r.samples_ms) <= 8 and r.error is not None for r in ok)
    # the piece that measured the optimum names it, so its baselines are the ones timed beside it
    bests = [p["best"]["time_ms"] for p in ls.meta["pieces"] if p.get("best")]
    assert min(bests) == pytest.approx(ls.optimum_ms, rel=1e-5)


@pytest.mark.parametrize("space", ["cute_hopper_gemm", "triton_matmul"])
def test_evotune_run_replays_every_h100_landscape(space, tmp_path, capsys):
    files = [p for p in FILES if p.name.startswith(space)]
    best = tmp_path / "best.json"
    exp = replay_experiment(tmp_path / f"replay_{space}.toml", name=f"replay_h100_{space}", space=space,
                            url=f"journal:{tmp_path / 'replay.journal'}", trials=12, landscapes=tuple(files),
                            extra=f'[outputs]\nbest = "{best}"')
    assert main(["run", str(exp), "--no-plots", "--no-progress"]) == 0
    assert len(json.loads(best.read_text())) == len(files)


@pytest.mark.slow  # several seconds: the fast lane stays under 3 minutes
def test_kernel_quality_report_covers_every_recorded_shape(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_quality", ROOT / "benchmarks" / "kernel_quality.py")
    kq = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kernel_quality", kq)  # its dataclasses look their module up
    spec.loader.exec_module(kq)
    assert kq.main(["--plot", str(tmp_path / "kq.png"), "--markdown", str(tmp_path / "kq.md")]) == 0
    text = (tmp_path / "kq.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| cute_hopper_gemm |", "| triton_matmul |"))]
    assert len(rows) == len(FILES) + 5  # one per landscape, plus one geometric mean per (space, dtype)
    assert (tmp_path / "kq.png").stat().st_size > 10_000
    for dtype in ("int8", "bf16", "fp16"):
        assert f"| cute_hopper_gemm | {dtype} |" in text
    convs = [d for d in json.loads((ROOT / "benchmarks" / "confirmed" / "h100.json").read_text())
             if d.get("kind") == "conv2d"]
    for d in convs:  # every confirmed convolution has its row, with its ratio
        e = d["extra"]
        assert f"| N{e['N']} C{e['C']} H{e['H']} W{e['W']} K{e['K']} {e['R']}x{e['S']} |" in text
        assert f"**{d['speedup']:.3f}x** |" in text


def test_the_recording_experiments_name_every_listed_shape():
    from evotune.measurement.options import TimingOptions
    from evotune.running.experiment import load_experiment

    shapes = {}
    for name in ("int8", "bf16", "fp16_small", "triton"):
        exp = load_experiment(ROOT / "experiments" / f"h100_record_{name}.toml")
        assert exp.oracle_options.timing == TimingOptions(min_samples=10, max_samples=60, ci_target=0.01)
        for space in exp.spaces:
            shapes.setdefault(space, set()).update(p.key for p in exp.problems)
    llama = {(m, n, k) for m in (16, 64, 256, 1024) for n, k in ((4096, 11008), (12288, 4096), (22016, 4096),
                                                                  (4096, 4096))} | {(64, 65536, 4096)}
    tvm = {(512, n, 512) for n in (16, 32, 64)}
    want = ({f"gemm_int8_tn_{m}x{n}x{k}" for m, n, k in llama | tvm}
            | {f"gemm_bf16_tn_{m}x{n}x{k}" for m, n, k in llama | {(s, s, s) for s in (2048, 4096, 8192)}}
            | {f"gemm_fp16_tn_{m}x{n}x{k}" for m, n, k in tvm})
    assert shapes["cute_hopper_gemm"] == want
    assert shapes["triton_matmul"] == {"gemm_bf16_tn_4096x4096x4096", "gemm_int8_tn_64x4096x11008"}
    recorded = {p.name.removesuffix(".json.gz") for p in FILES}
    assert recorded == {f"{space}_{key}" for space, keys in shapes.items() for key in keys}

"""The decode GEMM space's sampled H100 landscapes (evotune/landscapes/h100_decode): sound, and replayable on the
CPU, as `evotune run` with `oracle.kind = "replay"` reads them."""

from __future__ import annotations

import json

from conftest import ROOT, replay_experiment

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.landscape import load_landscape
from evotune.core.plugins import load_space
from evotune.core.space import Context

DECODE = ROOT / "evotune" / "landscapes" / "h100_decode"
FILES = sorted(DECODE.glob("*.json.gz"))


def test_each_decode_landscape_is_a_sample_of_the_space_with_its_flush_and_confirmation():
    assert len(FILES) == 20  # bf16 M = 1, 16, 64 and int8 M = 16, 64 on the four LLaMA-7B layers
    for path in FILES:
        ls = load_landscape(path)
        space = load_space(ls.space_name)
        ctx = Context(get_hardware("H100"), ls.problem)
        assert ls.space_name == "triton_decode_gemm" and ls.names == space.names
        assert not ls.meta["complete"] and ls.meta["coverage"]["kind"] == "sample" and len(ls) == 48
        for values in ls.entries:  # every recorded point is one the space calls feasible on an H100
            assert space.check(dict(zip(ls.names, values, strict=True)), ctx) is None, (path.name, values)
        assert ls.flush == ("clean", True) and ls.meta["device"] == "NVIDIA H100 80GB HBM3"
        assert ls.baselines and "confirmation" in ls.meta


def test_evotune_run_replays_the_decode_landscapes(tmp_path):
    files = [p for p in FILES if "_16x" in p.name]
    best = tmp_path / "best.json"
    exp = replay_experiment(tmp_path / "replay_decode.toml", name="replay_decode", space="triton_decode_gemm",
                            url=f"journal:{tmp_path / 'replay.journal'}", trials=12, landscapes=tuple(files),
                            strategy="default", extra=f'[outputs]\nbest = "{best}"')
    assert main(["run", str(exp), "--no-plots", "--no-progress"]) == 0
    assert len(json.loads(best.read_text())) == len(files)

"""The CUTLASS C++ sm90 landscapes shipped in evotune/landscapes/h100_cutlass: sampled, small, replayable."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, replay_experiment

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.landscape import load_landscape
from evotune.core.plugins import load_space
from evotune.core.result import Status
from evotune.core.space import Context
from evotune.running.experiment import load_experiment

FOLDER = ROOT / "evotune" / "landscapes" / "h100_cutlass"
FILES = sorted(FOLDER.glob("*.json.gz"))
EXPERIMENT = ROOT / "experiments" / "h100_cutlass_landscapes.toml"


def test_one_file_per_shape_of_the_recording_experiment_each_under_300_kb():
    exp = load_experiment(EXPERIMENT)
    assert {p.name.removesuffix(".json.gz") for p in FILES} == {f"cutlass_sm90_gemm_{p.key}" for p in exp.problems}
    assert all(p.stat().st_size < 300_000 for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=[p.name.removesuffix(".json.gz") for p in FILES])
def test_each_file_says_it_is_a_sample_and_holds_the_search_and_the_draw(path):
    ls = load_landscape(path)
    space = load_space(ls.space_name)
    ctx = Context(get_hardware("H100"), ls.problem)
    coverage = ls.meta["coverage"]
    assert coverage["kind"] == "sample" and coverage["random"] == 32 and coverage["seed"] == 0
    assert ls.meta["complete"] is False and coverage["feasible"] == ls.meta["feasible"] > 100_000
    assert 32 <= len(ls) <= coverage["searched"] + 32
    for values in ls.entries:  # every recorded point is one the space calls feasible
        assert space.check(dict(zip(ls.names, values, strict=True)), ctx) is None
    assert all(r.status is Status.OK for r in ls.entries.values())  # no feasible point failed to build or verify
    # the optimum and cuBLAS were re-timed side by side in the run that recorded the file
    items = ls.meta["confirmation"]["items"]
    assert items["torch.matmul"]["median_ms"] > 0 and len(items) >= 2


def test_evotune_run_replays_the_cutlass_landscapes(tmp_path):
    best = tmp_path / "best.json"
    exp = replay_experiment(tmp_path / "replay.toml", name="replay_h100_cutlass", space="cutlass_sm90_gemm",
                            url=f"journal:{tmp_path / 'replay.journal'}", trials=12, strategy="default",
                            landscapes=tuple(FILES), extra=f'[outputs]\nbest = "{best}"')
    assert main(["run", str(exp), "--no-plots", "--no-progress"]) == 0
    rows = json.loads(best.read_text())
    assert len(rows) == len(FILES)
    space = load_space("cutlass_sm90_gemm")
    for row in rows:  # a replay of a sampled file only ever hands out the points the file holds
        ls = load_landscape(FOLDER / f"cutlass_sm90_gemm_{row['problem_key']}.json.gz")
        assert ls.lookup(space.from_storage(row["config"])) is not None

"""Sampled fp8 landscapes (the decode family scaled per tensor and per row, the block-scaled family): the record
experiments that make them on a GPU, and what a CPU replay needs of them, checked on landscapes written here from a
stand-in (the space's own estimate as the time of each sampled point) and on the recorded ones, shipped as the
package's landscapes folder h100_fp8, once they are there."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import ROOT, replay_experiment

from evotune.cli import main
from evotune.core.hardware import get_hardware
from evotune.core.landscape import SHIPPED as PACKAGED
from evotune.core.landscape import landscape_document, load_landscape, write_landscape
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context
from evotune.running.experiment import load_experiment

RECORD = {"triton_decode_gemm": ROOT / "experiments" / "h100_record_fp8_decode.toml",
          "triton_block_fp8": ROOT / "experiments" / "h100_record_block_fp8.toml"}
SHIPPED = PACKAGED / "h100_fp8"  # where the recorded ones ship
SAMPLE = 32  # the --sample of the record commands
H100 = get_hardware("H100")


def recorded_problems() -> dict[str, list[Problem]]:
    return {space: load_experiment(path).problems for space, path in RECORD.items()}


def test_the_record_experiments_sample_both_fp8_families_cheaply():
    problems = recorded_problems()
    decode, block = problems["triton_decode_gemm"], problems["triton_block_fp8"]
    assert {(p.scaling, p.m) for p in decode} == {(s, m) for s in ("tensor", "row") for m in (1, 16, 64)}
    assert {(p.n, p.k) for p in decode} == {(6144, 4096), (28672, 4096)} and len(decode) == 12
    assert {p.scaling for p in block} == {"block"} and {(p.n, p.k) for p in block} == {(4608, 7168), (7168, 2304)}
    assert len(block) == 6
    for space, path in RECORD.items():
        exp = load_experiment(path)
        assert exp.spaces == [space] and exp.oracle == "gpu" and exp.oracle_options.confirm.top_k > 0
        assert f"--sample {SAMPLE} --out runs/landscapes/h100_fp8" in path.read_text()


def stand_in(folder: Path, space_name: str, problem: Problem, seed: int) -> Path:
    """A sampled landscape as `evotune record --sample` writes one, the times from the space's estimate (with a few
    percent of seeded noise and one failed point) instead of a GPU."""
    space = load_space(space_name)
    ctx = Context(H100, problem)
    fs = space.feasible(ctx)
    rng = random.Random(seed)
    rows = sorted(rng.sample(range(len(fs)), SAMPLE))
    results = []
    for i, r in enumerate(rows):
        point = fs.point(r)
        if i == 0:
            results.append((point, EvalResult(Status.COMPILE_ERROR, message="stand-in: out of resources")))
            continue
        ms = space.estimate(point, ctx) * rng.uniform(0.97, 1.05)
        results.append((point, EvalResult(Status.OK, ms, [ms] * 10, compile_s=1.0, bench_s=0.05, error=1e-3)))
    best = min(r.time_ms for _, r in results if r.time_ms is not None)
    meta = {"device": "stand-in", "hardware": "NVIDIA H100 80GB HBM3", "flush": "clean", "feasible": len(fs),
            "recorded": SAMPLE, "complete": False, "experiment": "stand_in",
            "coverage": {"kind": "sample", "searched": 0, "studies": [], "random": SAMPLE, "seed": seed,
                         "feasible": len(fs)},
            "baselines": {"stand-in baseline": {"time_ms": best * 1.1, "verified": True}},
            "confirmation": {"items": {}, "baselines": ["stand-in baseline"], "flush": "clean"}}
    doc = landscape_document(space.params, results, problem, meta, space_name, max_samples=4)
    return write_landscape(folder / f"{space_name}_{problem.key}.json.gz", doc)


def check_landscape(path: Path) -> None:
    """What replay and transfer read of a sampled fp8 landscape."""
    ls = load_landscape(path)
    space = load_space(ls.space_name)
    ctx = Context(H100, ls.problem)
    assert ls.space_name in RECORD and ls.names == space.names, path.name
    assert ls.problem.dtype == "fp8" and ls.problem.scaling in ("tensor", "row", "block")
    assert ls.problem.key in {p.key for p in recorded_problems()[ls.space_name]}, path.name
    assert not ls.meta["complete"] and ls.meta["coverage"]["kind"] == "sample" and len(ls) == SAMPLE
    for values in ls.entries:  # every recorded point is one the space calls feasible on an H100
        assert space.check(dict(zip(ls.names, values, strict=True)), ctx) is None, (path.name, values)
    assert ls.flush == ("clean", True) and ls.baselines and "confirmation" in ls.meta


def replay(folder: Path, space: str, files: list[Path]) -> list[dict]:
    """``evotune run`` with a replay oracle over ``files``: every recorded point (``trials`` = the sample), the best
    rows it exports."""
    folder.mkdir(parents=True, exist_ok=True)
    best = folder / f"{space}_best.json"
    exp = replay_experiment(folder / f"replay_{space}.toml", name=f"replay_{space}", space=space,
                            url=f"journal:{folder / f'{space}.journal'}", trials=SAMPLE, landscapes=tuple(files),
                            strategy="default", extra=f'[outputs]\nbest = "{best}"')
    assert main(["run", str(exp), "--no-plots", "--no-progress"]) == 0
    return json.loads(best.read_text())


def check_replay(folder: Path, files: list[Path]) -> None:
    """Each file checked, then each space's files replayed together: one best per file, its landscape's fastest."""
    for path in files:
        check_landscape(path)
    for space in RECORD:
        mine = [p for p in files if load_landscape(p).space_name == space]
        rows = replay(folder, space, mine)
        assert len(rows) == len(mine) > 0, space
        for row in rows:  # every recorded point replayed (the failed one too): each best is its landscape's fastest
            ls = next(load_landscape(p) for p in mine if load_landscape(p).problem.key == row["problem_key"])
            assert row["time_ms"] == ls.optimum_ms and row["trials"] == SAMPLE, row


@pytest.mark.slow  # four replayed runs: 7 s
def test_sampled_fp8_landscapes_replay_on_the_cpu(tmp_path):
    problems = recorded_problems()
    stand_ins = [stand_in(tmp_path / "stand_in", space, p, seed) for space, ps in problems.items()
                 for seed, p in enumerate(ps[:2])]
    check_replay(tmp_path / "stand_in_runs", stand_ins)
    # the recorded landscapes, once they are shipped: all of them, each as the record commands write it
    shipped = sorted(SHIPPED.glob("*.json.gz"))
    assert len(shipped) in (0, sum(map(len, problems.values())))
    if shipped:
        check_replay(tmp_path / "shipped_runs", shipped)

"""The README's worked example of a user's own GPU space (examples/own_triton_space/).

On the CPU: the experiment loads, the space loads by its path, and pruning keeps
exactly the points the chip can run, each pruned point with its reason. On a GPU
(``pytest -m gpu``): every feasible point of a small problem builds and computes
``a @ b``; a wrong result from the same launcher is caught by the oracle's check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evotune.core.hardware import get_hardware
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.space import Context
from evotune.running.experiment import load_experiment

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_triton_space"


def test_the_example_experiment_loads_with_its_space():
    exp = load_experiment(EXAMPLE / "experiment.toml")
    assert exp.oracle == "gpu" and exp.spaces == ["tiled_matmul.py"]
    assert [p.dtype for p in exp.problems] == ["fp16", "bf16"]
    space = load_space("tiled_matmul.py", base_dir=EXAMPLE)
    assert space.name == "tiled_matmul" and space.size == 5 * 5 * 4 * 2 * 2 * 3


def test_the_example_space_prunes_what_an_h100_cannot_run():
    space = load_space(str(EXAMPLE / "tiled_matmul.py"))
    h100 = get_hardware("H100")
    problem = Problem.gemm(4096, 4096, 4096, "fp16")
    feasible = space.feasible(Context(h100, problem))
    points = [feasible.point(r) for r in range(len(feasible))]
    over = [p for p in space.points() if p["num_stages"] * (p["BLOCK_M"] + p["BLOCK_N"]) * p["BLOCK_K"] * 2
            > h100.smem_per_block]
    assert over and len(points) == space.size - len(over)
    assert all(p not in over for p in points)
    assert set(feasible.pruned) == {"smem"}
    reason = space.check(over[0], Context(h100, problem))
    assert reason is not None and "shared memory" in reason


def test_the_example_space_refuses_int8_and_a_ragged_k_with_reasons():
    space = load_space(str(EXAMPLE / "tiled_matmul.py"))
    h100 = get_hardware("H100")
    assert len(space.feasible(Context(h100, Problem.gemm(256, 256, 256, "int8")))) == 0
    ragged = Problem.gemm(256, 256, 208, "fp16")
    point = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 8, "num_warps": 4, "num_stages": 2}
    assert space.check(point, Context(h100, ragged)) is None  # 208 = 13 x 16
    point["BLOCK_K"] = 32
    assert "K=208 is not a multiple of BLOCK_K=32" in space.check(point, Context(h100, ragged))


@pytest.mark.gpu
def test_every_feasible_point_of_the_example_computes_the_product():
    from evotune.core.hardware import detect
    from evotune.measurement.workloads.gemm import make_inputs, verify

    space = load_space(str(EXAMPLE / "tiled_matmul.py"))
    problem = Problem.gemm(256, 512, 128, "fp16")
    feasible = space.feasible(Context(detect(), problem))
    for r in range(0, len(feasible), max(1, len(feasible) // 24)):
        point = feasible.point(r)
        fn = space.build(point, problem)
        a, b, c = make_inputs(problem, seed=r)
        fn(a, b, c)
        ok, err, why = verify(problem, a, b, c)
        assert ok, (point, err, why)

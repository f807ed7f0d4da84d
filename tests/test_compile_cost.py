"""A new kernel's cost: ``default`` varies the launch arguments of built kernels before it compiles new ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import GEMM

from evotune.core.space import Context
from evotune.reporting.compare import Case
from evotune.search.compile_cost import Kernels
from evotune.search.strategies import make_strategy

# CLBlast's vector widths, strides and shared-memory switches, taken as launch arguments of a kernel made of the
# other parameters: the shape of a CUTLASS space, whose raster, swizzle and stream-K split are
LAUNCH = ("VWM", "VWN", "STRM", "STRN", "SA", "SB")


@pytest.fixture(scope="module")
def gemm():
    target = Case.load(str(GEMM), 400)
    space, fs, row_times = target.replay()
    space = dataclasses.replace(space, compiled_params=tuple(n for n in space.names if n not in LAUNCH))
    return space, fs, row_times, Context(problem=target.landscape.problem)


def search(gemm, seed: int, budget: int, **options) -> tuple[int, float]:
    """(distinct kernels among the points handed out, best time found / optimum)."""
    space, fs, row_times, ctx = gemm
    s = make_strategy("default", space, fs, seed=seed, ctx=ctx, **options)
    rows = []
    while len(rows) < budget:
        (point,) = s.ask(1)
        row = fs.row(point)
        rows.append(row)
        value = row_times[row]
        s.tell([(point, float(value) if np.isfinite(value) else None)])
    assert s.kernels is not None
    return len(set(s.kernels.of_row[rows].tolist())), float(np.nanmin(row_times)) / min(
        float(row_times[r]) for r in rows if np.isfinite(row_times[r]))


@pytest.mark.slow  # 80 evaluations x 4 seeds x 2 settings
def test_default_compiles_fewer_kernels_for_the_same_quality(gemm):
    plain = [search(gemm, seed, 80, compile_cost=0.0) for seed in range(4)]
    costed = [search(gemm, seed, 80) for seed in range(4)]  # the default compile_cost
    assert sum(k for k, _ in costed) <= 0.6 * sum(k for k, _ in plain)
    assert np.mean([q for _, q in costed]) >= np.mean([q for _, q in plain]) - 0.03


def test_kernels_group_rows_and_take_built_ones_from_the_space(gemm):
    space, fs, _, ctx = gemm
    first = fs.point(0)
    same = dataclasses.replace(space, built=lambda p, problem: all(p[n] == first[n] for n in space.compiled_params))
    kernels = Kernels.of(same, fs, ctx)
    assert kernels is not None and kernels.built.sum() == 1
    rows = np.arange(len(fs))
    sharing = [r for r in rows if all(fs.point(int(r))[n] == first[n] for n in space.compiled_params)]
    assert not kernels.new(np.array(sharing)).any() and kernels.new(rows).sum() == len(fs) - len(sharing)
    kernels.mark(len(fs) - 1)
    assert kernels.built.sum() == 2


def test_no_kernels_where_every_parameter_is_compiled_or_the_toolchain_is_missing(gemm):
    space, fs, _, ctx = gemm
    assert Kernels.of(dataclasses.replace(space, compiled_params=()), fs, ctx) is None
    assert Kernels.of(dataclasses.replace(space, compiled_params=tuple(space.names)), fs, ctx) is None

    def no_nvcc(p, problem):
        raise RuntimeError("nvcc not found on PATH")

    kernels = Kernels.of(dataclasses.replace(space, built=no_nvcc), fs, ctx)
    assert kernels is not None and not kernels.built.any()


def test_compile_cost_zero_is_plain_default(gemm):
    space, fs, row_times, ctx = gemm
    plain = dataclasses.replace(space, compiled_params=())
    picks = []
    for sp, options in ((space, {"compile_cost": 0.0}), (plain, {})):
        s = make_strategy("default", sp, fs, seed=3, ctx=ctx, **options)
        rows = []
        for _ in range(30):
            (point,) = s.ask(1)
            rows.append(fs.row(point))
            value = row_times[rows[-1]]
            s.tell([(point, float(value) if np.isfinite(value) else None)])
        picks.append(rows)
    assert picks[0] == picks[1]


def test_the_first_population_comes_from_built_kernels_when_there_are_enough(gemm):
    space, fs, _, ctx = gemm
    first = fs.point(0)
    kernel = {n: first[n] for n in space.compiled_params}
    built = dataclasses.replace(space, built=lambda p, problem: all(p[n] == v for n, v in kernel.items()))
    s = make_strategy("default", built, fs, seed=0, ctx=ctx, seeding="hardware")
    assert s.kernels is not None
    have = int((~s.kernels.new(np.arange(len(fs)))).sum())
    startup = min(have, 10)
    rows = s.seed_rows(startup)
    assert len(rows) == startup and not s.kernels.new(np.array(rows)).any()
    plain = make_strategy("default", built, fs, seed=0, ctx=ctx, seeding="hardware", compile_cost=0.0)
    assert plain.kernels is not None and plain.kernels.new(np.array(plain.seed_rows(have + 1))).any()

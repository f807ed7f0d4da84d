"""Transfer: ``default`` learning from related results (sources), and staying as it was without them."""

from __future__ import annotations

import math

import pytest
from conftest import LANDSCAPES, PNPOLY, ROOT

from evotune.compare import Target
from evotune.space import Context
from evotune.strategies import make_strategy
from evotune.transfer import from_landscape

H100 = ROOT / "experiments" / "landscapes" / "h100"
INT8 = "cute_hopper_gemm_gemm_int8_tn_{}.json.gz"

#: the rows ``default`` handed out on pnpoly_RTX_2080_Ti (seeds 0 and 7, ask(1) / tell), before sources existed
BEFORE = {
    0: [
        299, 4017, 30, 3200, 2003, 3598, 891, 1138, 2704, 2316, 1509, 3489, 90, 3093, 3062, 3121, 512, 1079,
        515, 2136, 497, 3753, 3596, 3101, 517, 42, 4071, 3581, 3590, 3128, 506, 3588, 520, 1542, 3570, 3589,
        4050, 3456, 3571, 3126, 524, 3594, 3328, 3595, 4083, 1014, 3720, 3329, 3586, 262, 2565, 1245, 2572,
        2571, 3159, 1549, 2558, 2566, 2556, 2573
    ],
    7: [
        3248, 723, 4059, 893, 1092, 3002, 29, 3129, 1897, 2542, 690, 756, 789, 921, 888, 822, 855, 1020,
        657, 558, 426, 294, 360, 162, 228, 459, 2029, 327, 2023, 393, 1977, 456, 2003, 720, 230, 357, 461,
        582, 1753, 621, 1945, 224, 71, 323, 453, 717, 1253, 2210, 2255, 3266, 394, 289, 441, 619, 1575,
        1115, 1482, 192, 525, 447
    ],
}


def rows_of(target: Target, seed: int, n: int, sources=(), **options) -> list[int]:
    space, fs, times = target.replay()
    s = make_strategy("default", space, fs, seed=seed, ctx=Context(problem=target.landscape.problem),
                      sources=sources, **options)
    rows = []
    for _ in range(n):
        (p,) = s.ask(1)
        r = fs.row(p)
        rows.append(r)
        t = float(times[r])
        s.tell([(p, None if math.isnan(t) else t)])
    return rows


@pytest.fixture(scope="module")
def pnpoly() -> Target:
    return Target.load(str(PNPOLY), 60)


def test_without_sources_default_proposes_exactly_what_it_did_before(pnpoly):
    for seed, before in BEFORE.items():
        assert rows_of(pnpoly, seed, 60) == before


def test_transfer_false_ignores_the_sources(pnpoly):
    other = Target.load(str(LANDSCAPES / "pnpoly_RTX_3060_laptop.json.gz"), 60)
    sources = [from_landscape(other.landscape, pnpoly.landscape.problem, "NVIDIA GeForce RTX 2080 Ti")]
    assert rows_of(pnpoly, 0, 60, sources, transfer=False) == BEFORE[0]
    assert rows_of(pnpoly, 0, 60, sources) != BEFORE[0]

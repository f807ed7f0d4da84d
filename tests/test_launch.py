"""Launch features (evotune.search.launch) and what they let a later key learn from earlier ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evotune.core.space import Context, SearchSpace, ordinal
from evotune.search import launch
from evotune.search.prior import Prior, Source
from evotune.search.strategies import make_strategy

SMS = 8
SPACE = SearchSpace("tiles", [ordinal("BLOCK", [4, 8, 16, 32, 64, 128]), ordinal("num_warps", [1, 2, 4, 8])])


def test_features_count_waves_and_programs() -> None:
    scaled, busy = launch.features(128, 132)
    assert scaled == pytest.approx(7 / launch.LOG2_MAX_PROGRAMS)
    assert busy == pytest.approx(128 / 132)
    assert launch.features(133, 132)[1] == pytest.approx(133 / 264)  # a second wave of one program
    assert launch.features(40, None) == (pytest.approx(math.log2(40) / 24), 1.0)
    assert launch.features(0, 132)[0] == 0.0  # an empty grid counts as one program
    assert launch.table([1, 2 ** 30], 4).tolist() == [[0.0, 0.25], [1.0, 1.0]]
    assert launch.programs_of((3, 4, 2)) == 24 and launch.programs_of(7) == 7 and launch.programs_of([5]) == 5


def _programs(m: int, point: dict) -> int:
    return math.ceil(m / point["BLOCK"])


def _time(m: int, point: dict) -> float:
    """Each wave costs a fixed start plus its programs' work: fastest where the launch fills the SMs once
    (8 programs) with the smallest blocks; warps matter a little."""
    waves = math.ceil(_programs(m, point) / SMS)
    return waves * (64 + point["BLOCK"] / 4) * (1.0 + 0.01 * abs(math.log2(point["num_warps"] / 4)))


def _source(m: int, distance: float) -> Source:
    fs = SPACE.feasible(Context())
    points = [fs.point(r) for r in range(len(fs))]
    return Source(f"m={m}", tuple((p, _time(m, p)) for p in points), distance,
                  tuple(launch.features(_programs(m, p), SMS) for p in points))


@pytest.mark.parametrize("with_launch", [True, False])
def test_the_prior_follows_the_launch_shape_to_a_new_key(with_launch: bool) -> None:
    """Keys M = 64 and 128 are fastest at 8 programs (BLOCK 8 and 16); at M = 256 that is BLOCK 32. By parameter
    values alone the sources point at BLOCK 8 or 16; through the launch features, at BLOCK 32."""
    fs = SPACE.feasible(Context())
    target = 256
    table = launch.table([_programs(target, fs.point(r)) for r in range(len(fs))], SMS) if with_launch else None
    strategy = make_strategy("default", SPACE, fs, seed=0, launch=table)
    sources = [_source(128, 1.0), _source(64, 2.0)]
    if not with_launch:
        sources = [Source(s.name, s.results, s.distance) for s in sources]
    prior = Prior(strategy, sources)
    first = fs.point(prior.picks(1)[0])  # the first transferred winner
    if with_launch:
        assert prior.names[0] == "launch:2 sources"
        assert first["BLOCK"] == 32 and fs.point(int(np.argmin(prior.z[0])))["BLOCK"] == 32
    else:
        assert prior.names == ["m=128", "m=64"] and first["BLOCK"] == 16


def test_a_source_without_launch_features_stays_out_of_the_launch_model() -> None:
    fs = SPACE.feasible(Context())
    table = launch.table([_programs(256, fs.point(r)) for r in range(len(fs))], SMS)
    strategy = make_strategy("default", SPACE, fs, seed=0, launch=table)
    plain = _source(128, 1.0)
    prior = Prior(strategy, [Source(plain.name, plain.results, plain.distance)])
    assert prior.names == ["m=128"]  # no launch column: nothing carried launch features


def test_launch_rows_must_match_the_feasible_set() -> None:
    fs = SPACE.feasible(Context())
    with pytest.raises(ValueError, match="one row per feasible point"):
        make_strategy("default", SPACE, fs, launch=np.zeros((3, launch.WIDTH)))


def test_strategies_with_launch_features_propose_fresh_feasible_points() -> None:
    fs = SPACE.feasible(Context())
    table = launch.table([_programs(256, fs.point(r)) for r in range(len(fs))], SMS)
    s = make_strategy("default", SPACE, fs, seed=1, launch=table, sources=[_source(128, 1.0)])
    seen = set()
    for _ in range(12):
        (p,) = s.ask(1)
        key = SPACE.key(p)
        assert key not in seen and p in fs
        seen.add(key)
        s.tell([(p, _time(256, p))])

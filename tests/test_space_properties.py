"""Property tests of the space API on random small spaces (hypothesis).

Round-trips (encode/decode, storage), nearest-point repair, enumeration against
sampling, and the strategy ledger: ``ask`` never hands out an infeasible or taken point.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evotune.core.space import Context, FeasibleSet, SearchSpace, boolean, categorical, constraint, ordinal, tuples
from evotune.search.strategies import make_strategy

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CTX = Context()

# Choice values like the real spaces': small ints, words, booleans, small int tuples.
WORDS = st.text(alphabet="abcdefghij_", min_size=1, max_size=4)


@st.composite
def params(draw, index: int):
    name = f"p{index}"
    kind = draw(st.sampled_from(["ordinal", "categorical", "boolean", "tuples"]))
    if kind == "ordinal":
        return ordinal(name, sorted(draw(st.sets(st.integers(-64, 512), min_size=1, max_size=5))))
    if kind == "categorical":
        return categorical(name, draw(st.lists(WORDS, min_size=1, max_size=5, unique=True)))
    if kind == "boolean":
        return boolean(name)
    pairs = st.tuples(st.integers(1, 4), st.integers(1, 4))
    return tuples(name, draw(st.lists(pairs, min_size=1, max_size=5, unique=True)))


@st.composite
def spaces(draw, min_feasible: int = 0):
    """A space of 1 to 4 parameters and a rule pruning a random share of its points (by a salted hash)."""
    ps = [draw(params(i)) for i in range(draw(st.integers(1, 4)))]
    salt = draw(st.integers(0, 2**16))
    share = draw(st.sampled_from([0, 10, 40, 70, 95]))  # percent of points pruned

    def allowed(point, ctx, ps=ps):
        code = tuple(p.index(point[p.name]) for p in ps)
        return zlib.crc32(f"{salt}:{code}".encode()) % 100 >= share

    space = SearchSpace("random", ps, constraints=[constraint("hashed", allowed, "pruned at random")])
    if min_feasible:
        from hypothesis import assume

        assume(len(space.feasible(CTX)) >= min_feasible)
    return space


@st.composite
def space_and_code(draw):
    space = draw(spaces())
    code = tuple(draw(st.integers(0, len(p.choices) - 1)) for p in space.params)
    return space, code


@FAST
@given(space_and_code())
def test_encode_decode_and_storage_round_trip(case):
    space, code = case
    point = space.decode(code)
    space.validate(point)
    assert space.encode(point) == code
    stored = space.to_storage(point)
    assert all(isinstance(v, (bool, int, float, str)) for v in stored.values())
    assert all(stored[p.name] in p.storage_choices() for p in space.params)
    assert space.from_storage(stored) == point
    assert space.decode(space.encode(space.from_storage(stored))) == point


@FAST
@given(spaces())
def test_keys_and_storage_values_tell_every_point_apart(space):
    points = list(space.points())
    assert len(points) == space.size
    assert len({space.key(p) for p in points}) == space.size
    assert len({tuple(space.to_storage(p).items()) for p in points}) == space.size


@FAST
@given(spaces())
def test_enumeration_agrees_with_the_constraints(space):
    fs = space.feasible(CTX)
    feasible = [p for p in space.points() if space.check(p, CTX) is None]
    assert len(fs) == len(feasible)
    assert sum(fs.pruned.values()) == space.size - len(fs)
    assert all(p in fs for p in feasible)
    assert all(space.check(fs.point(r), CTX) is None for r in range(len(fs)))
    assert all(fs.row(fs.point(r)) == r for r in range(len(fs)))
    assert len({tuple(c) for c in fs.codes.tolist()}) == len(fs)  # no row twice


@FAST
@given(space_and_code(), st.data())
def test_sampled_points_are_feasible_exactly_when_the_set_holds_them(case, data):
    space, code = case
    fs = space.feasible(CTX)
    for _ in range(5):
        code = tuple(data.draw(st.integers(0, len(p.choices) - 1)) for p in space.params)
        point = space.decode(code)
        assert (space.check(point, CTX) is None) == (point in fs) == (fs.row(point) is not None)
    # a set given by codes holds exactly those codes
    again = FeasibleSet.from_codes(space, fs.codes.tolist())
    assert len(again) == len(fs) and all(fs.point(r) in again for r in range(len(fs)))


@FAST
@given(space_and_code(), st.data())
def test_nearest_lands_on_a_free_feasible_row_at_the_least_distance(case, data):
    space, code = case
    fs = space.feasible(CTX)
    exclude = np.array(data.draw(st.lists(st.booleans(), min_size=len(fs), max_size=len(fs))), dtype=bool)
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    for ex in (None, exclude):
        row = fs.nearest(code, exclude=ex, rng=rng)
        free = np.ones(len(fs), dtype=bool) if ex is None else ~ex
        if not free.any():
            assert row is None
            continue
        assert row is not None and free[row]
        assert space.check(fs.point(row), CTX) is None
        d = fs.distances(code)
        assert d[row] == d[free].min()
        if space.check(space.decode(code), CTX) is None and (ex is None or not ex[fs.row(space.decode(code))]):
            assert d[row] == 0 and fs.point(row) == space.decode(code)  # a free feasible point is its own nearest


@SLOW
@given(spaces(min_feasible=1), st.sampled_from(["random", "ga", "exhaustive"]), st.integers(0, 2**16), st.data())
def test_ask_never_hands_out_an_infeasible_or_taken_point(space, name, seed, data):
    fs = space.feasible(CTX)
    options = {"population": 4, "offspring": 3} if name == "ga" else {}
    strategy = make_strategy(name, space, fs, seed=seed, ctx=CTX, **options)
    seen = set()
    # resume: some points were measured before
    warm = [fs.point(r) for r in range(len(fs)) if data.draw(st.booleans(), label="warm") and r % 3 == 0]
    strategy.warm_start([(p, float(i + 1)) for i, p in enumerate(warm)])
    seen.update(space.key(p) for p in warm)
    rounds = 0
    while True:
        rounds += 1
        assert rounds <= 2 * len(fs) + 2, "the strategy never runs out"
        batch = strategy.ask(data.draw(st.integers(1, 3), label="n"))
        if not batch:
            break
        for point in batch:
            key = space.key(point)
            assert space.check(point, CTX) is None and point in fs, point
            assert key not in seen, f"{key} handed out twice"
            seen.add(key)
        told = [(p, data.draw(st.one_of(st.none(), st.floats(0.01, 100.0)), label="value")) for p in batch]
        strategy.tell(told)
    assert len(seen) == len(fs) and strategy.remaining == 0  # it ran out only when every point was taken


# -- separators and look-alike choices, which would make two points share a key ----------------------------------
def test_text_choices_with_key_separators_are_refused():
    with pytest.raises(ValueError, match="may not hold"):
        SearchSpace("k", [categorical("a", ["1", "1,b=2"]), categorical("b", ["2,b=3", "3"])])


def test_choices_whose_storage_values_coincide_are_refused():
    with pytest.raises(ValueError, match="store alike"):
        categorical("c", [(1, 2), "1x2"])


def test_choices_that_storage_cannot_keep_are_refused():
    # a numpy integer is not an int to Optuna's JSON storage; None is (Triton's maxnreg default)
    with pytest.raises(ValueError, match=r"'c': np.int64\(64\) \(int64\) cannot be stored"):
        ordinal("c", [np.int64(64)])
    assert ordinal("maxnreg", [None, 128]).storage_choices() == (None, 128)

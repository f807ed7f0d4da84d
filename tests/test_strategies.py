"""Strategies: every one runs to its budget, never repeats a point, never proposes an infeasible one."""

from __future__ import annotations

import pytest

from evotune.core.hardware import get_hardware
from evotune.core.space import Context, SearchSpace, constraint, ordinal
from evotune.measurement.replay import ReplayEvaluator
from evotune.search.strategies import STRATEGIES, make_strategy
from evotune.search.strategies.genetic import GeneticAlgorithm

CPU_STRATEGIES = sorted(n for n in STRATEGIES if n != "optuna-gp")  # optuna-gp needs torch


def drive(strategy, space, ctx, objective, budget, batch=1):
    """Ask/tell to the budget; return the points in the order they were handed out."""
    asked = []
    while len(asked) < budget:
        points = strategy.ask(batch)
        if not points:
            break
        asked.extend(points)
        strategy.tell([(p, objective(p)) for p in points])
    return asked


@pytest.mark.parametrize("name", CPU_STRATEGIES)
def test_every_strategy_runs_to_its_budget_on_a_real_landscape(name, gemm_landscape):
    space = gemm_landscape.space()
    ctx = Context(problem=gemm_landscape.problem)
    fs = space.feasible(ctx)
    oracle = ReplayEvaluator(gemm_landscape)
    strategy = make_strategy(name, space, fs, seed=7, ctx=ctx)
    asked = drive(strategy, space, ctx, lambda p: oracle.evaluate(p, ctx.problem).value, 60, batch=3)
    assert len(asked) == 60
    keys = [space.key(p) for p in asked]
    assert len(set(keys)) == len(keys), "a point was handed out twice"
    assert all(space.check(p, ctx) is None for p in asked), "an infeasible point was handed out"


def constrained_space() -> tuple[SearchSpace, Context]:
    """A space where most of the product is infeasible, so children often need repair."""
    space = SearchSpace(
        "tight",
        [ordinal(f"x{i}", range(6)) for i in range(4)],
        constraints=[
            constraint("sum", lambda p, ctx: sum(p.values()) % 3 == 0, "sum must be a multiple of 3"),
            constraint("order", lambda p, ctx: p["x0"] <= p["x1"], "x0 must not exceed x1"),
        ],
    )
    return space, Context(get_hardware("H100"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ga_never_asks_for_an_infeasible_or_repeated_point(seed):
    space, ctx = constrained_space()
    fs = space.feasible(ctx)
    assert 0 < len(fs) < space.size / 4
    ga = make_strategy("ga", space, fs, seed=seed, ctx=ctx, population=8, offspring=8)

    def objective(p):
        if p["x2"] == 5:
            return None  # a failing kernel: the GA must survive failures too
        return 1.0 + (p["x0"] - 3) ** 2 + (p["x1"] - 4) ** 2 + p["x2"] + abs(p["x3"] - 2)

    asked = drive(ga, space, ctx, objective, len(fs))
    keys = [space.key(p) for p in asked]
    assert len(keys) == len(set(keys)) == len(fs), "the GA must cover the space exactly once, then stop"
    assert all(space.check(p, ctx) is None for p in asked)
    assert ga.ask(1) == []
    assert ga.generation > 3


def test_ga_operators_respect_each_genes_choices():
    import random

    from evotune.search.strategies.genetic import mutate_choice

    rnd = random.Random(0)
    sizes, ordered = [2, 5, 3], [True, True, False]
    for _ in range(500):
        ind = [rnd.randrange(k) for k in sizes]
        (child,) = mutate_choice(list(ind), sizes, ordered, indpb=1.0, rnd=rnd)
        assert all(0 <= g < k for g, k in zip(child, sizes, strict=True))
        assert child != ind


@pytest.mark.parametrize("name", ["ga", "tpe", "cmaes", "gp", "random"])
def test_strategies_are_reproducible_for_a_seed(name, pnpoly):
    space = pnpoly.space()
    ctx = Context(problem=pnpoly.problem)
    oracle = ReplayEvaluator(pnpoly)

    def run(seed):
        s = make_strategy(name, space, space.feasible(ctx), seed=seed, ctx=ctx)
        return [space.key(p) for p in drive(s, space, ctx, lambda p: oracle.evaluate(p, ctx.problem).value, 30)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_hardware_seeding_starts_from_the_best_estimates():
    space, ctx = constrained_space()
    space.estimate = lambda p, ctx: (p["x0"] - 3) ** 2 + (p["x1"] - 4) ** 2 + p["x2"] + abs(p["x3"] - 2)
    fs = space.feasible(ctx)
    ga = make_strategy("ga", space, fs, seed=0, ctx=ctx, population=10, offspring=10, seeding="hardware")
    first = ga.ask(10)
    best = min(space.estimate(fs.point(r), ctx) for r in range(len(fs)))
    assert space.estimate(first[0], ctx) == best


@pytest.mark.parametrize("seeding", ["hardware", "random"])
def test_a_first_population_one_short_asks_for_one_more_point(seeding):
    """The tuner asks ahead while points are in flight: with the first population one member short and its queue
    handed out, the strategy seeds exactly one more point (the ranked half of a population of one is all of it)."""
    space, ctx = constrained_space()
    space.estimate = lambda p, ctx: (p["x0"] - 3) ** 2 + (p["x1"] - 4) ** 2 + p["x2"] + abs(p["x3"] - 2)
    fs = space.feasible(ctx)
    ga = make_strategy("ga", space, fs, seed=0, ctx=ctx, population=12, offspring=12, seeding=seeding)
    first = ga.ask(12)
    ga.tell([(p, float(i)) for i, p in enumerate(first[:11])])
    (more,) = ga.ask(1)
    assert space.key(more) not in {space.key(p) for p in first}
    if seeding == "hardware":  # the best-estimated point nobody has taken
        rest = [fs.point(r) for r in range(len(fs)) if space.key(fs.point(r)) not in {space.key(p) for p in first}]
        assert space.estimate(more, ctx) == min(space.estimate(p, ctx) for p in rest)


@pytest.mark.parametrize("seeding", ["hardware", "random"])
@pytest.mark.parametrize("name", CPU_STRATEGIES)
def test_every_strategy_takes_results_late_and_out_of_order(name, seeding):
    """The tuner asks ahead while points compile and measure, and hears back in whatever order they finish: with a
    random number of points in flight and results told in a random order, no strategy fails, repeats a point or
    hands out an infeasible one before its budget."""
    import random

    space, ctx = constrained_space()
    space.estimate = lambda p, ctx: (p["x0"] - 3) ** 2 + (p["x1"] - 4) ** 2 + p["x2"] + abs(p["x3"] - 2)
    fs = space.feasible(ctx)
    rnd = random.Random(f"{name}-{seeding}")
    strategy = make_strategy(name, space, fs, seed=1, ctx=ctx, seeding=seeding)
    asked, flight = [], []
    while len(asked) < 40:
        more = strategy.ask(rnd.randint(1, 4))
        assert more, "a strategy ran dry with most of the space unmeasured"
        asked += more
        flight += more
        rnd.shuffle(flight)
        done = rnd.randint(0, len(flight))  # some finish now, in any order
        told, flight = flight[:done], flight[done:]
        strategy.tell([(p, None if p["x2"] == 5 else 1.0 + space.estimate(p, ctx)) for p in told])
    keys = [space.key(p) for p in asked]
    assert len(set(keys)) == len(keys), "a point was handed out twice"
    assert all(space.check(p, ctx) is None for p in asked), "an infeasible point was handed out"


def test_resumed_strategy_skips_what_the_study_holds(gemm_landscape):
    space = gemm_landscape.space()
    fs = space.feasible(Context())
    first = make_strategy("ga", space, fs, seed=0)
    done = drive(first, space, Context(), lambda p: gemm_landscape.lookup(p).value, 50)
    again = GeneticAlgorithm(space, fs, seed=0)
    again.warm_start([(p, gemm_landscape.lookup(p).value) for p in done])
    more = drive(again, space, Context(), lambda p: gemm_landscape.lookup(p).value, 50)
    assert not {space.key(p) for p in done} & {space.key(p) for p in more}


def test_unknown_option_is_refused():
    space, ctx = constrained_space()
    with pytest.raises(ValueError, match="unknown option"):
        make_strategy("ga", space, space.feasible(ctx), popsize=3)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_strategy_takes_no_budget_its_tuner_keeps_it(name):
    """The budget is the tuner's to keep (trials, seconds, plateau): a strategy given one would ignore it."""
    space, ctx = constrained_space()
    with pytest.raises(ValueError, match="budget: unknown option"):
        make_strategy(name, space, space.feasible(ctx), budget=10)


def test_a_space_declares_how_to_build_not_how_to_run_or_check():
    """A kernel is launched and checked through its problem's workload, never through fields of the space."""
    from dataclasses import fields

    names = {f.name for f in fields(SearchSpace)}
    assert "build" in names and not names & {"run", "reference", "make_inputs"}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_strategys_options_are_a_dataclass_whose_defaults_lie_in_their_ranges(name):
    from dataclasses import fields

    cls = STRATEGIES[name]
    defaults = cls.Options()  # each field checked against its type and range
    assert {f.name for f in fields(defaults)} == set(cls.Options.names()) >= {"seeding"}
    space, ctx = constrained_space()
    assert make_strategy(name, space, space.feasible(ctx)).options == defaults


def test_options_built_in_code_are_checked_as_the_experiment_files_are():
    from evotune.search.strategies.base import OptionError
    from evotune.search.strategies.genetic import GeneticOptions

    with pytest.raises(OptionError, match=r"^population: must be an integer >= 2, got 1$"):
        GeneticOptions(population=1)
    with pytest.raises(OptionError, match=r"^indpb: must be float in \[0.0, 1.0\] or omitted, got 2$"):
        GeneticOptions(indpb=2)
    assert GeneticOptions(cxpb=1).cxpb == 1.0 and isinstance(GeneticOptions(cxpb=1).cxpb, float)
    space, ctx = constrained_space()
    ga = make_strategy("ga", space, space.feasible(ctx), population=4, indpb=None)
    assert ga.options == GeneticOptions(population=4) and ga.mu == 4

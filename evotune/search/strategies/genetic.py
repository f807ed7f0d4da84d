"""A DEAP (mu + lambda) genetic algorithm over integer-coded genes.

Each gene is the index of a parameter's choice. The operators are small
functions registered into a DEAP toolbox:

* ``mate``: uniform crossover (``tools.cxUniform``);
* ``mutate``: :func:`mutate_choice`, which moves a gene to another of *its own*
  choices: for ordered parameters usually one step to a neighbour (4 -> 2 or 8),
  sometimes a jump; for categorical ones any other category;
* ``repair``: the nearest feasible point that was never measured nor handed
  out (:meth:`Strategy.repair`), so an infeasible or repeated child costs no
  evaluation;
* ``select``: ``tools.selBest`` over parents plus offspring (the mu + lambda
  survivor selection), with tournaments to pick parents.

Example::

    s = make_strategy("ga", space, feasible, seed=1, population=24, offspring=24)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Unpack

import numpy as np
from deap import base, creator, tools

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.strategies.base import Strategy, StrategyArgs
from evotune.search.strategies.options import StrategyOptions, option

if not hasattr(creator, "EvotuneFitness"):
    creator.create("EvotuneFitness", base.Fitness, weights=(-1.0,))
    creator.create("EvotuneIndividual", list, fitness=creator.EvotuneFitness, row=None)


def mutate_choice(ind: list[int], sizes: list[int], ordered: list[bool], indpb: float,
                  rnd: random.Random, jump: float = 0.2) -> tuple[list[int]]:
    """Move each gene, with probability ``indpb``, to another of its choices."""
    for i, (k, is_ordered) in enumerate(zip(sizes, ordered, strict=True)):
        if k < 2 or rnd.random() >= indpb:
            continue
        if is_ordered and rnd.random() >= jump:
            step = rnd.choice((-1, 1))
            new = ind[i] + step
            ind[i] = new if 0 <= new < k else ind[i] - step  # bounce off the ends
        else:
            ind[i] = rnd.choice([c for c in range(k) if c != ind[i]])
    return (ind,)


@dataclass(frozen=True, kw_only=True)
class GeneticOptions(StrategyOptions):
    population: int = option(20, low=2)  # mu: the individuals that survive each generation
    offspring: int = option(20, low=1)  # lambda: the children bred each generation
    cxpb: float = option(0.5, low=0.0, high=1.0)  # a child's chance of being a crossover (else a mutant)
    mutpb: float = option(0.5, low=0.0, high=1.0)  # a crossover child's chance of being mutated too
    indpb: float | None = option(None, low=0.0, high=1.0)  # each gene's chance to mutate (None: 1 / genes, >= 0.1)
    tournament: int = option(3, low=1)  # the tournament's size when parents are picked


class GeneticAlgorithm(Strategy):
    name = "ga"
    Options = GeneticOptions
    options: GeneticOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: GeneticOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or GeneticOptions(), **args)
        o = self.options
        self.mu, self.lam = o.population, o.offspring
        self.rnd = random.Random(self.seed)  # DEAP's operators draw from `random`; keep ours private
        params = self.space.params
        sizes = [len(p.choices) for p in params]
        indpb = o.indpb if o.indpb is not None else max(1.0 / len(params), 0.1)
        tb = base.Toolbox()
        tb.register("mate", self._with_rnd, tools.cxUniform, indpb=0.5)
        tb.register("mutate", mutate_choice, sizes=sizes, ordered=[p.ordered for p in params],
                    indpb=indpb, rnd=self.rnd)
        tb.register("parent", self._with_rnd, tools.selTournament, tournsize=o.tournament)
        tb.register("select", tools.selBest)
        self.toolbox = tb
        self.population: list[Any] = []  # evaluated individuals that survived selection
        self.offspring: list[Any] = []  # evaluated children of the current generation
        self.generation = 0
        self._queue: list[int] = []  # rows of the first population not yet handed out

    def _with_rnd(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        # DEAP operators use the global `random`; swap our generator in for reproducibility
        state = random.getstate()
        random.setstate(self.rnd.getstate())
        try:
            return op(*args, **kwargs)
        finally:
            self.rnd.setstate(random.getstate())
            random.setstate(state)

    def _individual(self, row: int, value: float | None) -> Any:
        ind = creator.EvotuneIndividual(int(v) for v in self.feasible.codes[row])
        ind.row = row
        ind.fitness.values = (value if value is not None else np.inf,)
        return ind

    def _propose(self) -> int | None:
        if len(self.population) + len(self.offspring) < self.mu and not self._queue and self.generation == 0:
            self._queue = self.seed_rows(self.mu - len(self.population) - len(self.offspring))
        while self._queue:
            row = self._queue.pop(0)
            if not self.taken[row]:
                return row
        if len(self.population) < 2:
            return self.random_fresh()
        return self._breed()

    def _breed(self) -> int | None:
        tb = self.toolbox
        parents = [tb.clone(p) for p in tb.parent(self.population, 2)]
        r = self.rnd.random()
        if r < self.options.cxpb:
            child, _ = tb.mate(parents[0], parents[1])
            if self.rnd.random() < self.options.mutpb:
                (child,) = tb.mutate(child)
        else:
            (child,) = tb.mutate(parents[0])
        code = list(child)
        row = self.feasible.row(self.space.decode(code)) if self._valid(code) else None
        if row is not None and not self.taken[row]:
            return row
        # repair: the nearest fresh feasible point to the infeasible or repeated child
        return self.repair(code)

    def _valid(self, code: list[int]) -> bool:
        return all(0 <= c < len(p.choices) for c, p in zip(code, self.space.params, strict=True))

    def _observe(self, row: int, value: float | None) -> None:
        ind = self._individual(row, value)
        if len(self.population) < self.mu and self.generation == 0:
            self.population.append(ind)
            return
        self.offspring.append(ind)
        if len(self.offspring) >= self.lam:
            self.population = self.toolbox.select(self.population + self.offspring, self.mu)
            self.offspring = []
            self.generation += 1

"""Optuna's samplers (TPE, CMA-ES, NSGA-II, QMC, GP) behind evotune's ask/tell.

Each strategy drives a private in-memory Optuna study whose parameters are the
choice *indices*: ordered parameters as integers (so CMA-ES with margin and
TPE see a neighbourhood), unordered ones as categories. A proposal that is
infeasible or already measured is repaired to the nearest fresh feasible
point; the sampler's trial is told the value measured there, so it learns
where its proposals lead. The user's persistent study (see ``study.py``)
records the real points, whatever the sampler.

Example::

    s = make_strategy("tpe", space, feasible, seed=3, startup=10)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Unpack

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.strategies.base import Strategy, StrategyArgs
from evotune.search.strategies.options import StrategyOptions, option

optuna.logging.set_verbosity(optuna.logging.WARNING)


class OptunaStrategy(Strategy):
    """Base for strategies that wrap an ``optuna.samplers.BaseSampler``."""

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: StrategyOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options, **args)
        self.dists: dict[str, BaseDistribution] = {
            p.name: IntDistribution(0, len(p.choices) - 1) if p.ordered
            else CategoricalDistribution(list(range(len(p.choices))))
            for p in self.space.params
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature warnings from some samplers
            self.study = optuna.create_study(direction="minimize", sampler=self.make_sampler())
        self.pending: dict[int, optuna.trial.Trial] = {}
        if self.seeding == "hardware":
            for row in self.seed_rows(self.hardware_seeds):
                self.study.enqueue_trial(self._params(row))

    @property
    def hardware_seeds(self) -> int:
        """How many points ``seeding = "hardware"`` puts first: the sampler's start-up trials, else 10."""
        return 10

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def _params(self, row: int) -> dict[str, int]:
        return {p.name: int(c) for p, c in zip(self.space.params, self.feasible.codes[row], strict=True)}

    def _propose(self) -> int | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trial = self.study.ask(self.dists)
        code = [trial.params[p.name] for p in self.space.params]
        row = self.feasible.row(self.space.decode(code))
        if row is None or self.taken[row]:
            row = self.repair(code)
        if row is None:
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return None
        self.pending[row] = trial
        return row

    def _observe(self, row: int, value: float | None) -> None:
        score = value if value is not None else self.penalty()
        trial = self.pending.pop(row, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if trial is not None:
                self.study.tell(trial, score)
            else:  # measured elsewhere (resume, another worker): teach the sampler all the same
                self.study.add_trial(optuna.trial.create_trial(
                    params=self._params(row), distributions=self.dists, value=score))


@dataclass(frozen=True, kw_only=True)
class TPEOptions(StrategyOptions):
    startup: int = option(10, low=0)  # random trials before the sampler models
    multivariate: bool = option(True)  # one density over all parameters, not one per parameter


class TPE(OptunaStrategy):
    name = "tpe"
    Options = TPEOptions
    options: TPEOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: TPEOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or TPEOptions(), **args)

    @property
    def hardware_seeds(self) -> int:
        return self.options.startup or 10

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=self.seed, n_startup_trials=self.options.startup,
            multivariate=self.options.multivariate, constant_liar=True)


@dataclass(frozen=True, kw_only=True)
class CMAESOptions(StrategyOptions):
    startup: int = option(1, low=0)  # random trials before the first generation
    popsize: int | None = option(None, low=2)  # a generation's size (None: the sampler's own rule)


class CMAES(OptunaStrategy):
    """CMA-ES with margin (Hamano et al. 2022), which keeps integer variables from stalling."""

    name = "cmaes"
    Options = CMAESOptions
    options: CMAESOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: CMAESOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or CMAESOptions(), **args)

    @property
    def hardware_seeds(self) -> int:
        return self.options.startup or 10

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.CmaEsSampler(
            seed=self.seed, n_startup_trials=self.options.startup, with_margin=True,
            popsize=self.options.popsize, warn_independent_sampling=False)


@dataclass(frozen=True, kw_only=True)
class NSGA2Options(StrategyOptions):
    population: int = option(20, low=2)  # a generation's size


class NSGA2(OptunaStrategy):
    name = "nsga2"
    Options = NSGA2Options
    options: NSGA2Options

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: NSGA2Options | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or NSGA2Options(), **args)

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=self.seed, population_size=self.options.population)


class QMC(OptunaStrategy):
    """Scrambled Sobol' points: a space-filling design, no learning."""

    name = "qmc"

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=self.seed,
                                          warn_independent_sampling=False)


@dataclass(frozen=True, kw_only=True)
class OptunaGPOptions(StrategyOptions):
    startup: int = option(10, low=1)  # random trials before the GP models


class OptunaGP(OptunaStrategy):
    """Optuna's own GPSampler; needs torch (the ``gpu`` extra). ``gp`` works without it."""

    name = "optuna-gp"
    Options = OptunaGPOptions
    options: OptunaGPOptions

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: OptunaGPOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options or OptunaGPOptions(), **args)

    @property
    def hardware_seeds(self) -> int:
        return self.options.startup

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            raise ValueError("strategy 'optuna-gp' needs torch; use 'gp', which needs only numpy") from exc
        return optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.options.startup)

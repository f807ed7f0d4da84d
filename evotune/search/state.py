"""What a strategy knows at one moment, as the parts of a search that work beside it read it.

The surrogate (:mod:`evotune.search.surrogate`), the prior (:mod:`evotune.search.prior`) and the
seeding (:mod:`evotune.search.seeding`) read a strategy's state but never drive it, so they depend on
this protocol rather than on :class:`evotune.search.strategies.base.Strategy`, which uses them.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evotune.core.space import Context, FeasibleSet, SearchSpace
from evotune.search.compile_cost import Kernels


class StrategyState(Protocol):
    space: SearchSpace
    feasible: FeasibleSet
    ctx: Context
    seed: int
    seeding: str
    rng: np.random.Generator
    taken: np.ndarray  # bool per feasible row: measured or handed out
    values: dict[int, float | None]  # row -> told value (None: failed)
    kernels: Kernels | None
    launch: np.ndarray | None  # launch features per feasible row (evotune.search.launch), when known

    @property
    def compile_cost(self) -> float:
        """A new kernel's cost in evaluations where the strategy weighs it (0: every point costs the same)."""
        ...

    def penalty(self) -> float:
        """The score a failed point gets where a number is needed: worse than anything seen."""
        ...

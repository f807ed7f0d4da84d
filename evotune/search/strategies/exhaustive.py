"""Every feasible point once, best predicted first when the space has an estimate; or a given list of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from evotune.core.space import FeasibleSet, SearchSpace
from evotune.search.seeding import ranked_by_estimate
from evotune.search.strategies.base import Strategy, StrategyArgs, StrategyOptions


class Exhaustive(Strategy):
    name = "exhaustive"
    adapts = False

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: StrategyOptions | None = None,
                 **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options, **args)
        ranked = ranked_by_estimate(self) if self.seeding == "hardware" else []
        #: the rows in the order they are proposed
        self.order: list[int] = ranked or list(range(len(self.feasible)))
        self._order = iter(self.order)

    def _propose(self) -> int | None:
        for row in self._order:
            if not self.taken[row]:
                return row
        return None


class Listed(Strategy):
    """The feasible rows ``rows``, in that order, and nothing else (a sampled recording's plan).

    Example::

        s = Listed(space, feasible, rows=[12, 7, 40])
        s.ask(3)  # those three points
    """

    name = "listed"
    adapts = False

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: StrategyOptions | None = None, *,
                 rows: list[int], **args: Unpack[StrategyArgs]):
        super().__init__(space, feasible, options, **args)
        self._order = iter(rows)

    def _propose(self) -> int | None:
        for row in self._order:
            if not self.taken[row]:
                return row
        return None

    def _claim(self, row: int | None, code: Sequence[int] | None = None) -> int | None:
        if row is None:  # the list is done: no other point is handed out
            return None
        return super()._claim(row, code)

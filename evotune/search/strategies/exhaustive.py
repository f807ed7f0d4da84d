"""Every feasible point once, best predicted first when the space has an estimate; or a given list of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evotune.search.seeding import ranked_by_estimate
from evotune.search.strategies.base import Strategy


class Exhaustive(Strategy):
    name = "exhaustive"
    adapts = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
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

    def __init__(self, *args: Any, rows: list[int], **kwargs: Any):
        super().__init__(*args, **kwargs)
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

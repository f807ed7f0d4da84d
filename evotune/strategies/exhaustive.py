"""Every feasible point once, best predicted first when the space has an estimate."""

from __future__ import annotations

from evotune.strategies.base import Strategy
from evotune.strategies.seeding import ranked_by_estimate


class Exhaustive(Strategy):
    name = "exhaustive"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        order = ranked_by_estimate(self) if self.seeding == "hardware" else []
        self._order = iter(order or range(len(self.feasible)))

    def _propose(self) -> int | None:
        for row in self._order:
            if not self.taken[row]:
                return row
        return None

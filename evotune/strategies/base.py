"""The one call shape every strategy has: ``ask(n)`` points, ``tell(results)``.

A strategy sees only points and scores (time in ms, lower is better; None for
a failed point). It never touches a GPU and never decides how to measure.

Every point a strategy returns from :meth:`Strategy.ask` is feasible and has
been neither measured nor handed out before: the base class keeps that
ledger and repairs any proposal that breaks it to the nearest point that
keeps it, so no strategy can spend an evaluation on an infeasible or repeated
point.

Example::

    from evotune.strategies import make_strategy
    s = make_strategy("ga", space, feasible, seed=0)
    for point in s.ask(4):
        s.tell([(point, measure(point))])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from evotune.space import Context, FeasibleSet, Point, SearchSpace

Told = tuple[Point, float | None]


class Exhausted(Exception):
    """Every feasible point has been measured or handed out."""


class Strategy(ABC):
    name: ClassVar[str] = "base"
    #: options accepted from the experiment file, with their defaults
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, *, seed: int = 0,
                 ctx: Context | None = None, budget: int | None = None, **options: Any):
        unknown = sorted(set(options) - set(self.defaults) - {"seeding"})
        if unknown:
            raise ValueError(f"unknown option(s) {unknown} for strategy {self.name!r}; "
                             f"accepted: {[*sorted(self.defaults), 'seeding']}")
        self.space = space
        self.feasible = feasible
        self.ctx = ctx or Context()
        self.seed = seed
        self.budget = budget
        self.options = {**self.defaults, **options}
        self.seeding: str = options.get("seeding", "random")
        if self.seeding not in ("random", "hardware"):
            raise ValueError(f"seeding must be 'random' or 'hardware', got {self.seeding!r}")
        self.rng = np.random.default_rng(seed)
        n = len(feasible)
        self.taken = np.zeros(n, dtype=bool)  # measured or handed out
        self.values: dict[int, float | None] = {}  # row -> told value

    # -- the interface ---------------------------------------------------
    def ask(self, n: int = 1) -> list[Point]:
        """Up to ``n`` fresh feasible points (fewer only when the space runs out)."""
        rows: list[int] = []
        for _ in range(n):
            if self.taken.all():
                break
            row = self._propose()
            row = self._claim(row)
            if row is None:
                break
            rows.append(row)
        return [self.feasible.point(r) for r in rows]

    def tell(self, results: Sequence[Told]) -> None:
        """Report measured points. Points measured elsewhere (resume) are welcome too."""
        for point, value in results:
            row = self.feasible.row(point)
            if row is None:
                continue  # infeasible in this context: nothing to learn here
            self.taken[row] = True
            self.values[row] = value
            self._observe(row, value)

    def warm_start(self, history: Sequence[Told]) -> None:
        """Take in the trials a study already holds, e.g. when resuming."""
        self.tell(history)

    @property
    def remaining(self) -> int:
        return int((~self.taken).sum())

    # -- what subclasses provide -----------------------------------------
    @abstractmethod
    def _propose(self) -> int | None:
        """A feasible row to try next; may be taken already (it is then repaired)."""

    def _observe(self, row: int, value: float | None) -> None:  # noqa: B027 - optional hook
        """Learn from one told result."""

    # -- shared machinery ------------------------------------------------
    def _claim(self, row: int | None, code: Sequence[int] | None = None) -> int | None:
        """Mark ``row`` handed out, repairing to the nearest fresh row if it is taken."""
        if row is None or self.taken[row]:
            origin = code if code is not None else (self.feasible.codes[row] if row is not None else None)
            row = self.repair(origin)
            if row is None:
                return None
        self.taken[row] = True
        return row

    def repair(self, code: Sequence[int] | None) -> int | None:
        """The nearest fresh feasible row to ``code`` (any fresh row when ``code`` is None)."""
        if code is None:
            return self.random_fresh()
        return self.feasible.nearest(code, exclude=self.taken, rng=self.rng)

    def random_fresh(self) -> int | None:
        free = np.flatnonzero(~self.taken)
        return int(self.rng.choice(free)) if len(free) else None

    def seed_rows(self, n: int) -> list[int]:
        """The first population: ranked by the hardware model, or a spread-out random sample."""
        from evotune.strategies.seeding import initial_rows

        return initial_rows(self, n)

    @property
    def best_value(self) -> float | None:
        vals = [v for v in self.values.values() if v is not None]
        return min(vals) if vals else None

    def penalty(self) -> float:
        """The score a failed point gets where a sampler needs a number: worse than anything seen."""
        vals = [v for v in self.values.values() if v is not None]
        return 2.0 * max(vals) if vals else 1e9

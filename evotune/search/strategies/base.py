"""The one call shape every strategy has: ``ask(n)`` points, ``tell(results)``.

A strategy sees only points and scores (time in ms, lower is better; None for
a failed point). It never touches a GPU and never decides how to measure.

Every point a strategy returns from :meth:`Strategy.ask` is feasible and has
been neither measured nor handed out before: the base class keeps that
ledger and repairs any proposal that breaks it to the nearest point that
keeps it, so no strategy can spend an evaluation on an infeasible or repeated
point.

Example::

    from evotune.search.strategies import make_strategy
    s = make_strategy("ga", space, feasible, seed=0)
    for point in s.ask(4):
        s.tell([(point, measure(point))])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

import numpy as np

from evotune.core.space import Context, FeasibleSet, Point, SearchSpace
from evotune.search.compile_cost import Kernels
from evotune.search.strategies.options import OptionError, StrategyOptions

if TYPE_CHECKING:
    from evotune.search.prior import Source

Told = tuple[Point, float | None]


class StrategyArgs(TypedDict, total=False):
    """What a strategy is built with besides its space, its feasible points and its options (see
    :class:`Strategy`)."""

    seed: int
    ctx: Context | None
    sources: Sequence[Source]
    launch: np.ndarray | None
    first: Sequence[Point]


class Strategy(ABC):
    name: ClassVar[str] = "base"
    #: the options it accepts (from the experiment file, or as keywords of make_strategy)
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    options: StrategyOptions
    #: whether the strategy learns from related results (``sources``); the others ignore them
    transfers: ClassVar[bool] = False
    #: whether what it proposes depends on the results it is told (an order fixed beforehand does not): the
    #: tuning loop hands an adaptive strategy's proposals out a pool's worth at a time, so that it hears results
    #: before it proposes more, and the others' twice as many (:meth:`Evaluator.to_ask`)
    adapts: ClassVar[bool] = True

    @classmethod
    def parse_options(cls, given: Mapping[str, Any]) -> StrategyOptions:
        """Its options from ``given``; OptionError for an unknown option or a value of the wrong type or range."""
        return cls.Options.parse(given, cls.name)

    def __init__(self, space: SearchSpace, feasible: FeasibleSet, options: StrategyOptions | None = None, *,
                 seed: int = 0, ctx: Context | None = None, sources: Sequence[Source] = (),
                 launch: np.ndarray | None = None, first: Sequence[Point] = ()):
        self.sources = tuple(sources)
        if launch is not None and len(launch) != len(feasible):
            raise ValueError(f"launch: one row per feasible point expected ({len(feasible)}), got {len(launch)}")
        #: the launch's shape at each feasible row (evotune.search.launch), for kernels whose grid is known
        self.launch = launch
        self.space = space
        self.feasible = feasible
        self.ctx = ctx or Context()
        self.seed = seed
        self.options = options if options is not None else self.Options()
        self.seeding: str = self.options.seeding
        self.rng = np.random.default_rng(seed)
        n = len(feasible)
        self.taken = np.zeros(n, dtype=bool)  # measured or handed out
        self.values: dict[int, float | None] = {}  # row -> told value
        self._startup: list[int] = []  # see startup_row
        self._ahead: list[int] = []  # see ahead
        #: points proposed before anything the strategy chooses (the feasible ones): configurations a user would
        #: otherwise deploy, so that the search hears first how good the untuned choice is and looks around it
        self._first = [r for r in map(feasible.row, first) if r is not None]
        # which points share a compiled kernel, for spaces whose launch arguments are free (see kernels.py)
        self.kernels = Kernels.of(space, feasible, self.ctx)

    # -- the interface ---------------------------------------------------
    def ask(self, n: int = 1) -> list[Point]:
        """Up to ``n`` fresh feasible points (fewer only when the space runs out)."""
        rows: list[int] = []
        for _ in range(n):
            if self.taken.all():
                break
            while self._first and self.taken[self._first[0]]:
                self._first.pop(0)
            if self._first:
                row: int | None = self._first.pop(0)
                self._ahead = list(self._first)
            else:
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
            if self.kernels is not None:
                self.kernels.mark(row)
            self._observe(row, value)

    def warm_start(self, history: Sequence[Told]) -> None:
        """Take in the trials a study already holds, e.g. when resuming."""
        self.tell(history)

    def ahead(self, n: int) -> list[Point]:
        """Up to ``n`` fresh points the strategy ranked next when it made its latest proposal, most likely first,
        not handed out: what a compile pool may build while that proposal is measured (:meth:`building`). Empty
        when it keeps no ranking."""
        rows = [r for r in self._ahead if not self.taken[r]][:n]
        return [self.feasible.point(r) for r in rows]

    def building(self, points: Sequence[Point]) -> None:
        """``points`` are being built (on speculation): their kernels cost no compile in the next proposals."""
        if self.kernels is None:
            return
        for point in points:
            row = self.feasible.row(point)
            if row is not None:
                self.kernels.mark(row)

    @property
    def remaining(self) -> int:
        return int((~self.taken).sum())

    @property
    def compile_cost(self) -> float:
        """A new kernel's cost in evaluations where its proposals weigh it (0: every point costs the same)."""
        return 0.0

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
        if self.kernels is not None:
            self.kernels.mark(row)
        return row

    def repair(self, code: Sequence[int] | None) -> int | None:
        """The nearest fresh feasible row to ``code`` (any fresh row when ``code`` is None)."""
        if code is None:
            return self.random_fresh()
        return self.feasible.nearest(code, exclude=self.taken, rng=self.rng)

    def random_fresh(self) -> int | None:
        free = np.flatnonzero(~self.taken)
        return int(self.rng.choice(free)) if len(free) else None

    def startup_row(self, n: int) -> int | None:
        """The next untaken point of the first ``n`` (:meth:`seed_rows`), else any fresh one.

        For strategies that learn only once they have ``n`` results.
        """
        if not self._startup:
            self._startup = self.seed_rows(n)
        while self._startup:
            row = self._startup.pop(0)
            if not self.taken[row]:
                self._ahead = list(self._startup)
                return row
        return self.random_fresh()

    def seed_rows(self, n: int) -> list[int]:
        """The first population: ranked by the hardware model, or a spread-out random sample."""
        from evotune.search.seeding import initial_rows

        return initial_rows(self, n)

    def penalty(self) -> float:
        """The score a failed point gets where a sampler needs a number: worse than anything seen."""
        vals = [v for v in self.values.values() if v is not None]
        return 2.0 * max(vals) if vals else 1e9


__all__ = ["OptionError", "Strategy", "StrategyArgs", "StrategyOptions", "Told"]

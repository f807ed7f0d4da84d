"""Uniform random sampling without replacement over the feasible points.

This is the baseline every other strategy must beat: exactly what the
expected-best-of-random formula in ``compare`` assumes.
"""

from __future__ import annotations

from evotune.search.strategies.base import Strategy


class RandomSearch(Strategy):
    name = "random"

    def _propose(self) -> int | None:
        return self.random_fresh()

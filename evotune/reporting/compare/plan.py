"""What a comparison runs: the checked plan of landscapes, strategies, budgets and seeds, and its error."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class CompareError(ValueError):
    """A bad argument or input; one line, shown by the command line with exit code 2."""


@dataclass
class ComparePlan:
    landscapes: list[str]
    strategies: list[str]
    budgets: list[int]
    repeats: int
    seed: int
    out: Path

    @property
    def seeds(self) -> list[int]:
        return [self.seed + r for r in range(self.repeats)]

"""``default``: Gaussian-process-guided search with local moves around the incumbent.

Design (each ingredient kept because a measurement supported it; see the numbers
in the report of issue #5 and ``benchmarks/strategies.py``):

1. **Start**: ``startup`` points spread out by greedy max-min distance
   (:func:`seeding.initial_rows`; with ``seeding = "hardware"`` half come from the
   hardware model's ranking).
2. **Surrogate**: a Gaussian process on standardised log-time (Matérn-5/2 on
   the normalised choice indices, one-hot for categories; single-valued
   parameters dropped), its length-scale chosen by marginal likelihood every
   ``refit`` observations, as in :mod:`evotune.strategies.gp`. A failed point
   (told ``None``) is learnt as twice the slowest time seen, so the model steers
   away from failing regions. Points handed out but not yet told (``ask(n)``
   with n > 1) are constant liars at the best value.
3. **Global step** (probability ``1 - local``): expected improvement over a
   random sample of ``candidates`` fresh feasible points plus the fresh one-move
   neighbours of the ``elite`` best points, so the sample never misses the
   incumbent's surroundings on large spaces.
4. **Local step** (probability ``local``): the fresh one-move neighbour of the
   incumbent with the best predicted time. A move changes one ordered parameter
   to the nearest *feasible* choice below or above (skipping constraint gaps) or
   one category to another. When the incumbent's neighbourhood is spent, its
   two-move neighbourhood is used. Measured on convolution_MI250X (tuning half,
   5 seeds): pure GP-EI stalled at a median fraction of 0.675 from 100 to 200
   evaluations (the optimum lies two moves of ``tile_size_y`` away, across a
   worse point); the two-move fallback reached 1.0 by 200.

What did not help (measured, not kept): a larger candidate sample (5000, the whole
convolution space) left the same stall on convolution_MI250X and tripled ask() time;
skipping infeasible gaps alone (without the two-move fallback) did not lift it either.

Every proposal is a fresh feasible row; the base class's ledger repairs anything
else. Deterministic per seed: all randomness comes from ``self.rng``.

Status (2026-11-22): work in progress for issue #5 (numbers in benchmarks/RESULTS.md). On the 43
H100 CuTe DSL landscapes it leads ``ga`` at budgets 25-100 and ties it at 200, reaching 0.99 of the
optimum within 10% of the points on 41 of 43. On the 12 shared Kernel Tuner landscapes it beats
``ga`` only at budgets 50 and 100: it loses at 25 (convolution_MI250X) and stalls on
convolution_A6000 (0.82 against 0.98 at 200), and its ask() cost exceeds 50 ms on some landscapes.
``ga`` stays the strategy the examples use until ``benchmarks/strategies.py`` shows otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evotune.strategies import gp
from evotune.strategies.base import Option, Strategy


class Default(Strategy):
    name = "default"
    schema = {
        "startup": Option(8, int, 1),
        "candidates": Option(1500, int, 1),
        "local": Option(0.3, float, 0.0, 1.0),
        "elite": Option(3, int, 1),
        "noise": Option(1e-3, float, 1e-9, 1.0),
        "xi": Option(0.0, float, 0.0, 10.0),
        "refit": Option(10, int, 1),
    }

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model = gp.Surrogate(self, float(self.options["noise"]), int(self.options["refit"]))
        self._nbr: dict[int, np.ndarray] = {}

    def _propose(self) -> int | None:
        if len(self.values) < int(self.options["startup"]):
            return self.startup_row(int(self.options["startup"]))
        return self._model_step()

    def _neighbours_of(self, row: int) -> np.ndarray:
        """Feasible rows one move from ``row``: one ordered index +-1, or one category changed (cached)."""
        got = self._nbr.get(row)
        if got is None:
            fs = self.feasible
            code = [int(c) for c in fs.codes[row]]
            found = []
            for j, p in enumerate(self.space.params):
                k = len(p.choices)
                if p.ordered:  # the nearest feasible choice below and above, skipping infeasible gaps
                    for span in (range(code[j] - 1, -1, -1), range(code[j] + 1, k)):
                        for c in span:
                            r = fs.row_of((*code[:j], c, *code[j + 1:]))
                            if r is not None:
                                found.append(r)
                                break
                else:
                    for c in range(k):
                        r = fs.row_of((*code[:j], c, *code[j + 1:])) if c != code[j] else None
                        if r is not None:
                            found.append(r)
            got = self._nbr[row] = np.array(found, dtype=np.int64)
        return got

    def _neighbours(self, rows: list[int]) -> np.ndarray:
        """Fresh rows one move from any of ``rows``."""
        if not rows:
            return np.zeros(0, dtype=np.int64)
        cand = np.unique(np.concatenate([self._neighbours_of(r) for r in rows]))
        return cand[~self.taken[cand]]

    def _model_step(self) -> int | None:
        told = list(self.values)
        ok_rows = [r for r in told if self.values[r] is not None]
        if not ok_rows:
            return self.random_fresh()
        ranked = sorted(ok_rows, key=lambda r: self.values[r])  # type: ignore[arg-type, return-value]
        elite = ranked[: int(self.options["elite"])]
        local = self.rng.random() < float(self.options["local"])
        if local:
            cand = self._neighbours(elite[:1])
            if not len(cand):  # the incumbent's one-move neighbourhood is spent: two moves away
                cand = self._neighbours([int(r) for r in self._neighbours_of(elite[0])])
            if not len(cand):
                cand = self._neighbours(elite)
            if not len(cand):
                local = False
        if not local:
            free = np.flatnonzero(~self.taken)  # never empty: ask() stops when every point is taken
            ncand = int(self.options["candidates"])
            cand = self.rng.choice(free, size=ncand, replace=False) if len(free) > ncand else free
            cand = np.unique(np.concatenate([cand, self._neighbours(elite)]))
        model = self.model.fit()
        if model is None:
            return int(self.rng.choice(cand))
        mu, sigma = self.model.predict(model, cand)
        if local:
            return int(cand[int(np.argmin(mu))])
        ei = gp.expected_improvement(mu, sigma, model.best - float(self.options["xi"]))
        return int(cand[int(np.argmax(ei))])

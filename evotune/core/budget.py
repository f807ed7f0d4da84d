"""A study's budget, and the one rule that says when a study stops.

The tuning loop asks :meth:`Budget.stop_reason` after every result, resuming a study asks it of the stored
trials, and the claims hold the trials budget for all workers together with the same ``trials`` count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    trials: int | None = None
    seconds: float | None = None  # on the tuning clock: simulated for replay, wall time on a GPU
    plateau: int | None = None  # stop after this many evaluations without a new best

    def stop_reason(self, trials: int, clock: float, since_best: int) -> str | None:
        """Why a study with ``trials`` results, ``clock`` seconds on its tuning clock and ``since_best`` results
        since its best stops now ("trials", "seconds", "plateau"), or None while it goes on."""
        if self.trials is not None and trials >= self.trials:
            return "trials"
        if self.seconds is not None and clock >= self.seconds:
            return "seconds"
        if self.plateau is not None and trials > 0 and since_best >= self.plateau:
            return "plateau"
        return None

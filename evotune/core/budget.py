"""A study's budget, and the one rule that says when a study stops.

The tuning loop asks :meth:`Budget.stop_reason` after every result, resuming a study asks it of the stored
trials, and the claims hold the trials budget for all workers together with the same ``trials`` count.
"""

from __future__ import annotations

from dataclasses import dataclass

SHORT = 5  # a study that stopped before a 1/SHORT share of its trials budget says so where it is reported


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


def stopped_short(stopped: str, trials: int, budget_trials: int | None) -> bool:
    """Whether a study that stopped (``stopped``: "seconds", "plateau", ...) with ``trials`` did so before a fifth
    of its trials budget: its best is the best of few points. A strategy that ran out of points ("exhausted")
    measured every one it could."""
    return bool(budget_trials) and stopped != "exhausted" and trials * SHORT < (budget_trials or 0)


def stop_text(stopped: str, trials: int, budget_trials: int | None) -> str:
    """'stopped on seconds', with 'after 1 of 24 trials' where the study :func:`stopped_short`."""
    text = f"stopped on {stopped}"
    if stopped_short(stopped, trials, budget_trials):
        text += f" after {trials} of {budget_trials} trials"
    return text

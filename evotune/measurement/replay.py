"""The replay oracle: answers from a recorded landscape instead of a GPU.

Each answer is charged the compile and benchmark time recorded for that
point, so a replayed run has a realistic tuning clock to plot against.

Example::

    from evotune.core.landscape import SHIPPED, load_landscape
    from evotune.measurement.replay import ReplayEvaluator
    ls = load_landscape(SHIPPED / "kerneltuner" / "pnpoly_RTX_2080_Ti.json.gz")
    oracle = ReplayEvaluator(ls)
    oracle.evaluate(ls.space().feasible(Context()).point(0), ls.problem).status
"""

from __future__ import annotations

import copy

from evotune.core.landscape import Landscape
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Point
from evotune.measurement.base import Evaluator


class ReplayEvaluator(Evaluator):
    kind = "replay"

    def __init__(self, landscape: Landscape):
        self.landscape = landscape

    def evaluate(self, point: Point, problem: Problem) -> EvalResult:
        recorded = self.landscape.lookup(point)
        if recorded is None:
            return EvalResult(Status.INFEASIBLE, message="not in the recorded landscape")
        # a copy, so that nothing downstream can edit the landscape in memory
        return copy.deepcopy(recorded)

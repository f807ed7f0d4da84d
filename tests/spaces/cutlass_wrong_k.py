"""The CUTLASS sm90 space with a launcher that tells each kernel a K one tile short: every kernel compiles and
runs within its buffers, and computes the wrong product. The GPU worker must reject each point as a wrong
result (tests/test_gpu_cutlass.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from evotune.authoring import Point, Problem
from search_spaces import cutlass_sm90_gemm


def build(point: Point, problem: Problem) -> Any:
    from search_spaces import _cutlass_sm90 as cpp

    return cpp.build(point, dataclasses.replace(problem, k=problem.k - point["tile_k"]))


SPACE = dataclasses.replace(cutlass_sm90_gemm.SPACE, name="cutlass_wrong_k", build=build, _feasible={})

"""The CUTLASS int8 conv space with a launcher that skips the filter's reorder: every kernel compiles and runs
within its buffers, and reads the workload's (K, C/32, R, S, 32) filter as CUTLASS's (C/32, R, S, K, 32). The GPU
worker must reject each point as a wrong result (tests/test_gpu_conv.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from evotune.authoring import Point, Problem
from search_spaces import cutlass_conv2d_int8


def build(point: Point, problem: Problem) -> Any:
    from search_spaces import _cutlass_conv as cc

    kernel = cc.build(point, problem)
    kernel.prepare = lambda inputs: tuple(inputs)  # the filter as the workload holds it
    return kernel


SPACE = dataclasses.replace(cutlass_conv2d_int8.SPACE, name="cutlass_conv_unreordered", build=build, _feasible={})

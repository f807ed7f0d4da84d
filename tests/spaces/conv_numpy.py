"""A tiny numpy conv2d space for the CPU oracle: ``build`` returns ``fn(x, w[, scale]) -> y``.

A test fixture: two ways to compute the convolution (``im2col``: one matrix
product over gathered patches; ``loops``: one product per filter tap), each
checked by the CPU worker against the conv2d workload's own numpy reference;
``bias`` adds 100 to every accumulation on purpose, so the space also has points
that must come out ``wrong_result``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evotune.authoring import (
    ConvShape,
    Point,
    Problem,
    SearchSpace,
    categorical,
    conv2d_nhwc,
    ordinal,
    to_layout,
    to_nhwc,
)


def _im2col(x: Any, w: Any, s: ConvShape) -> Any:
    xp = np.pad(x, ((0, 0), (s.pad, s.pad), (s.pad, s.pad), (0, 0)))
    taps = [xp[:, r * s.dilation: r * s.dilation + s.stride * (s.P - 1) + 1: s.stride,
               q * s.dilation: q * s.dilation + s.stride * (s.Q - 1) + 1: s.stride, :]
            for r in range(s.R) for q in range(s.S)]
    cols = np.stack(taps, axis=3).reshape(s.N * s.P * s.Q, s.R * s.S * s.C)
    return (cols @ w.reshape(s.K, s.R * s.S * s.C).T).reshape(s.N, s.P, s.Q, s.K)


def build(point: Point, problem: Problem) -> Any:
    s = ConvShape.of(problem)

    def fn(x: Any, w: Any, scale: Any = None) -> Any:
        wide = np.int64 if problem.dtype == "int8" else np.float64
        xn, wn = to_nhwc(x, problem.layout).astype(wide), to_nhwc(w, problem.layout).astype(wide)
        if point["method"] == "im2col":
            acc = _im2col(xn, wn, s)
        else:
            acc = conv2d_nhwc(xn, wn, s.pad, s.stride, s.dilation)
        acc = acc + point["bias"]
        if problem.dtype == "int8":
            acc = np.clip(np.rint(acc * scale.astype(np.float64)), -128, 127).astype(np.int8)
        return to_layout(acc, problem.layout)

    return fn


SPACE = SearchSpace("conv_numpy", [categorical("method", ["im2col", "loops"]), ordinal("bias", [0, 100])],
                    build=build, workload="conv2d")

"""What a launch's shape says about a configuration's speed, whatever the kernel: its programs against the SMs.

A kernel launched over a grid of P programs (CTAs) on a GPU of S multiprocessors runs in about
``ceil(P / S)`` waves, and its last wave keeps only ``P / (ceil(P / S) * S)`` of the GPU busy. Both depend on
the problem and the configuration together: a 64 x 64 tile makes 128 programs of a 128 x 4096 GEMM and 256 of
a 256 x 4096 one. The fastest configurations of a kernel keep their launch shape from one problem to the next
far more than they keep their parameter values (on the H100 matmul recordings, the optimum of every
M x 4096 x 4096 GEMM from M = 16 to 512 launches 128 programs on 132 SMs, with five different tiles), so
these features let the results of one key speak for another (:mod:`evotune.search.prior`), and let the
surrogate see the wave quantization that a tile's size alone hides.

A strategy is given them as one row per feasible point (``launch=`` of
:func:`~evotune.search.strategies.make_strategy`); a source carries them for its own results at its own
problem (:class:`~evotune.search.prior.Source`'s ``launch``).

Example::

    features(128, 132)   # (0.2917, 0.9697): 2^7 of 2^24 programs, one wave 97% full
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: log2 of the largest program count told apart (16.7 million programs)
LOG2_MAX_PROGRAMS = 24.0
#: the features per launch: log2 of the program count scaled to [0, 1], and the share of the last wave busy
WIDTH = 2


def features(programs: int, sms: int | None) -> tuple[float, float]:
    """A launch of ``programs`` programs on a GPU with ``sms`` multiprocessors (None: not known, every wave
    counts as full)."""
    p = max(int(programs), 1)
    scaled = min(math.log2(p) / LOG2_MAX_PROGRAMS, 1.0)
    if not sms:
        return scaled, 1.0
    return scaled, p / (math.ceil(p / sms) * sms)


def table(programs: Sequence[int], sms: int | None) -> np.ndarray:
    """One row of :func:`features` per launch."""
    return np.array([features(p, sms) for p in programs], dtype=float).reshape(len(programs), WIDTH)


def programs_of(grid: Sequence[int] | int) -> int:
    """The number of programs of a launch grid (a tuple of up to three sizes, or one size)."""
    sizes = grid if isinstance(grid, (tuple, list)) else (grid,)
    out = 1
    for s in sizes:
        out *= max(int(s), 1)
    return out

"""A conv2d problem's sizes, typed, and its tensor layouts (NHWC, NC/32HW32), for numpy and torch alike.

Shared by the conv2d workload, its cuDNN baselines and the convolution search spaces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evotune.core.problem import Problem

VECT = 32  # channels per vector of nc32hw32


@dataclass(frozen=True)
class ConvShape:
    """A conv2d problem's sizes, typed (a :class:`Problem` keeps them in ``extra``)."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    pad: int = 0
    stride: int = 1
    dilation: int = 1
    scaling: str = ""  # int8 only: "tensor" or "channel"

    @property
    def P(self) -> int:
        return (self.H + 2 * self.pad - self.dilation * (self.R - 1) - 1) // self.stride + 1

    @property
    def Q(self) -> int:
        return (self.W + 2 * self.pad - self.dilation * (self.S - 1) - 1) // self.stride + 1

    @classmethod
    def of(cls, problem: Problem) -> ConvShape:
        return cls(**dict(problem.extra))

    def problem(self, dtype: str, layout: str) -> Problem:
        extra = {k: v for k, v in vars(self).items() if k != "scaling" or v}
        return Problem("conv2d", dtype=dtype, layout=layout, extra=tuple(sorted(extra.items())))


def physical_shape(nhwc_shape: tuple[int, int, int, int], layout: str) -> tuple[int, ...]:
    """The physical shape in ``layout`` of a tensor whose NHWC shape is ``nhwc_shape``."""
    n, h, w, c = nhwc_shape
    return nhwc_shape if layout == "nhwc" else (n, c // VECT, h, w, VECT)


def _permute(t: Any, axes: tuple[int, ...]) -> Any:
    return t.permute(*axes) if hasattr(t, "permute") else t.transpose(axes)  # torch, or numpy


def to_nhwc(t: Any, layout: str) -> Any:
    """A tensor in ``layout`` seen (or copied) as NHWC; numpy and torch alike."""
    if layout == "nhwc":
        return t
    n, cv, h, w, v = t.shape
    return _permute(t, (0, 2, 3, 1, 4)).reshape(n, h, w, cv * v)


def to_layout(t: Any, layout: str) -> Any:
    """An NHWC tensor copied into ``layout``, contiguous; numpy and torch alike."""
    if layout == "nhwc":
        return t
    n, h, w, c = t.shape
    out = _permute(t.reshape(n, h, w, c // VECT, VECT), (0, 3, 1, 2, 4))
    return out.contiguous() if hasattr(out, "contiguous") else out.copy()

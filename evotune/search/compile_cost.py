"""What a point costs a search: the launch arguments of a built kernel are free to vary, a new kernel is compiled.

A space that names its ``compiled_params`` splits each point into the kernel the
compiler builds (those parameters) and the arguments it is launched with (the
rest: a CUTLASS kernel's raster order, swizzle and stream-K decomposition).
Points that share a kernel share one compile, which for CUTLASS C++ is about a
minute of nvcc against a fifth of a second to time a point. In a space that
compiles every parameter (a Triton kernel's configuration) each point is its
own kernel: it is counted only where the space says which are ``built`` (a
configuration compiled for an earlier key of the same specialisation, about
1.5 s of Triton's compiler saved). A strategy that
knows which kernels are built (handed out or measured in this search, or found
in the on-disk cache through the space's ``built``, e.g. by an earlier problem
of the same experiment) can weigh a proposal by what it costs, not only by
what it may gain.

Example::

    kernels = Kernels.of(space, feasible, ctx)   # None when every parameter is compiled
    kernels.mark(row)                            # its kernel is (being) built
    kernels.new(rows)                            # which of these rows need a compile
"""

from __future__ import annotations

import numpy as np

from evotune.core.space import Context, FeasibleSet, SearchSpace


class Kernels:
    """The kernel of every feasible row, and which kernels are built."""

    def __init__(self, of_row: np.ndarray, built: np.ndarray):
        self.of_row = of_row  # row -> kernel id
        self.built = built  # kernel id -> built (or handed out, so being built)

    @classmethod
    def of(cls, space: SearchSpace, feasible: FeasibleSet, ctx: Context) -> Kernels | None:
        """The kernels of ``feasible``; None when the space compiles every parameter (a point is a kernel) and
        does not say which are built."""
        compiled = [space.names.index(name) for name in space.compiled_params]
        if not len(feasible):
            return None
        if not compiled or len(compiled) == len(space.names):
            if space.built is None:
                return None
            first = of_row = np.arange(len(feasible))  # each point its own kernel
        else:
            _, first, of_row = np.unique(feasible.codes[:, compiled], axis=0, return_index=True,
                                         return_inverse=True)
        built = np.zeros(len(first), dtype=bool)
        if space.built is not None and ctx.problem is not None:
            try:
                for kernel, row in enumerate(first):
                    built[kernel] = bool(space.built(feasible.point(int(row)), ctx.problem))
            except Exception:  # no toolchain on this machine (no nvcc, no CUTLASS): count nothing as built
                built[:] = False
        return cls(np.asarray(of_row).reshape(-1), built)

    def mark(self, row: int) -> None:
        self.built[self.of_row[row]] = True

    def new(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row's kernel still has to be compiled."""
        unbuilt: np.ndarray = ~self.built[self.of_row[rows]]
        return unbuilt

    @property
    def count(self) -> int:
        return len(self.built)

"""Turns on one GPU for the processes that share it, so that none times a kernel while another launches one.

A ``tune-model`` worker spends much of a key waiting on the CPU for a configuration's build while its GPU idles.
With two workers on one GPU, one can time while the other waits, but only if they never launch work at the same
time: a sample taken while another process's kernels run on the GPU measures both. So each worker holds its GPU's
turn whenever it may launch anything (a key's tuning, from its launch's inputs to its confirmation) and gives it
up only where it waits on the CPU alone (:func:`away`, around a build wait); its queued GPU work is finished
before it does (``torch.cuda.synchronize``), so none of it runs into the next holder's samples.

A turn is an exclusive ``flock`` on a file named for the GPU (``EVOTUNE_GPU_TURN`` in a worker's environment: one
file a GPU in a folder the run makes on its host): the kernel lets a waiting process in the moment the holder
unlocks, and a process that dies gives its turn back with its file descriptor. Without the variable there is no
turn to take: a process alone on its GPU takes nothing and gives nothing.

Example::

    with held():            # a key's tuning
        ...                  # launches, timing
        with away():         # a build wait: the other worker's turn
            future.result()
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

#: the file whose lock is this process's GPU turn (set for each worker when several share a GPU)
ENV = "EVOTUNE_GPU_TURN"


class GpuTurn:
    """The turn on one GPU, taken by entering it (nested entries count) and given up for a moment by :meth:`away`."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> GpuTurn:
        if self._depth == 0:
            self._take()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._give()

    @contextmanager
    def away(self) -> Iterator[None]:
        """The turn given up while the block runs (it must launch nothing on the GPU), taken again after."""
        if not self.held:
            yield
            return
        depth, self._depth = self._depth, 0
        self._give()
        try:
            yield
        finally:
            self._take()
            self._depth = depth

    def _take(self) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def _give(self) -> None:
        _drain()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)


def _drain() -> None:
    """Wait for this process's queued GPU work (where it started CUDA): none of it may run into another's turn."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


_turn: GpuTurn | None = None


def this_process() -> GpuTurn | None:
    """This process's turn, from ``EVOTUNE_GPU_TURN`` (None: it has its GPU to itself)."""
    global _turn
    path = os.environ.get(ENV)
    if not path:
        return None
    if _turn is None or _turn.path != path:
        _turn = GpuTurn(path)
    return _turn


@contextmanager
def held() -> Iterator[None]:
    """This process's turn held while the block runs (nothing to take when it has its GPU to itself)."""
    turn = this_process()
    with turn if turn is not None else nullcontext():
        yield


@contextmanager
def away() -> Iterator[None]:
    """This process's turn given up while the block waits on the CPU, if it holds one."""
    turn = this_process()
    with turn.away() if turn is not None else nullcontext():
        yield

"""One measuring worker process for every space of a run.

A GPU worker process costs seconds to start (torch, CUDA, a kernel DSL) and
holds a CUDA context on the GPU; a CPU worker costs less, but the same holds.
An experiment of several spaces needs no more than one: each space's
evaluator talks to it through a :class:`SpaceView`, and a request from a view
of another space than the last one first tells the process to switch
(:class:`~evotune.measurement.messages.UseSpace`; the process loads each space once, and drops the
kernels it built for the other one, which are keyed by problem and point).
A process started again after a crash loads the space of the latest switch.

Parent side::

    shared = SpaceWorker(WorkerProcess(worker_main, (space_a.source, timing), "GPU worker", 300))
    a, b = shared.view(space_a.source), shared.view(space_b.source)
    a.call(Evaluate(point, problem, 1)); b.call(Evaluate(other, problem, 2))   # one process, two spaces
    shared.close()

Worker side, in the handler's ``handle``::

    if isinstance(request, UseSpace):
        return use_space(self, request.source)
"""

from __future__ import annotations

from typing import Any

from evotune.core.space import SearchSpace
from evotune.measurement.isolation import WorkerProcess
from evotune.measurement.messages import Reply, ReplyStatus, Request, UseSpace


class SpaceWorker:
    """A :class:`WorkerProcess` whose first argument is the space it serves, shared by several spaces' evaluators."""

    def __init__(self, process: WorkerProcess):
        self.process = process
        self.source: str = process.args[0]  # the space the process serves now

    def view(self, source: str, owner: bool = False) -> SpaceView:
        """The process as one space's evaluator sees it; ``owner``: closing the view closes the process."""
        return SpaceView(self, source, owner)

    def switch(self, source: str) -> Reply | None:
        """Make the process serve ``source``; None once it does, else the failure reply (the request fails with it)."""
        if source == self.source:
            return None
        reply: Reply = self.process.call(UseSpace(source))
        if not reply.ok:
            return reply
        self.source = source
        self.process.args = (source, *self.process.args[1:])  # a replacement process starts on this space
        return None

    def close(self) -> None:
        self.process.close()


class SpaceView:
    """What an evaluator calls instead of its own :class:`WorkerProcess`: the shared process, on its space."""

    def __init__(self, shared: SpaceWorker, source: str, owner: bool):
        self.shared, self.source, self.owner = shared, source, owner

    @property
    def restarts(self) -> int:
        return self.shared.process.restarts

    def spawn(self) -> None:
        self.shared.process.spawn()

    def call(self, request: Request, timeout_s: float | None = None) -> Reply:
        failed = self.shared.switch(self.source)
        if failed is not None:
            return failed
        reply: Reply = self.shared.process.call(request, timeout_s)
        return reply

    def close(self) -> None:
        if self.owner:
            self.shared.close()


_LOADED: dict[str, SearchSpace] = {}  # in a worker process: every space it has served, by source


def use_space(worker: Any, source: str) -> Reply:
    """In a worker process: serve ``source`` from now on (``worker.space``), loading it on first use; the kernels
    ``worker`` built (``worker.kernels``, keyed by problem and point) are dropped, since they are another space's."""
    from evotune.core.plugins import load_space

    _LOADED.setdefault(worker.space.source, worker.space)
    try:
        if source not in _LOADED:
            _LOADED[source] = load_space(source)
    except Exception as exc:
        return Reply(ReplyStatus.RUNTIME_ERROR, f"could not load space {source}: {type(exc).__name__}: {exc}"[:2000])
    worker.space = _LOADED[source]
    worker.kernels.clear()
    return Reply(ReplyStatus.OK)

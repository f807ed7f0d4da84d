"""One worker process, spoken to over a pipe, that a bad candidate may kill or hang.

The CPU and GPU evaluators run every candidate in such a worker. The parent
never runs candidate code: a reply that does not come within ``timeout_s``
is a ``timeout`` (the worker is killed), a worker that dies is a ``crash``
(with its exit code or signal), and either way the next request starts a
fresh worker. A worker first loads what it needs and says it is ready, so a
request's timeout never pays for imports.

Worker side::

    def main(conn, *args):
        answer_requests(conn, lambda: Handler(*args))   # Handler(...).handle(request) -> Reply

Parent side::

    worker = WorkerProcess(main, (arg,), "GPU worker", timeout_s=300)
    reply = worker.call(Evaluate(point, problem.to_dict(), seed=1))

The requests and the :class:`Reply` are :mod:`evotune.measurement.messages`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from typing import Any

from evotune.measurement.messages import Reply, ReplyStatus, Stop
from evotune.measurement.processes import INHERITED_CUDA, Inherited, StartContext, as_child


class WorkerProcess:
    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str, timeout_s: float,
                 startup_timeout_s: float = 300.0, start: StartContext | None = None):
        self.target, self.args, self.name = target, args, name
        self.timeout_s, self.startup_timeout_s = float(timeout_s), float(startup_timeout_s)
        # a clean interpreter (spawn), or a fork of a server that never touched CUDA (evaluation.processes):
        # never a fork of this process, which may hold a CUDA context or threads
        self._mp = start or mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0  # workers replaced after a crash or a timeout
        self._ready = False

    @property
    def start_context(self) -> StartContext:
        """How its processes are started now (``spawn`` once a forked one found CUDA initialised at its start)."""
        return self._mp

    def spawn(self) -> None:
        """Start a worker process unless one is alive, without waiting for it: its imports and CUDA
        start-up then overlap whatever the parent does next (compiling, say)."""
        if self._proc is not None and self._proc.is_alive():
            return
        self._proc = self._conn = None
        self._ready = False
        parent, child = self._mp.Pipe()
        proc = self._mp.Process(target=as_child, args=(Inherited.here(), self.target, child, *self.args),
                                daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent

    def _start(self) -> Reply | None:
        """Start a worker unless one is alive and wait until it is ready; a failure reply when it cannot start."""
        self.spawn()
        if self._ready:
            return None
        parent = self._conn
        if not parent.poll(self.startup_timeout_s):
            self.kill()
            return Reply(ReplyStatus.CRASH, f"the {self.name} did not start within {self.startup_timeout_s:.0f} s")
        try:
            ready = self._receive()
        except (EOFError, OSError):
            return self._died(f"the {self.name} died while starting")
        if ready.status is not ReplyStatus.READY:
            self.kill()
            if INHERITED_CUDA in ready.message and self._mp.get_start_method() != "spawn":
                self._mp = mp.get_context("spawn")  # a clean interpreter cannot have inherited it
                self.restarts -= 1  # not a replacement after a candidate's crash
                return self._start()
            return Reply(ReplyStatus.CRASH, f"the {self.name} could not load the space: {ready.message}")
        self._ready = True
        return None

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
            self.restarts += 1
        self._proc = self._conn = None

    def _died(self, what: str, started: float | None = None) -> Reply:
        self._proc.join(10)
        code = self._proc.exitcode
        self.kill()
        why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return Reply(ReplyStatus.CRASH, f"{what} ({why})", extra={"exit_code": code},
                     bench_s=0.0 if started is None else time.perf_counter() - started)

    def call(self, message: object, timeout_s: float | None = None) -> Reply:
        """Send one request; the worker's reply, or a crash / timeout :class:`Reply` when it could not give one.

        ``timeout_s`` replaces the worker's own limit for this request (one that does more than one point's work).
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        failed = self._start()
        if failed is not None:
            return failed
        started = time.perf_counter()
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            self.kill()
            return Reply(ReplyStatus.CRASH, f"the {self.name} was gone before the request")
        if not self._conn.poll(timeout_s):
            self.kill()
            return Reply(ReplyStatus.TIMEOUT, f"no answer within {timeout_s:g} s; worker killed",
                         bench_s=time.perf_counter() - started)
        try:
            reply = self._receive()
        except (EOFError, OSError):
            return self._died(f"the {self.name} died", started)
        if reply.fatal:  # the worker found its own state unusable and exits: start afresh next time
            self.kill()
        return reply

    def _receive(self) -> Reply:
        """The worker's next message, which :func:`answer_requests` makes a :class:`Reply`."""
        reply = self._conn.recv()
        if not isinstance(reply, Reply):
            self.kill()
            raise TypeError(f"the {self.name} sent a {type(reply).__name__}, not a Reply: {reply!r:.200}")
        return reply

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(Stop())
                self._proc.join(10)
            except (BrokenPipeError, OSError):
                pass
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(10)
        self._proc = self._conn = None


def answer_requests(conn: Any, setup: Callable[[], Any]) -> None:
    """The worker's loop: ``setup()`` a handler, say ready, then answer requests until told to stop.

    A reply with ``fatal`` set ends the process after it is sent (a CUDA context that a
    candidate broke cannot be repaired in place).
    """
    try:
        handler = setup()
    except Exception as exc:  # the parent reports this as a crash of the start-up
        conn.send(Reply(ReplyStatus.START_FAILED, f"{type(exc).__name__}: {exc}"[:2000]))
        return
    conn.send(Reply(ReplyStatus.READY))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if isinstance(message, Stop):
            return
        started = time.perf_counter()
        reply = handler.handle(message)
        reply.served_s = time.perf_counter() - started  # the parent's wait less this: the pipe and its own delays
        conn.send(reply)
        if reply.fatal:
            os._exit(3)

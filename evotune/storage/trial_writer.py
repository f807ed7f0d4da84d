"""Writing finished trials cheaply, and behind the measuring loop.

Two things make a trial's write cost little beside a GPU measurement:

* :func:`evotune.storage.optuna_rdb.write_trials` writes a batch of finished
  trials into an RDB storage (sqlite, PostgreSQL, MySQL) as one transaction of
  a few statements.
* :class:`TrialWriter` writes a study's trials from a thread, in the order
  they were measured, so the loop goes on to its next point at once. A trial
  counts as finished only once it is stored: its point's claim stays held by
  the live worker until then, and is marked done (``claims.finish_all``) right
  after the write. A worker killed with trials still queued loses those
  points only: their claims lapse with the process, and the next run (or
  another worker) measures them again; nothing is counted that is not stored.

sqlite files are opened in WAL mode with ``synchronous = NORMAL``
(:class:`WalConnection`): a commit is a write to the log, with no sync to the
disk; a killed process loses nothing it committed (only a power cut or an
operating-system crash may roll back the last commits, all together and
consistently), and readers never wait for the writer.

Example::

    writer = TrialWriter(store, claims)
    writer.put(store.space.key(point), store.trial(point, result, clock_s=1.5))  # returns at once
    writer.close()  # every queued trial stored, its claim done
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import optuna
from optuna.trial import FrozenTrial

from evotune.storage.claims.base import Claims

QUEUED = 16  # trials measured and not yet stored, at most: the loop waits beyond that
BATCH = 16  # trials stored in one transaction, at most (those queued while the last ones were written)


class WalConnection(sqlite3.Connection):
    """An sqlite connection in WAL mode with ``synchronous = NORMAL`` (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        try:
            self.execute("PRAGMA journal_mode=WAL")  # kept by the file: only its first opener changes it
        except sqlite3.OperationalError:
            pass  # another connection is switching it meanwhile: it ends in WAL all the same
        self.execute("PRAGMA synchronous=NORMAL")


def checkpoint(storage: optuna.storages.BaseStorage) -> None:
    """Copy the commits in an sqlite storage's log into the database file, as closing the file's last connection
    does, so that the file alone holds every trial once a run is over (a copy of it is whole). Passive: it waits
    for no other reader or writer, and copies what they leave it."""
    if isinstance(storage, optuna.storages.RDBStorage) and storage.engine.dialect.name == "sqlite":
        with storage.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")


class TrialStore(Protocol):
    """What the writer needs of a study's store (:class:`evotune.storage.study.StudyStore` is one, which imports
    this module: hence a protocol)."""

    def write_all(self, trials: list[FrozenTrial]) -> object:
        """Store ``trials``, finished, in one transaction where the storage has them."""
        ...


class TrialWriter:
    """Stores a study's trials from a thread, in order, each claim marked done right after its trial.

    The trials queued while the last ones were being written are written together, in one transaction,
    and their claims marked done in one step (``store.write_all``, then ``claims.finish_all``). An error in the
    thread is raised in the caller at its next :meth:`put`, :meth:`flush` or :meth:`close`, and nothing after the
    failed trial is written (its claims lapse with the process). ``busy_s`` is the thread's time writing;
    ``waited_s`` the caller's time waiting for a free place in the queue or for the queue to drain.
    """

    def __init__(self, store: TrialStore, claims: Claims, on_stored: Callable[[int], None] | None = None,
                 queued: int = QUEUED):
        self.store, self.claims, self.on_stored = store, claims, on_stored
        self._queue: queue.Queue[tuple[str, FrozenTrial] | None] = queue.Queue(maxsize=queued)
        self._idle = threading.Condition()
        self.pending = 0  # put and not yet stored (or failed)
        self.stored = 0
        self.busy_s = 0.0
        self.waited_s = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="evotune-trial-writer", daemon=True)
        self._thread.start()

    def put(self, key: str, trial: FrozenTrial) -> None:
        """Queue ``trial`` (of point ``key``, whose claim this worker holds) to be stored."""
        self._raise()
        with self._idle:
            self.pending += 1
        started = time.perf_counter()
        self._queue.put((key, trial))
        self.waited_s += time.perf_counter() - started

    def flush(self) -> None:
        """Return once every queued trial is stored and its claim done."""
        started = time.perf_counter()
        with self._idle:
            self._idle.wait_for(lambda: self.pending == 0)
        self.waited_s += time.perf_counter() - started
        self._raise()

    def close(self) -> None:
        """Store what is queued, then end the thread."""
        try:
            self.flush()
        finally:
            self._queue.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"storing a trial failed: {self.error}") from self.error

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            batch, end = [item], False
            while len(batch) < BATCH:  # what queued up meanwhile goes in the same transactions
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    end = True
                    break
                batch.append(more)
            if self.error is None:
                started = time.perf_counter()
                try:
                    self.store.write_all([trial for _, trial in batch])
                    self.claims.finish_all([key for key, _ in batch])
                except BaseException as exc:  # told to the caller; the trials after it stay unwritten
                    self.error = exc
                self.busy_s += time.perf_counter() - started
            with self._idle:
                self.pending -= len(batch)
                self.stored += len(batch) if self.error is None else 0
                stored = self.stored
                self._idle.notify_all()
            if self.on_stored is not None and self.error is None:
                self.on_stored(stored)
            if end:
                return

"""An Optuna journal file that a writer killed at any moment cannot spoil.

Optuna's ``JournalFileBackend`` appends one JSON line per operation. Two things
go wrong when a writer is killed (SIGKILL, OOM killer, a lost node):

* its lock file stays behind and the next writer waits 30 s before breaking it;
  here the lock is ``flock`` on ``PATH.flock``, which the kernel drops when the
  holder dies;
* Linux may stop a ``write`` to a file between pages when a fatal signal
  arrives, so the journal can end in half a line. Optuna skips such a tail while
  reading, but the next append is glued onto it, and that merged line makes the
  whole journal unreadable. Here every append first cuts a torn tail back to the
  last whole line, under the lock, so the operations after it stay readable.
  The cut operation was never acknowledged to its writer (it died inside the
  write), so evotune sees that trial as not done and evaluates it again.

Example::

    from optuna.storages.journal import JournalStorage
    storage = JournalStorage(KillSafeJournal("runs/demo.journal"))
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import BaseJournalFileLock  # the interface lock_obj must have


class FlockLock(BaseJournalFileLock):
    """An exclusive ``flock`` on ``path``: released by the kernel when its holder dies."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def cut_torn_tail(path: str | Path) -> int:
    """Truncate ``path`` after its last newline; returns the number of bytes cut (0 if it ends whole).

    Call only while holding the journal's lock: a live writer's half-written line looks the same.
    """
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            step = min(4096, end)
            f.seek(end - step)
            block = f.read(step)
            newline = block.rfind(b"\n")
            if newline >= 0:
                end = end - step + newline + 1
                break
            end -= step
        if end < size:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
        return size - end


class KillSafeJournal(JournalFileBackend):
    """``JournalFileBackend`` with a ``flock`` lock and appends that first cut a torn tail."""

    def __init__(self, path: str | Path) -> None:
        self.lock = FlockLock(f"{path}.flock")
        super().__init__(str(path), lock_obj=self.lock)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        self.lock.acquire()
        try:
            cut_torn_tail(self._file_path)
            with open(self._file_path, "ab") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
        finally:
            self.lock.release()

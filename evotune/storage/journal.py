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

Reading is stricter than Optuna's about what else a journal may hold. A line that
is no journal record at all (no ``"op_code"`` in it: text pasted in, an empty line)
is skipped, with one warning that names the file and how many lines were skipped;
a file with lines none of which is a record is no journal (:class:`NotAJournal`).
A line that was a record but is broken (a torn line with another glued onto it, an
edited line) cannot be skipped: the operations after it refer to the trials it
made, so reading stops with a :class:`JournalError` that names the file and the
line. A torn last line (no end of line) is ignored, as Optuna does, with a warning
when no writer holds the lock (else it is a record being written).

Example::

    from optuna.storages.journal import JournalStorage
    storage = JournalStorage(KillSafeJournal("runs/demo.journal"))
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Any

from optuna.storages.journal import BaseJournalBackend

from evotune.storage.url import StorageError

_WARNED: dict[tuple[str, str], int] = {}  # (path, what) -> the count or line last warned of, in this process


class JournalError(StorageError):
    """A journal that cannot be read safely; ``str()`` names the file and the line (``FILE: line N: why``)."""

    def __init__(self, path: str | Path, where: str, message: str):
        self.path, self.where, self.message = str(path), where, message
        super().__init__(f"{path}: {where}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.where, self.message)


class NotAJournal(ValueError):
    """A file with lines, none of which is a journal record: no journal of evotune's or Optuna's."""


class JournalWarning(UserWarning):
    """Lines of a journal that were skipped while reading it."""


class FlockLock:
    """An exclusive ``flock`` on ``path``: released by the kernel when its holder dies."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.fd: int | None = None

    def acquire(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

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


class KillSafeJournal(BaseJournalBackend):
    """A journal file as Optuna's ``JournalFileBackend`` writes it, with a ``flock`` lock and appends that first
    cut a torn tail."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self.lock = FlockLock(f"{path}.flock")
        open(self.path, "ab").close()  # as Optuna's backend: the file exists from the start
        self._starts: dict[int, tuple[int, int]] = {0: (0, 0)}  # record number -> (byte offset, line) where it starts
        self._skipped = 0  # lines read that are no records

    def read_logs(self, log_number_from: int) -> Generator[dict[str, Any], None, None]:
        """The records from number ``log_number_from`` on (0: the first), skipping lines that are none."""
        known = log_number_from if log_number_from in self._starts else max(n for n in self._starts
                                                                            if n <= log_number_from)
        offset, line_no = self._starts[known]
        number, skipped, first_skipped = known, 0, 0
        with open(self.path, "rb") as f:
            f.seek(offset)
            for line in f:
                line_no += 1
                if not line.endswith(b"\n"):  # a record being written, or one whose writer died: not yet a record
                    self._torn_tail(line_no)
                    break
                offset += len(line)
                log = self._record(line, line_no)
                if log is None:
                    skipped += 1
                    first_skipped = first_skipped or line_no
                    self._starts[number] = (offset, line_no)
                    continue
                number += 1
                self._starts[number] = (offset, line_no)
                if number > log_number_from:
                    yield log
        if known == number == 0 and skipped:
            raise NotAJournal(f"none of its {skipped} line(s) is a journal record")
        self._skipped += skipped
        if skipped and self._skipped > _WARNED.get((self.path, "skipped"), 0):
            _WARNED[(self.path, "skipped")] = self._skipped
            warnings.warn(f"{self.path}: skipped {self._skipped} line(s) that are not journal records "
                          f"(the first at line {first_skipped})", JournalWarning, stacklevel=1)

    def _record(self, line: bytes, line_no: int) -> dict[str, Any] | None:
        """The operation on ``line``; None for a line that is none (skipped); a broken one raises."""
        try:
            log = json.loads(line)
        except ValueError as exc:
            if b'"op_code"' not in line:
                return None
            raise JournalError(self.path, f"line {line_no}", f"a broken journal record ({exc}); the "
                               "records after it depend on it: restore the file from a copy, or cut it before "
                               "this line to keep the trials above it") from None
        if isinstance(log, dict) and isinstance(log.get("op_code"), int):
            return log
        if b'"op_code"' in line:
            raise JournalError(self.path, f"line {line_no}", "a journal record without an integer op_code")
        return None

    def _torn_tail(self, line_no: int) -> None:
        """Warn of a last line without an end of line, unless a writer holds the lock (it is being written)."""
        if _WARNED.get((self.path, "torn")) == line_no:
            return
        try:
            fd = os.open(self.lock.path, os.O_RDONLY)
        except FileNotFoundError:
            return  # nobody ever wrote through the lock
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with open(self.path, "rb") as f:  # under the lock: a writer that just finished ends in a newline
                f.seek(max(0, f.seek(0, os.SEEK_END) - 1))
                if f.read(1) in (b"", b"\n"):
                    return
        except BlockingIOError:
            return
        finally:
            os.close(fd)  # releases the lock if taken
        _WARNED[(self.path, "torn")] = line_no
        warnings.warn(f"{self.path}: line {line_no} is cut short (its writer died while writing it); it is "
                      "ignored, and a trial in it is measured again", JournalWarning, stacklevel=1)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
        self.lock.acquire()
        try:
            cut_torn_tail(self.path)
            with open(self.path, "ab") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
        finally:
            self.lock.release()

"""Claims in a ``.claims`` file beside a ``journal:`` file: :class:`FileClaims`."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from evotune.storage.claims.base import DONE, HELD, Claims, Row, _Transaction
from evotune.storage.journal import cut_torn_tail

FREE = "free"  # in a claims file: the line that removes a released claim


class FileClaims(Claims):
    """Claims as JSON lines in one file, for journal storage (one host, or a shared file system).

    Each line is the latest state of one (study, key); the lock is ``flock`` on the file itself.
    """

    def __init__(self, path: Path, study: str, lease_s: float, owner: str | None = None):
        super().__init__(study, lease_s, owner)
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self._forget()

    def _forget(self) -> None:
        self._rows: dict[str, Row] = {}
        self._held: dict[str, Row] = {}
        self._done = 0
        self._offset = 0

    def _apply(self, key: str, row: Row | None) -> None:
        old = self._rows.pop(key, None)
        if old is not None:
            self._done -= old.state == DONE
            self._held.pop(key, None)
        if row is not None:
            self._rows[key] = row
            self._done += row.state == DONE
            if row.state == HELD:
                self._held[key] = row

    def _refresh(self, f: BinaryIO) -> None:
        f.seek(self._offset)
        for line in f:
            if not line.endswith(b"\n"):
                break  # a line cut short by a killed writer: ignored (and cut by the next write)
            self._offset += len(line)
            try:
                c = json.loads(line)
                if c.get("study") != self.study:
                    continue
                state = c.get("state", HELD)
                self._apply(c["key"], None if state == FREE else Row(c["owner"], float(c["expires"]), state))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue

    @contextmanager
    def _transaction(self) -> Iterator[_Transaction]:
        with open(self.path, "rb+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self._refresh(f)
                tx = _FileTransaction(self)
                yield tx
                if tx.lines:
                    cut_torn_tail(self.path)  # else the first line is glued onto a dead writer's half line
                    f.seek(0, os.SEEK_END)
                    f.write("".join(tx.lines).encode())
                    f.flush()
                    self._offset = f.tell()
            except BaseException:
                self._forget()  # what is in memory may be ahead of the file: read it whole next time
                raise
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class _FileTransaction(_Transaction):
    def __init__(self, claims: FileClaims):
        self.claims = claims
        self.lines: list[str] = []

    def get(self, key: str) -> Row | None:
        return self.claims._rows.get(key)

    def held(self) -> dict[str, Row]:
        return dict(self.claims._held)

    def done_count(self) -> int:
        return self.claims._done

    def done_keys(self) -> set[str]:
        return {k for k, r in self.claims._rows.items() if r.state == DONE}

    def put(self, key: str, state: str, expires: float) -> None:
        self._write(key, Row(self.claims.owner, expires, state))

    def drop(self, key: str) -> None:
        self._write(key, None)

    def _write(self, key: str, row: Row | None) -> None:
        c = self.claims
        line = {"study": c.study, "key": key, "owner": c.owner, "expires": 0.0, "state": FREE}
        if row is not None:
            line.update(expires=row.expires, state=row.state)
        self.lines.append(json.dumps(line) + "\n")
        c._apply(key, row)

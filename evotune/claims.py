"""Claims: which worker is measuring which point, so that several workers can share one study.

Before a worker measures a point it claims the point's key for the study. A
claim is exclusive: a second worker asking for the same key is refused, and
proposes something else. A claim lapses when its lease runs out, or at once
when its owner is a process on this host that no longer exists (a worker that
was killed), so no point is lost to a dead worker either.

Where claims live follows the storage: a table ``evotune_claims`` in the same
database for RDB URLs (sqlite, PostgreSQL, MySQL: a primary key makes the
insert the lock), or a ``.claims`` file beside a ``journal:`` file (appended
under an exclusive file lock).

Example::

    claims = make_claims("sqlite:///runs/x.db", "x/gemm_bf16_tn_4096x4096x4096/ga/seed0", lease_s=600)
    if claims.claim(space.key(point)):  # "new" or "takeover"
        ...measure it...
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from evotune.journal import cut_torn_tail

HOST = socket.gethostname()


def owner_id() -> str:
    """This process: every run in it (a run resumed after Ctrl-C, say) owns the claims of the runs before."""
    return f"{HOST}:{os.getpid()}"


def owner_dead(owner: str) -> bool:
    """True when ``owner`` was a process on this host that is gone (killed, crashed or finished)."""
    host, _, rest = owner.partition(":")
    if host != HOST:
        return False  # another host's worker: only its lease can tell
    try:
        pid = int(rest.split(":", 1)[0])
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError):
        return False
    return False


class Claims(ABC):
    #: whether other workers may add trials to the study (if not, the tuner never reads it back)
    shared = True

    def __init__(self, study: str, lease_s: float, owner: str | None = None):
        self.study, self.lease_s = study, float(lease_s)
        self.owner = owner or owner_id()

    @abstractmethod
    def claim(self, key: str) -> str:
        """Take ``key`` for this worker: ``"new"``, ``"takeover"`` (from a lapsed or dead owner, who
        may have finished it: look again before measuring), or ``""`` when another live worker holds it."""

    @abstractmethod
    def active(self) -> set[str]:
        """Keys claimed by other live workers (finished or not)."""

    def _expired(self, owner: str, expires: float, now: float) -> bool:
        return owner != self.owner and (expires < now or owner_dead(owner))


class FileClaims(Claims):
    """Claims as JSON lines in one file, for journal storage (one host, or a shared file system)."""

    def __init__(self, path: Path, study: str, lease_s: float, owner: str | None = None):
        super().__init__(study, lease_s, owner)
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self._seen: dict[str, tuple[str, float]] = {}
        self._offset = 0

    def _refresh(self, f: Any) -> None:
        f.seek(self._offset)
        for line in f:
            if not line.endswith("\n"):
                break  # a line cut short by a killed writer: ignored (and cut by the next claim)
            self._offset += len(line.encode())
            try:
                c = json.loads(line)
            except ValueError:
                continue
            if c.get("study") == self.study:
                self._seen[c["key"]] = (c["owner"], float(c["expires"]))

    def claim(self, key: str) -> bool:
        with open(self.path, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self._refresh(f)
                now = time.time()
                held = self._seen.get(key)
                if held and held[0] != self.owner and not self._expired(held[0], held[1], now):
                    return ""
                line = json.dumps({"study": self.study, "key": key, "owner": self.owner,
                                   "expires": now + self.lease_s}) + "\n"
                cut_torn_tail(self.path)  # else this line is glued onto a dead writer's half line
                f.seek(0, os.SEEK_END)
                f.write(line)
                f.flush()
                self._offset = f.tell()
                self._seen[key] = (self.owner, now + self.lease_s)
                return "takeover" if held and held[0] != self.owner else "new"
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def active(self) -> set[str]:
        with open(self.path) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                self._refresh(f)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        now = time.time()
        return {k for k, (o, e) in self._seen.items() if o != self.owner and not self._expired(o, e, now)}


class RdbClaims(Claims):
    """Claims as rows of ``evotune_claims`` in the study's own database; the primary key is the lock."""

    def __init__(self, url: str, study: str, lease_s: float, owner: str | None = None):
        super().__init__(study, lease_s, owner)
        import sqlalchemy as sa

        self.sa = sa
        from evotune.study import engine_kwargs, schema_lock

        self.engine = sa.create_engine(url, **engine_kwargs(url))
        meta = sa.MetaData()
        self.table = sa.Table(
            "evotune_claims", meta,
            sa.Column("study", sa.String(512), primary_key=True),
            sa.Column("key_hash", sa.String(64), primary_key=True),
            sa.Column("key", sa.Text), sa.Column("owner", sa.String(256)), sa.Column("expires", sa.Float))
        for attempt in range(5):
            try:
                with schema_lock(url):
                    meta.create_all(self.engine, checkfirst=True)
                break
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError):  # another worker made it meanwhile
                if attempt == 4:
                    raise
                time.sleep(0.5 * (attempt + 1))

    def claim(self, key: str) -> str:
        sa, t = self.sa, self.table
        h = hashlib.sha256(key.encode()).hexdigest()
        now = time.time()
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(t).values(study=self.study, key_hash=h, key=key, owner=self.owner,
                                                 expires=now + self.lease_s))
            return "new"
        except sa.exc.IntegrityError:
            pass
        with self.engine.begin() as conn:  # held already: take it over only from a lapsed or dead owner
            row = conn.execute(sa.select(t.c.owner, t.c.expires).where(t.c.study == self.study,
                                                                        t.c.key_hash == h)).first()
            if row is None or not (row.owner == self.owner or self._expired(row.owner, row.expires, now)):
                return ""
            done = conn.execute(sa.update(t).where(t.c.study == self.study, t.c.key_hash == h,
                                                   t.c.owner == row.owner)
                                .values(owner=self.owner, expires=now + self.lease_s))
            return ("takeover" if row.owner != self.owner else "new") if done.rowcount == 1 else ""

    def active(self) -> set[str]:
        sa, t = self.sa, self.table
        now = time.time()
        with self.engine.connect() as conn:
            # the tuner asks before every point: a worker alone on its study fetches nothing here
            rows = conn.execute(sa.select(t.c.key, t.c.owner, t.c.expires)
                                .where(t.c.study == self.study, t.c.owner != self.owner)).all()
        return {r.key for r in rows if not self._expired(r.owner, r.expires, now)}


class NoClaims(Claims):
    """For storages that live in one process (in-memory): nobody else can measure anything."""

    shared = False

    def claim(self, key: str) -> str:
        return "new"

    def active(self) -> set[str]:
        return set()


def make_claims(url: str, study: str, lease_s: float = 3600.0, owner: str | None = None) -> Claims:
    """The claims of ``study`` kept beside the storage at ``url``."""
    if url.startswith("journal:"):
        return FileClaims(Path(url.removeprefix("journal:") + ".claims"), study, lease_s, owner)
    if "://" in url:
        return RdbClaims(url, study, lease_s, owner)
    return NoClaims(study, lease_s, owner)

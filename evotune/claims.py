"""Claims: which worker is measuring which point, so that several workers can share one study.

Before a worker measures a point it claims the point's key for the study. A
claim is exclusive: a second worker asking for the same key is refused, and
proposes something else. A claim lapses when its lease runs out, or at once
when its owner is a process on this host that no longer exists (a worker that
was killed), so no point is lost to a dead worker either.

The claims also keep the study's budget for all its workers together: the
budget check and the claim are one step under the study's claims lock, and
a claim is marked done once its trial is stored, so the count under the lock
is "keys done, or held by a live worker". Without that, two workers that both
count 199 trials for a budget of 200 both claim a point and the study ends
with 201.

Where claims live follows the storage: a table ``evotune_claims`` in the same
database for RDB URLs (sqlite, PostgreSQL, MySQL; the lock is a transaction
that serialises per study), or a ``.claims`` file beside a ``journal:`` file
(appended under an exclusive file lock).

Example::

    claims = make_claims("sqlite:///runs/x.db", "x/gemm_bf16_tn_4096x4096x4096/ga/seed0", lease_s=600)
    if claims.claim(space.key(point), budget=200, finished=keys_in_study) in ("new", "takeover"):
        ...measure it, store its trial...
        claims.finish(space.key(point))
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from evotune.journal import cut_torn_tail

HOST = socket.gethostname()

HELD, DONE, SKIP = "held", "done", "skip"  # a claim's states; a released claim is gone
FREE = "free"  # in a claims file: the line that removes a released claim


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


@dataclass(frozen=True)
class Row:
    """One claim: who holds it, until when, and whether its point is still being measured."""

    owner: str
    expires: float
    state: str  # HELD: being measured; DONE: its trial is in the study; SKIP: it cost nothing (not counted)


class _Transaction(ABC):
    """The claims of one study, read and written while holding the study's claims lock."""

    @abstractmethod
    def get(self, key: str) -> Row | None: ...

    @abstractmethod
    def held(self) -> dict[str, Row]:
        """Every claim in state HELD, lapsed ones included."""

    @abstractmethod
    def done_count(self) -> int: ...

    @abstractmethod
    def done_keys(self) -> set[str]: ...

    @abstractmethod
    def put(self, key: str, state: str, expires: float) -> None:
        """Write the claim of ``key`` as this worker's, in ``state``."""

    @abstractmethod
    def drop(self, key: str) -> None: ...


class Claims(ABC):
    """The claims of one study. Every method is one atomic step under the study's claims lock.

    The budget is counted in the claims themselves: a slot is used by every key
    that is DONE (its trial is stored) or HELD by a live worker (being measured,
    this worker's included). A claim held by a dead or lapsed owner uses no slot:
    under the lock, the study is read again (``look``) to tell a point its owner
    stored just before dying (marked DONE) from one it never finished (dropped).
    """

    #: whether other workers may add trials to the study (if not, the tuner never reads it back)
    shared = True

    def __init__(self, study: str, lease_s: float, owner: str | None = None):
        self.study, self.lease_s = study, float(lease_s)
        self.owner = owner or owner_id()

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[_Transaction]:
        """Hold the study's claims lock; what the transaction writes is visible to others once it ends."""

    def claim(self, key: str, budget: int | None = None, finished: AbstractSet[str] = frozenset(),
              look: Callable[[], AbstractSet[str]] | None = None) -> str:
        """Take ``key`` for this worker, if a slot of ``budget`` is free.

        ``finished``: keys the caller knows to be in the study; ``look``: reads
        the study again and returns them all (called only when a lapsed claim
        may hide a stored trial). Returns ``"new"``, ``"takeover"`` (from a
        lapsed or dead owner, who may have finished it: look again before
        measuring), ``""`` when another live worker holds it or it is done, or
        ``"full"`` when the keys done or held live already fill ``budget``.
        """
        with self._transaction() as tx:
            now = time.time()
            row = tx.get(key)
            if row is not None and row.state != HELD:
                return ""
            theirs = row is not None and row.owner != self.owner
            if theirs and not self._expired(row.owner, row.expires, now):
                return ""
            if budget is not None:
                used = self._used(tx, key, finished, look, now)
                row = tx.get(key)
                if row is not None and row.state != HELD:
                    return ""  # its dead owner had stored it
                if used >= budget:
                    return "full"
            tx.put(key, HELD, now + self.lease_s)
            return "takeover" if theirs else "new"

    def finish(self, key: str, counted: bool = True) -> None:
        """The trial of ``key`` is stored (``counted``), or the point cost nothing: nobody measures it again."""
        with self._transaction() as tx:
            tx.put(key, DONE if counted else SKIP, time.time())

    def release(self, key: str) -> None:
        """Give back a claim whose point was not measured (the evaluation was interrupted)."""
        with self._transaction() as tx:
            row = tx.get(key)
            if row is not None and row.state == HELD and row.owner == self.owner:
                tx.drop(key)

    def begin(self, finished: AbstractSet[str]) -> None:
        """A run starts on the study: count every stored trial (a study resumed from before claims were
        kept has trials without one) and drop what an interrupted run of this process left held."""
        with self._transaction() as tx:
            for key, row in tx.held().items():
                if row.owner == self.owner and key not in finished:
                    tx.drop(key)
            now = time.time()
            for key in finished - tx.done_keys():
                tx.put(key, DONE, now)

    def active(self) -> set[str]:
        """Keys other live workers are measuring."""
        now = time.time()
        with self._transaction() as tx:
            return {k for k, r in tx.held().items()
                    if r.owner != self.owner and not self._expired(r.owner, r.expires, now)}

    def _used(self, tx: _Transaction, key: str, finished: AbstractSet[str],
              look: Callable[[], AbstractSet[str]] | None, now: float) -> int:
        """Budget slots in use, other than ``key``'s: keys DONE or HELD live. Settles lapsed claims."""
        held = tx.held()
        lapsed = [k for k, r in held.items() if self._expired(r.owner, r.expires, now)]
        if look is not None and any(k not in finished for k in lapsed):
            finished = look()  # an owner may have died between storing its trial and marking it DONE
        for k in lapsed:
            if k in finished:
                tx.put(k, DONE, now)
            elif look is not None:
                tx.drop(k)  # never stored: the slot is free, the point anyone's to take
        live = sum(1 for k in held if k != key and k not in lapsed)
        return tx.done_count() + live

    def _expired(self, owner: str, expires: float, now: float) -> bool:
        return owner != self.owner and (expires < now or owner_dead(owner))


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


class RdbClaims(Claims):
    """Claims as rows of ``evotune_claims`` in the study's own database.

    The study's lock is a transaction that serialises per study: ``BEGIN
    IMMEDIATE`` on sqlite (the database's one write lock, taken at the start),
    ``SELECT ... FOR UPDATE`` on the study's row of ``evotune_claim_locks``
    elsewhere (PostgreSQL, MySQL), held until the transaction ends.
    """

    def __init__(self, url: str, study: str, lease_s: float, owner: str | None = None):
        super().__init__(study, lease_s, owner)
        import sqlalchemy as sa

        self.sa = sa
        from evotune.study import engine_kwargs, schema_lock

        self.engine = sa.create_engine(url, **engine_kwargs(url))
        if self.engine.dialect.name == "sqlite":
            _begin_immediate(self.engine)
        meta = sa.MetaData()
        self.table = sa.Table(
            "evotune_claims", meta,
            sa.Column("study", sa.String(512), primary_key=True),
            sa.Column("key_hash", sa.String(64), primary_key=True),
            sa.Column("key", sa.Text), sa.Column("owner", sa.String(256)), sa.Column("expires", sa.Float),
            sa.Column("state", sa.String(8)))  # NULL in rows written before it existed: HELD
        self.locks = sa.Table("evotune_claim_locks", meta, sa.Column("study", sa.String(512), primary_key=True))
        for attempt in range(5):
            try:
                with schema_lock(url):
                    meta.create_all(self.engine, checkfirst=True)
                    if "state" not in {c["name"] for c in sa.inspect(self.engine).get_columns("evotune_claims")}:
                        with self.engine.begin() as conn:  # a table made before claims had states
                            conn.execute(sa.text("ALTER TABLE evotune_claims ADD COLUMN state VARCHAR(8)"))
                break
            except (sa.exc.IntegrityError, sa.exc.ProgrammingError, sa.exc.OperationalError):
                if attempt == 4:  # another worker made it meanwhile; the next look finds it
                    raise
                time.sleep(0.5 * (attempt + 1))
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.insert(self.locks).values(study=study))
        except sa.exc.IntegrityError:
            pass  # another worker of the study made it

    @contextmanager
    def _transaction(self) -> Iterator[_Transaction]:
        sa = self.sa
        with self.engine.begin() as conn:
            conn.execute(sa.select(self.locks.c.study).where(self.locks.c.study == self.study).with_for_update())
            yield _RdbTransaction(self, conn)


def _begin_immediate(engine: Any) -> None:
    """Make every transaction of ``engine`` (sqlite) take the write lock at its start: ``BEGIN IMMEDIATE``.

    pysqlite's own BEGIN comes only before the first write, so two workers could both
    read the claims before either writes; sqlite has no ``SELECT ... FOR UPDATE``.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite emits no BEGIN of its own

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


class _RdbTransaction(_Transaction):
    def __init__(self, claims: RdbClaims, conn: Any):
        self.claims, self.conn, self.t, self.sa = claims, conn, claims.table, claims.sa

    def _mine(self) -> Any:
        return self.t.c.study == self.claims.study

    def _one(self, key: str) -> Any:
        return self.sa.and_(self._mine(), self.t.c.key_hash == hashlib.sha256(key.encode()).hexdigest())

    def get(self, key: str) -> Row | None:
        t = self.t
        r = self.conn.execute(self.sa.select(t.c.owner, t.c.expires, t.c.state).where(self._one(key))).first()
        return None if r is None else Row(r.owner, float(r.expires), r.state or HELD)

    def held(self) -> dict[str, Row]:
        t = self.t
        rows = self.conn.execute(self.sa.select(t.c.key, t.c.owner, t.c.expires).where(
            self._mine(), self.sa.or_(t.c.state.is_(None), t.c.state == HELD))).all()
        return {r.key: Row(r.owner, float(r.expires), HELD) for r in rows}

    def done_count(self) -> int:
        sa, t = self.sa, self.t
        return int(self.conn.execute(sa.select(sa.func.count()).select_from(t).where(
            self._mine(), t.c.state == DONE)).scalar_one())

    def done_keys(self) -> set[str]:
        t = self.t
        return set(self.conn.execute(self.sa.select(t.c.key).where(self._mine(), t.c.state == DONE)).scalars())

    def put(self, key: str, state: str, expires: float) -> None:
        sa, t, owner = self.sa, self.t, self.claims.owner
        done = self.conn.execute(sa.update(t).where(self._one(key)).values(owner=owner, expires=expires, state=state))
        if done.rowcount == 0:  # no row yet; the lock keeps every other worker of the study out meanwhile
            self.conn.execute(sa.insert(t).values(study=self.claims.study, key_hash=hashlib.sha256(key.encode())
                                                  .hexdigest(), key=key, owner=owner, expires=expires, state=state))

    def drop(self, key: str) -> None:
        self.conn.execute(self.sa.delete(self.t).where(self._one(key)))


class NoClaims(Claims):
    """For storages that live in one process (in-memory): nobody else can measure anything."""

    shared = False

    @contextmanager
    def _transaction(self) -> Iterator[_Transaction]:
        raise NotImplementedError  # every method below answers without one

    def claim(self, key: str, budget: int | None = None, finished: AbstractSet[str] = frozenset(),
              look: Callable[[], AbstractSet[str]] | None = None) -> str:
        return "new"  # the tuner counts its own trials against the budget

    def finish(self, key: str, counted: bool = True) -> None:
        pass

    def release(self, key: str) -> None:
        pass

    def begin(self, finished: AbstractSet[str]) -> None:
        pass

    def active(self) -> set[str]:
        return set()


def make_claims(url: str, study: str, lease_s: float = 3600.0, owner: str | None = None) -> Claims:
    """The claims of ``study`` kept beside the storage at ``url``."""
    if url.startswith("journal:"):
        return FileClaims(Path(url.removeprefix("journal:") + ".claims"), study, lease_s, owner)
    if "://" in url:
        return RdbClaims(url, study, lease_s, owner)
    return NoClaims(study, lease_s, owner)

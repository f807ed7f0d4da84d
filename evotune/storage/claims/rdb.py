"""Claims in a table ``evotune_claims`` of an RDB storage's own database: :class:`RdbClaims`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from evotune.storage.claims.base import DONE, HELD, Claims, Row, _Transaction


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

        from evotune.storage.study import schema_lock

        self.engine = _engine(url)
        meta = sa.MetaData()
        self.table = sa.Table(
            "evotune_claims", meta,
            sa.Column("study", sa.String(512), primary_key=True),
            sa.Column("key_hash", sa.String(64), primary_key=True),
            sa.Column("key", sa.Text), sa.Column("owner", sa.String(256)), sa.Column("expires", sa.Float),
            sa.Column("state", sa.String(8), nullable=False))
        self.locks = sa.Table("evotune_claim_locks", meta, sa.Column("study", sa.String(512), primary_key=True))
        self.sql = _Statements(sa, self.table, self.locks)
        for attempt in range(5):
            try:
                with schema_lock(url):
                    meta.create_all(self.engine, checkfirst=True)
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
        with self.engine.begin() as conn:
            conn.execute(self.sql.lock, {"b_study": self.study})
            yield _RdbTransaction(self, conn)


_ENGINES: dict[str, Any] = {}  # url -> engine: one connection pool per database, shared by every study's claims


def _engine(url: str) -> Any:
    """The claims' engine for ``url``, made once per process: a run asks for the claims of a study many times
    (scheduling, tuning, confirming), and an engine per ask would keep a pool of connections open per ask."""
    if url not in _ENGINES:
        import sqlalchemy as sa

        from evotune.storage.study import engine_kwargs

        engine = sa.create_engine(url, **engine_kwargs(url))
        if engine.dialect.name == "sqlite":
            _begin_immediate(engine)
        _ENGINES[url] = engine
    return _ENGINES[url]


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


class _Statements:
    """The claims' statements on one table, built once (SQLAlchemy compiles each once and reuses it): a claim
    runs several of them for every point measured."""

    def __init__(self, sa: Any, t: Any, locks: Any):
        mine = t.c.study == sa.bindparam("b_study")
        one = sa.and_(mine, t.c.key_hash == sa.bindparam("h"))
        self.lock = sa.select(locks.c.study).where(locks.c.study == sa.bindparam("b_study")).with_for_update()
        self.get = sa.select(t.c.owner, t.c.expires, t.c.state).where(one)
        self.held = sa.select(t.c.key, t.c.owner, t.c.expires).where(mine, t.c.state == HELD)
        self.done_count = sa.select(sa.func.count()).select_from(t).where(mine, t.c.state == DONE)
        self.done_keys = sa.select(t.c.key).where(mine, t.c.state == DONE)
        self.update = sa.update(t).where(one).values(owner=sa.bindparam("o"), expires=sa.bindparam("e"),
                                                     state=sa.bindparam("s"))
        self.insert = sa.insert(t)
        self.drop = sa.delete(t).where(one)


class _RdbTransaction(_Transaction):
    def __init__(self, claims: RdbClaims, conn: Any):
        self.claims, self.conn, self.sql = claims, conn, claims.sql
        self.study = {"b_study": claims.study}

    def _one(self, key: str) -> dict[str, str]:
        return {**self.study, "h": hashlib.sha256(key.encode()).hexdigest()}

    def get(self, key: str) -> Row | None:
        r = self.conn.execute(self.sql.get, self._one(key)).first()
        return None if r is None else Row(r.owner, float(r.expires), r.state)

    def held(self) -> dict[str, Row]:
        rows = self.conn.execute(self.sql.held, self.study).all()
        return {r.key: Row(r.owner, float(r.expires), HELD) for r in rows}

    def done_count(self) -> int:
        return int(self.conn.execute(self.sql.done_count, self.study).scalar_one())

    def done_keys(self) -> set[str]:
        return set(self.conn.execute(self.sql.done_keys, self.study).scalars())

    def put(self, key: str, state: str, expires: float) -> None:
        owner, one = self.claims.owner, self._one(key)
        done = self.conn.execute(self.sql.update, {**one, "o": owner, "e": expires, "s": state})
        if done.rowcount == 0:  # no row yet; the lock keeps every other worker of the study out meanwhile
            self.conn.execute(self.sql.insert, {"study": self.claims.study, "key_hash": one["h"], "key": key,
                                                "owner": owner, "expires": expires, "state": state})

    def drop(self, key: str) -> None:
        self.conn.execute(self.sql.drop, self._one(key))

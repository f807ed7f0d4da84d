"""Storage of trials in an Optuna study: the one record of what happened.

Each (problem, strategy, seed) of an experiment is one Optuna study in one
storage (a sqlite file by default; any Optuna storage URL works). A trial is
written whole, once its evaluation has finished, in one transaction
(:meth:`StudyStore.write`; the tuner writes from a thread behind its loop, see
:mod:`evotune.storage.trial_writer`): there is never a RUNNING trial to leave behind,
and a stored trial is never lost to an interruption.

Trial user attributes (see docs/ARCHITECTURE.md):
``key`` (canonical point text), ``status``, ``samples_ms``, ``compile_s``,
``bench_s``, ``clock_s`` (the tuning clock after this trial: simulated for
replay, wall time on a GPU), ``wall_s`` (how long the evaluation took on this
machine's clock, in seconds; in replay that is the lookup, not the recorded
cost), and, only when they have a value, ``error`` (verification error) and
``message`` (why it failed). The trial's start and completion times are the
evaluation's own, so its duration is ``wall_s`` and its completion says when
it finished. The trial's value is the time in ms (COMPLETE), the study's one
metric, named :data:`METRIC_NAME`; failed points are FAIL.

Example::

    store = StudyStore.open("sqlite:///runs/demo.db", "demo/gemm_bf16_tn_4096x4096x4096/triton_matmul/ga/seed0", space)
    store.record(point, result, clock_s=1.5)
    [t.value for t in store.history()]
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from evotune.core.result import EvalResult, Status
from evotune.core.space import Point, SearchSpace
from evotune.storage.optuna_rdb import write_trials
from evotune.storage.url import (
    StorageError,
    check_sqlite_file,
    first_line,
    missing_tables,
    read_connection,
    shown,
    sqlite_file,
    with_driver,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

METRIC_NAME = "time (ms)"  # what a trial's value is: shown by the dashboard instead of "Objective 0"


def record_storage_url(url: str) -> str:
    """Where ``evotune record`` keeps its studies, derived from the experiment's storage ``url``.

    Recording is kept out of the storage that ``best``, ``plot`` and the dashboard read, so
    that its exhaustive study is never counted, drawn or listed as a tuning result. A file
    gets a sibling (``runs/NAME.db`` -> ``runs/NAME_record.db``, ``journal:runs/NAME.journal``
    -> ``journal:runs/NAME_record.journal``); a database server gets a database of its own on
    the same server (``postgresql://host/evotune`` -> ``postgresql://host/evotune_record``),
    which :func:`create_database` makes when it is missing.
    """
    for prefix in ("journal:", "sqlite:///"):
        if url.startswith(prefix):
            path = url.removeprefix(prefix)
            if path in ("", ":memory:"):
                return url  # nothing on disk to share: a private in-memory database already
            p = Path(path)
            return f"{prefix}{p.with_name(f'{p.stem}_record{p.suffix}')}"
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(url)
    return parsed.set(database=f"{parsed.database or 'optuna'}_record").render_as_string(hide_password=False)


def create_database(url: str) -> None:
    """Create the database of a server ``url`` (PostgreSQL, MySQL) when it does not exist yet.

    Files (sqlite, journal) are created on first use and need nothing. On a server the
    database is made through the server's maintenance database, with the same credentials;
    a user without the right to create databases gets the driver's error.
    """
    if url.startswith(("journal:", "sqlite:")):
        return
    import sqlalchemy

    parsed = sqlalchemy.engine.make_url(with_driver(url))
    name = parsed.database
    if not name:
        return
    postgres = parsed.get_backend_name() == "postgresql"
    admin = parsed.set(database="postgres" if postgres else None)
    engine = sqlalchemy.create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if postgres:
                exists = conn.execute(sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                      {"n": name}).first()
                if not exists:
                    quoted = name.replace('"', '""')
                    conn.execute(sqlalchemy.text(f'CREATE DATABASE "{quoted}"'))
            else:
                quoted = name.replace("`", "``")
                conn.execute(sqlalchemy.text(f"CREATE DATABASE IF NOT EXISTS `{quoted}`"))
    finally:
        engine.dispose()


#: the storage URLs (one a line) that a parent process opened for its child processes: their tables are made and
#: checked against this Optuna, so a child skips both (Alembic's check costs a new process about 2 s)
CHECKED_ENV = "EVOTUNE_STORAGES_CHECKED"


def checked_for_children(urls: list[str]) -> dict[str, str]:
    """Open each of ``urls`` (making its tables, checking its schema), and the environment entry that tells child
    processes so (:data:`CHECKED_ENV`)."""
    for url in urls:
        make_storage(url)
    return {CHECKED_ENV: "\n".join(with_driver(u) for u in urls)}


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for ``url``: RDB URLs (sqlite, postgresql, ...) or ``journal:PATH``, created when missing.

    :class:`~evotune.storage.url.StorageError` (one line) for an unknown URL, a server URL whose driver is not
    installed, or an existing file that is not a sound storage (checked before anything is written to it). A URL
    the parent process checked (:data:`CHECKED_ENV`) is opened without making or checking its tables again.
    """
    url = with_driver(url)
    if url.startswith("journal:"):
        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return _journal(path)
    db = sqlite_file(url)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        if db.exists():
            check_sqlite_file(db)
    # heartbeat-free RDB storage; a trial is added whole, so none can be left RUNNING
    import sqlalchemy

    if (db is None or db.exists()) and url in os.environ.get(CHECKED_ENV, "").splitlines():
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url), skip_compatibility_check=True,
                                          skip_table_creation=True)

    attempt = 0
    while True:
        try:
            with schema_lock(url):
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # workers starting together on a new database race to create Optuna's tables; the loser
            # finds them made a moment later (sqlite is serialised by schema_lock instead)
            attempt += 1
            if attempt == 5:
                raise
            time.sleep(0.5 * attempt)
        except sqlalchemy.exc.OperationalError as exc:  # a server that is not there or refuses: what it said
            raise StorageError(first_line(exc)) from None


def load_rdb() -> None:
    """Import what an RDB storage runs on (SQLAlchemy, Alembic and its templates, Optuna's tables) by opening one
    in memory: called once in a process that forks workers (a ``MODULE:FUNCTION`` preload entry), so that each
    worker opens its storage without them, a second or more when several import them at once."""
    optuna.storages.RDBStorage("sqlite:///:memory:").engine.dispose()


def open_existing(url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url`` for commands that only read (``best``, ``plot``, ``dashboard``): it must exist
    and hold Optuna's tables, and nothing is created or written to open it (no file, no table, no lock file).

    :class:`~evotune.storage.url.StorageError` (one line naming the file or URL) otherwise.
    """
    url = with_driver(url)
    if url.startswith("journal:"):
        path = Path(url.removeprefix("journal:"))
        if not path.is_file():
            raise StorageError(f"no journal file {path} (run the experiment first)")
        return _journal(path)
    db = sqlite_file(url)
    if db is not None:
        if not db.exists():
            raise StorageError(f"no study database at {db} (run the experiment first)")
        check_sqlite_file(db)
    import sqlalchemy

    where = db or shown(url)
    try:
        reading = reading_engine_kwargs(url, db)
        engine = sqlalchemy.create_engine(url, **reading)
        try:
            missing = missing_tables(sqlalchemy.inspect(engine).get_table_names())
        finally:
            engine.dispose()
        if missing:
            raise StorageError(f"{where} holds no Optuna studies (no table {missing[0]!r}), so it is not an evotune "
                               "storage")
        return optuna.storages.RDBStorage(url, engine_kwargs=reading, skip_table_creation=True)
    except (sqlalchemy.exc.SQLAlchemyError, RuntimeError) as exc:  # a server that refuses; another Optuna schema
        raise StorageError(f"cannot open {where}: {first_line(exc)}") from None


def _journal(path: Path) -> optuna.storages.BaseStorage:
    from optuna.storages.journal import JournalStorage

    from evotune.storage.journal import JournalError, KillSafeJournal

    try:  # the journal is read whole here: a file none of whose lines is a record, or a broken record, fails now
        return JournalStorage(KillSafeJournal(path))
    except JournalError:  # a broken record: it names the file and the line itself
        raise
    except (ValueError, KeyError, TypeError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise StorageError(f"{path} is not a readable Optuna journal, so not an evotune storage "
                           f"({first_line(exc)})") from None


@contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Workers starting together on a new sqlite file must not create its tables at once (they collide)."""
    if not url.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(f"{url.removeprefix('sqlite:///')}.init-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: several workers on one sqlite file wait for its lock instead of failing."""
    if url.startswith("sqlite:"):  # a file: no connection to go stale, nothing to ping before each use
        from evotune.storage.trial_writer import WalConnection

        return {"connect_args": {"timeout": 120, "factory": WalConnection}}  # WAL, synchronous = NORMAL
    return {"pool_pre_ping": True}


def reading_engine_kwargs(url: str, db: Path | None) -> dict[str, Any]:
    """SQLAlchemy engine options for a storage that is only read: an sqlite file ``db`` is read through
    :func:`~evotune.storage.url.read_connection` (no pragma, no write, the latest commits seen), and each connection
    is closed as soon as it is given back, so none is left open (nor the log SQLite keeps beside it meanwhile)."""
    if db is None:
        return engine_kwargs(url)
    import sqlalchemy

    return {"creator": functools.partial(read_connection, db), "poolclass": sqlalchemy.pool.NullPool}


@dataclass
class Record:
    """One finished trial, as read back from the study."""

    number: int
    point: Point
    key: str
    status: Status
    value: float | None
    attrs: dict[str, Any]

    @property
    def clock_s(self) -> float:
        return float(self.attrs.get("clock_s", 0.0))


def timing_seconds(records: Iterable[Record], confirmation: Mapping[str, Any] | None = None) -> float:
    """The GPU's seconds on timing ``records`` (their ``bench_s``: compiles not counted) and, when given, the
    confirmation stage that followed them (its record's ``seconds``)."""
    seconds = sum(float(r.attrs.get("bench_s") or 0.0) for r in records)
    return seconds + (float(confirmation.get("seconds") or 0.0) if confirmation is not None else 0.0)


class StudyStore:
    """One Optuna study, seen as a list of evaluated points."""

    def __init__(self, study: optuna.Study, space: SearchSpace, storage: optuna.storages.BaseStorage):
        self.study = study
        self.space = space
        self.storage = storage
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.dists: dict[str, BaseDistribution] = {p.name: CategoricalDistribution(p.storage_choices())
                                                   for p in space.params}

    @classmethod
    def open(cls, storage: str | optuna.storages.BaseStorage, name: str, space: SearchSpace,
             attrs: Mapping[str, Any] | None = None) -> StudyStore:
        """Create the study, or load it when it exists (resume)."""
        st = make_storage(storage) if isinstance(storage, str) else storage
        try:  # load first: creating an existing study still appends a (failing) record to a journal
            study = optuna.load_study(study_name=name, storage=st)
        except KeyError:
            study = optuna.create_study(storage=st, study_name=name, direction="minimize", load_if_exists=True)
        for k, v in (attrs or {}).items():
            if study.user_attrs.get(k) != _jsonable(v):
                study.set_user_attr(k, _jsonable(v))
        if study.metric_names != [METRIC_NAME]:  # also names the objective of studies made before it was named
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since optuna 3.2
                study.set_metric_names([METRIC_NAME])
        return cls(study, space, st)

    @classmethod
    def load(cls, storage: optuna.storages.BaseStorage, name: str, space: SearchSpace) -> StudyStore | None:
        """The study ``name`` when it exists, else None (nothing is created)."""
        try:
            return cls(optuna.load_study(study_name=name, storage=storage), space, storage)
        except KeyError:
            return None

    def history(self) -> list[Record]:
        """Every finished trial, in order."""
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            try:
                point = self.space.from_storage(t.params)
            except (KeyError, ValueError):
                continue  # a trial of some other space version; it keeps its place in storage
            status = Status(t.user_attrs.get("status", "ok" if t.state == TrialState.COMPLETE else "runtime_error"))
            out.append(Record(t.number, point, t.user_attrs.get("key") or self.space.key(point), status,
                              t.value if t.state == TrialState.COMPLETE else None, dict(t.user_attrs)))
        return out

    def record(self, point: Point, result: EvalResult, clock_s: float, extra: Mapping[str, Any] | None = None,
               *, started: _dt.datetime | None = None, wall_s: float | None = None) -> int:
        """Write one finished evaluation as one trial (see :meth:`trial`); its number."""
        return self.write(self.trial(point, result, clock_s, extra, started=started, wall_s=wall_s))

    def trial(self, point: Point, result: EvalResult, clock_s: float, extra: Mapping[str, Any] | None = None,
              *, started: _dt.datetime | None = None, wall_s: float | None = None) -> optuna.trial.FrozenTrial:
        """The trial of one finished evaluation: COMPLETE when OK, else FAIL with its reason.

        ``started`` is when the evaluation began and ``wall_s`` how long it took: they become the
        trial's start and completion times. Without them (a point copied from elsewhere, not
        evaluated here) the trial starts and completes now and has no ``wall_s``.
        """
        # The value is the trial's own; problem, strategy and seed are the study's.
        attrs = {
            "key": self.space.key(point), "status": result.status.value, "samples_ms": list(result.samples_ms),
            "compile_s": result.compile_s, "bench_s": result.bench_s, "clock_s": clock_s, "wall_s": wall_s,
            "error": result.error, "message": result.message[:2000] or None,
        }
        attrs.update({k: _jsonable(v) for k, v in result.extra.items()})
        attrs.update({k: _jsonable(v) for k, v in (extra or {}).items()})
        ok = result.status is Status.OK
        trial = optuna.trial.create_trial(
            params=self.space.to_storage(point), distributions=self.dists,
            value=result.time_ms if ok else None, state=TrialState.COMPLETE if ok else TrialState.FAIL,
            user_attrs={k: v for k, v in attrs.items() if v is not None},
        )
        if started is not None:  # create_trial stamps both with "now": the evaluation's own times instead
            trial.datetime_start = started
            trial.datetime_complete = started + _dt.timedelta(seconds=wall_s or 0.0)
        return trial

    def write(self, trial: optuna.trial.FrozenTrial) -> int:
        """Store the finished ``trial``; its number."""
        return self.write_all([trial])[0]

    def write_all(self, trials: list[optuna.trial.FrozenTrial]) -> list[int]:
        """Store the finished ``trials``, in order; their numbers. An RDB storage gets them in one transaction of
        a few statements (:func:`evotune.storage.optuna_rdb.write_trials`)."""
        return write_trials(self.storage, self.study_id, trials) if trials else []


def _jsonable(v: Any) -> Any:
    """Optuna stores user attributes as JSON: turn tuples, numpy scalars and the like into plain values."""
    return json.loads(json.dumps(v, default=lambda o: o.item() if hasattr(o, "item") else str(o)))

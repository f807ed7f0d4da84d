"""What a storage URL names, checked before Optuna opens it.

* A database server URL gets a driver that is installed: SQLAlchemy 2.1 reads
  ``postgresql://`` as psycopg 3, and the ``postgres`` extra installs psycopg2,
  so a URL that names no driver takes whichever of the two is importable;
  ``postgresql+psycopg2://`` and ``postgresql+psycopg://`` keep their own.
* An existing sqlite file must be a sound SQLite database: a file that is not
  one, or one with damaged pages, is refused with what SQLite said, before
  Optuna (whose message for a damaged page blames the length of a value) or a
  write can touch it.

Every refusal is a :class:`StorageError`, one line that names the URL or the
file; the command line shows it and exits with code 2.

Example::

    with_driver("postgresql://me@db/evotune")  # 'postgresql+psycopg2://me@db/evotune' where only psycopg2 is
    check_sqlite_file(Path("runs/demo.db"))   # StorageError: ... is not an SQLite database
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

ACCEPTED = "sqlite:///PATH, journal:PATH, postgresql://..., mysql://..."
# a URL that names no driver, where the backend's default driver is not installed, takes the first of these that is
DRIVERS = {"postgresql": ("psycopg2", "psycopg"), "mysql": ("pymysql",)}
INSTALL = {"postgresql": "pip install '.[postgres]' in the evotune clone (psycopg2), or pip install psycopg",
           "mysql": "pip install mysqlclient (or pymysql, with mysql+pymysql://)"}
OPTUNA_TABLES = ("studies", "version_info", "alembic_version")  # without them Optuna writes when it opens


class StorageError(Exception):
    """A storage URL or file that cannot be used; the message is one line naming it."""


def shown(url: str) -> str:
    """``url`` as it may be printed: a server URL's password masked."""
    if url.startswith(("sqlite:", "journal:")) or "@" not in url:
        return url
    import sqlalchemy

    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def with_driver(url: str) -> str:
    """``url``, with a driver that is installed where it names none; StorageError when it names an unknown
    database or no driver for it is installed. Files (sqlite, journal) are returned as they are."""
    if url.startswith(("sqlite:", "journal:")):
        return url
    import sqlalchemy

    try:
        parsed = sqlalchemy.engine.make_url(url)
        dialect = parsed.get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:  # an ArgumentError too: first
        raise StorageError(f"{shown(url)}: unknown kind of database {parsed.drivername!r}; accepted: {ACCEPTED}"
                           ) from None
    except sqlalchemy.exc.ArgumentError:
        raise StorageError(f"{url!r} is not a storage URL; accepted: {ACCEPTED}") from None
    if _installed(dialect):
        return url
    backend = parsed.get_backend_name()
    if parsed.drivername == backend:  # no driver named: any installed one will do
        for driver in DRIVERS.get(backend, ()):
            if _installed(parsed.set(drivername=f"{backend}+{driver}").get_dialect()):
                if url.startswith(f"{backend}://"):  # keep the rest as the user wrote it
                    return url.replace(f"{backend}://", f"{backend}+{driver}://", 1)
                return parsed.set(drivername=f"{backend}+{driver}").render_as_string(hide_password=False)
    need = INSTALL.get(backend, "install a Python driver for it")
    raise StorageError(f"{shown(url)}: its driver ({dialect.driver}) is not installed; {need}")


def _installed(dialect: Any) -> bool:
    try:
        dialect.import_dbapi()
    except ImportError:
        return False
    return True


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (SQLAlchemy's add the statement and a link below it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL; None for an in-memory database (or another kind of URL)."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def read_connection(path: Path) -> sqlite3.Connection:
    """A connection that reads the existing sqlite file ``path`` and writes nothing to it (sets no pragma).

    A file in WAL mode whose log is not beside it is opened as SQLite must open it to read it: an empty log and
    its index are made beside the file while the connection is open, and removed when it closes, and the file is
    not written (its log holds nothing to copy into it). Any other file is opened read-only: a file in
    rollback-journal mode, or in WAL mode with its log beside it (a writer at work, or one that was killed),
    whose commits are read from the log and never copied into the file.
    """
    with open(path, "rb") as f:
        header = f.read(20)
    wal_mode = len(header) == 20 and header[18] == 2  # the file format version to read: 2 is WAL
    if wal_mode and not path.with_name(f"{path.name}-wal").exists():
        return sqlite3.connect(path, timeout=120, check_same_thread=False)
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=120, check_same_thread=False)


def check_sqlite_file(path: Path) -> None:
    """StorageError unless ``path`` (an existing file) is a sound SQLite database; nothing is written to it.

    An empty file is a new database and passes. SQLite's own quick check reads every page, so an overwritten
    stretch in the middle is found here, not when Optuna trips over it.
    """
    if path.is_dir():
        raise StorageError(f"{path} is a folder, not an SQLite database")
    try:
        conn = read_connection(path)
    except (sqlite3.Error, OSError) as exc:
        raise StorageError(f"{path}: cannot open it as an SQLite database ({exc})") from None
    try:
        found = str(conn.execute("PRAGMA quick_check(1)").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        found = str(exc)
    finally:
        conn.close()
    if found == "ok":
        return
    if "not a database" in found:
        raise StorageError(f"{path} is not an SQLite database, so not an evotune storage")
    detail = " ".join(found.replace("*** in database main ***", "").split())[:200]
    raise StorageError(f"{path} is a corrupt SQLite database, so evotune cannot use it (SQLite's check: {detail}); "
                       "restore it from a copy, or move it away to start afresh")


def missing_tables(table_names: list[str]) -> list[str]:
    """Optuna's tables that a database lacks (a storage Optuna has never opened lacks them all)."""
    return [t for t in OPTUNA_TABLES if t not in table_names]

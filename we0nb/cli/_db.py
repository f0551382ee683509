"""The database a command works on. Commands that only read never create anything.

Before a reading command opens a store, :func:`check_we0nb_data` looks at the database
read-only (SQLAlchemy's inspector on a sync engine; a SQLite file is opened with
``mode=ro``, so a missing file is not created) and refuses one without we0nb's tables in
one line. Opening a :class:`~we0nb.SqlPersistence` would create them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import unquote, urlparse

from .._extras import require
from ..messages import Transcript
from ..persistence import MemoryPersistence, Persistence
from ._common import CliError, hint, safe_url

__all__ = ["DEFAULT_DB", "WE0_TABLES", "from_env", "normalize_db", "sqlite_file", "safe_url", "check_we0nb_data",
           "read_sync", "open_store", "load_session"]

DEFAULT_DB = "sqlite:///we0nb-demo.db"
#: tables every we0nb database has (schema v1 and later)
WE0_TABLES = ("we0_meta", "we0_sessions", "we0_messages", "we0_parts")
_MEMORY = ("--db memory holds nothing between commands; use a database URL such as sqlite:///we0nb-demo.db.")


def from_env() -> Optional[str]:
    """``$WE0NB_DB`` if set. Set but empty is refused in its own name: the user typed no --db."""
    db = os.environ.get("WE0NB_DB")
    if db is not None and not db.strip():
        raise CliError("$WE0NB_DB is empty: set it to a database URL such as sqlite:///we0nb-demo.db "
                       "(or unset it), or pass --db.")
    return db


def normalize_db(db: Optional[str]) -> str:
    """A SQLAlchemy URL (its scheme in lower case); a plain path means a SQLite file; ``memory``
    means MemoryPersistence; None (no --db) means ``$WE0NB_DB``, else :data:`DEFAULT_DB`."""
    if db is None:
        db = from_env() or DEFAULT_DB
    if not db or not db.strip():
        raise CliError("--db is empty: pass a database URL such as sqlite:///we0nb-demo.db or a file path.")
    if db == "memory":
        return db
    scheme, sep, rest = db.partition("://")
    return scheme.lower() + sep + rest if sep else f"sqlite:///{db}"


def _parse(url: str) -> Any:
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception as e:  # sqlalchemy.exc.ArgumentError, ValueError (a bad port)
        why = str(e).replace(url, safe_url(url))
        raise CliError(f"--db {safe_url(url)!r} is not a database URL ({why}); expected sqlite:///file.db, "
                       "postgresql://user@host/db or a file path.") from None
    backend = u.get_backend_name()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ("sqlite", "postgresql"):
        raise CliError(f"--db {safe_url(url)}: we0nb stores sessions in SQLite or PostgreSQL, not {backend!r}.")
    if backend == "sqlite" and (u.database or "").startswith("file:"):
        path = unquote(urlparse(u.database).path)
        raise CliError(f"--db {url}: SQLite file: URIs are not supported; name the file instead"
                       + (f": sqlite:///{path}" if path and path != ":memory:" else "") + ".")
    return u


def sqlite_file(url: str) -> Optional[Path]:
    """The file of a ``sqlite:///`` URL (None for other databases and in-memory SQLite)."""
    if not url.startswith("sqlite"):
        return None
    db = _parse(url).database
    if not db or db == ":memory:":
        return None
    return Path(db)


def _sync_engine(url: str, writer: Optional[str] = None) -> Any:
    """A sync engine that reads without writing: SQLite opened ``mode=ro``, PostgreSQL through psycopg."""
    import sqlite3

    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ..persistence.sql.readonly import read_only_uri

    if url == "memory":
        raise CliError(_MEMORY)
    u = _parse(url)
    if u.get_backend_name() == "sqlite":
        f = sqlite_file(url)
        if f is None:
            raise CliError(f"--db {url}: an in-memory SQLite database holds nothing between commands; "
                           "pass the file the sessions were written to.")
        if not f.exists():
            writer = writer or hint("we0nb", "demo", "--db", url)
            raise CliError(f"no database at {f} (from --db {url}). Run `{writer}` first, or pass the --db URL "
                           "the data was written to.")
        if not os.access(f, os.R_OK) or f.is_dir():
            raise CliError(f"cannot read {f} (from --db {url}): it is a folder or not readable by you.")
        # mode=ro; on read-only storage, where a WAL database cannot be read so, immutable=1 (said on stderr)
        target = read_only_uri(str(f.resolve()))
        return create_engine("sqlite://", creator=lambda: sqlite3.connect(target, uri=True), poolclass=NullPool)
    require("psycopg", "A PostgreSQL --db", "postgres")
    return create_engine(u.set(drivername="postgresql+psycopg"), poolclass=NullPool)


def unreadable(url: str, e: BaseException) -> CliError:
    """A database the driver cannot read, in the command line's words (one line, what to do)."""
    first = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
    if "not a database" in first or "malformed" in first:
        return CliError(f"{safe_url(url)} is not a we0nb database or is damaged (SQLite: {first}); "
                        "pass another --db, or restore this file from a backup.")
    return CliError(f"cannot read the database {safe_url(url)}: {first}")


def check_we0nb_data(url: str, writer: Optional[str] = None) -> None:
    """Refuse, in one line and without creating anything, a database without we0nb's tables, one a
    newer we0nb wrote, or one whose tables are not the ones we0nb made. ``writer``: the command
    that would write the data (default ``we0nb demo``), suggested when there is none."""
    read_sync(url, lambda conn: None, writer)


def read_sync(url: str, fn: Callable[[Any], Any], writer: Optional[str] = None) -> Any:
    """``fn(connection)`` on the database opened read-only, once it holds we0nb data it can read."""
    from sqlalchemy.exc import SQLAlchemyError

    engine = _sync_engine(url, writer)
    try:
        with engine.connect() as conn:
            _check_tables(conn, url, writer)
            return fn(conn)
    except SQLAlchemyError as e:
        raise unreadable(url, e) from None
    finally:
        engine.dispose()


def _check_tables(conn: Any, url: str, writer: Optional[str]) -> None:
    from sqlalchemy import inspect, select

    from ..errors import PersistenceError
    from ..persistence.sql import tables as S
    from ..persistence.sql.schema import VERSION_KEY, check_version, foreign_table

    names = set(inspect(conn).get_table_names())
    if not set(WE0_TABLES) <= names:
        foreign = foreign_table(names) if S.meta.name not in names else None
        if foreign is not None:
            raise CliError(f"{safe_url(url)} has a table named {foreign} that we0nb did not make (the database "
                           "has no we0nb schema version); pass another --db, or rename that table.")
        raise CliError(f"no we0nb data in {safe_url(url)} (it has no we0nb tables); write some with "
                       f"`{writer or hint('we0nb', 'demo', '--db', url)}` or pass another --db.")
    row = conn.execute(select(S.meta.c.value).where(S.meta.c.key == VERSION_KEY)).first()
    if row is None:  # (no version yet: the next writer sets it)
        return
    try:
        version = check_version(row[0], repr(safe_url(url)))
    except PersistenceError as e:  # (SchemaVersionError: a newer we0nb wrote it)
        raise CliError(str(e).strip().splitlines()[0]) from None
    if version == S.SCHEMA_VERSION:  # (an older schema is upgraded by the next writer)
        for table in S.metadata.sorted_tables:
            if table.name in names:
                _probe(conn, table, url)


def _probe(conn: Any, table: Any, url: str) -> None:
    """Read nothing from ``table`` with every column we0nb gave it: a table changed since says so."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    try:
        conn.execute(select(*table.c).limit(0)).fetchall()
    except SQLAlchemyError as e:
        first = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
        raise CliError(f"{safe_url(url)} is damaged: its table {table.name} is not the one we0nb made "
                       f"({first}); pass another --db, or restore it from a backup.") from None


def open_store(url: str, *, read_only: bool) -> Persistence:
    """The store of ``url``. ``read_only``: refuse a database that has no we0nb data yet."""
    if url == "memory":
        if read_only:
            raise CliError(_MEMORY)
        return MemoryPersistence()
    if read_only:
        check_we0nb_data(url)
    else:
        _parse(url)
        if url.startswith("postgres"):
            require("psycopg", "A PostgreSQL --db", "postgres")
    from ..persistence.sql import SqlPersistence

    return SqlPersistence(url)


async def load_session(p: Persistence, url: str, session_id: str) -> Transcript:
    """The persisted transcript of ``session_id``; a session the database lacks is one line
    that says how to list the ones it has."""
    tr = await p.load_transcript(session_id)
    if tr.session is None:
        raise CliError(f"no session {session_id!r} in {safe_url(url)}. List the sessions with "
                       f"`{hint('we0nb', 'sessions', '--db', url)}`.")
    return tr

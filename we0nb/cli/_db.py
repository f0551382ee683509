"""The database a command works on. Commands that only read never create anything.

Before a reading command opens a store, :func:`check_we0nb_data` looks at the database
read-only (SQLAlchemy's inspector on a sync engine; a SQLite file is opened with
``mode=ro``, so a missing file is not created) and refuses one without we0nb's tables in
one line. Opening a :class:`~we0nb.SqlPersistence` would create them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from .._extras import require
from ..messages import Transcript
from ..persistence import MemoryPersistence, Persistence
from ._common import CliError, hint

__all__ = ["DEFAULT_DB", "WE0_TABLES", "normalize_db", "sqlite_file", "safe_url", "check_we0nb_data",
           "open_store", "load_session"]

DEFAULT_DB = "sqlite:///we0nb-demo.db"
#: tables every we0nb database has (schema v1 and later)
WE0_TABLES = ("we0_meta", "we0_sessions", "we0_messages", "we0_parts")


def normalize_db(db: str) -> str:
    """A SQLAlchemy URL; a plain path means a SQLite file; ``memory`` means MemoryPersistence."""
    if not db or not db.strip():
        raise CliError("--db is empty: pass a database URL such as sqlite:///we0nb-demo.db or a file path.")
    if db == "memory" or "://" in db:
        return db
    return f"sqlite:///{db}"


def _parse(url: str) -> Any:
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except Exception as e:  # sqlalchemy.exc.ArgumentError, ValueError (a bad port)
        raise CliError(f"--db {url!r} is not a database URL ({e}); expected sqlite:///file.db, "
                       "postgresql://user@host/db or a file path.") from None
    backend = u.get_backend_name()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ("sqlite", "postgresql"):
        raise CliError(f"--db {safe_url(url)}: we0nb stores sessions in SQLite or PostgreSQL, not {backend!r}.")
    return u


def safe_url(url: str) -> str:
    """The URL with its password hidden (for messages)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def sqlite_file(url: str) -> Optional[Path]:
    """The file of a ``sqlite:///`` URL (None for other databases and in-memory SQLite)."""
    if not url.startswith("sqlite"):
        return None
    db = _parse(url).database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db)


def _sync_engine(url: str) -> Any:
    """A sync engine that reads without writing: SQLite opened ``mode=ro``, PostgreSQL through psycopg."""
    import sqlite3

    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ..persistence.sql.readonly import read_only_uri

    u = _parse(url)
    if u.get_backend_name() == "sqlite":
        f = sqlite_file(url)
        if f is None:
            raise CliError(f"--db {url}: an in-memory SQLite database holds nothing between commands; "
                           "pass the file the sessions were written to.")
        if not f.exists():
            raise CliError(f"no database at {f} (from --db {url}). Run `{hint('we0nb', 'demo', '--db', url)}` "
                           "first, or pass the --db URL the sessions were written to.")
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


def check_we0nb_data(url: str) -> None:
    """Refuse, in one line and without creating anything, a database without we0nb's tables."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError

    engine = _sync_engine(url)
    try:
        with engine.connect() as conn:
            names = set(inspect(conn).get_table_names())
    except SQLAlchemyError as e:
        raise unreadable(url, e) from None
    finally:
        engine.dispose()
    if not set(WE0_TABLES) <= names:
        raise CliError(f"no we0nb data in {safe_url(url)} (it has no we0nb tables); "
                       f"write some with `{hint('we0nb', 'demo', '--db', url)}` or pass another --db.")


def open_store(url: str, *, read_only: bool) -> Persistence:
    """The store of ``url``. ``read_only``: refuse a database that has no we0nb data yet."""
    if url == "memory":
        if read_only:
            raise CliError("--db memory holds nothing between commands; use a database URL "
                           "such as sqlite:///we0nb-demo.db.")
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

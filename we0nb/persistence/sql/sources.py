"""What a frame reads from, as a synchronous SQLAlchemy engine; driver errors as PersistenceError.

A frame may be given a :class:`SqlPersistence` (or an agent using one), a SQLAlchemy
``Engine`` or ``AsyncEngine``, or a database URL. :func:`engine_for` turns each into a
synchronous engine to read with (``None`` for a persistence without SQL). It never creates
a database: a URL naming a SQLite file that does not exist is refused with the
:class:`~we0nb.PersistenceError` SqlPersistence uses for a missing folder, and every
driver error is reworded by :func:`read_error` as SqlPersistence words the same cause.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, NamedTuple, Optional
from urllib.parse import unquote

from ...errors import PersistenceError
from .errors import masked_url, wrap

__all__ = ["Source", "driver_errors", "engine_for", "persistence_of", "read_error", "sqlite_file", "sync_url",
           "where_of"]


class Source(NamedTuple):
    engine: Any  # a synchronous sqlalchemy Engine
    owned: bool  # ours: disposed after the read
    check: bool  # given as an Engine or URL: must hold the we0nb tables


def _kind(dialect: str) -> str:
    return {"sqlite": "SQLite", "postgresql": "PostgreSQL"}.get(dialect, dialect)


def where_of(url: Any) -> str:
    """The database as error messages name it (SqlPersistence's wording: the URL, no password)."""
    return repr(url.render_as_string(hide_password=True))


def read_error(e: BaseException, where: str, dialect: str, *, opening: bool = False) -> PersistenceError:
    """A driver error as the PersistenceError SqlPersistence raises for the same cause (same words)."""
    return wrap(getattr(e, "orig", None) or e, where)


def driver_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a database driver raises (through SQLAlchemy or not)."""
    import sqlalchemy.exc

    return sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, OSError


def persistence_of(source: Any) -> Any:
    """An agent's persistence (whatever has a ``.persistence`` that is one), else ``source``."""
    from ..base import Persistence

    if not isinstance(source, (Persistence, str)):
        p = getattr(source, "persistence", None)
        if isinstance(p, Persistence):
            return p
    return source


def engine_for(source: Any) -> Optional[Source]:
    """A synchronous engine on ``source``; ``None`` for a persistence without SQL (read its port).

    A SqlPersistence gives its own engine (tables created, as any use of it does); an
    ``AsyncEngine`` or a URL an engine of our own on the same database.
    """
    import sqlalchemy as sa

    from ..base import Persistence

    source = persistence_of(source)
    if isinstance(source, Persistence):
        factory = getattr(source, "sync_engine", None)
        if not callable(factory):
            return None
        store: Any = source  # (a SqlPersistence: it has a sync_engine)
        url = sa.engine.make_url(store.url)
        _check_file(url, may_be_missing=True)  # SqlPersistence creates its file, never its folder
        try:
            return Source(factory(), owned=False, check=False)
        except PersistenceError:
            raise
        except driver_errors() as e:
            raise read_error(e, where_of(url), url.get_backend_name()) from e
    if isinstance(source, sa.engine.Engine):
        return Source(source, owned=False, check=True)
    if _is_async_engine(source):
        return Source(_engine_on(source.url), owned=True, check=True)
    if isinstance(source, (str, sa.engine.URL)):
        if isinstance(source, str) and "://" not in source:
            raise ValueError(f"{source!r} is not a database URL (expected e.g. 'sqlite:///we0.db').")
        return Source(_engine_on(source), owned=True, check=True)
    raise TypeError(
        "Expected a We0Agent, a persistence (MemoryPersistence, SqlPersistence), a SQLAlchemy Engine "
        f"or AsyncEngine, or a database URL, got {type(source).__name__}."
    )


def _is_async_engine(source: Any) -> bool:
    from sqlalchemy.ext.asyncio import AsyncEngine

    return isinstance(source, AsyncEngine)


def sync_url(url: Any) -> Any:
    """A SQLAlchemy URL with a synchronous driver (``sqlite+aiosqlite`` → ``sqlite`` …)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(str(url)) if not hasattr(url, "drivername") else url
    except Exception as e:  # (SqlPersistence's wording for the same input)
        raise ValueError(f"{masked_url(str(url))!r} is not a database URL ({e}).") from None
    backend = u.get_backend_name()
    driver = u.get_driver_name() if "+" in u.drivername else ""
    if backend in ("postgres", "postgresql"):
        if driver in ("", "asyncpg", "psycopg_async", "psycopg"):
            u = u.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        if driver in ("aiosqlite", "pysqlite_async"):
            u = u.set(drivername="sqlite")
    return u


def sqlite_file(url: Any) -> Optional[str]:
    """The file a SQLite URL names (``None`` for an in-memory database)."""
    db = url.database or ""
    if db in ("", ":memory:") or url.query.get("mode") == "memory":
        return None
    if db.startswith("file:"):
        path, _, query = db[5:].partition("?")
        if "mode=memory" in query:
            return None
        if path.startswith("//"):  # file://[host]/path
            path = "/" + path[2:].partition("/")[2]
        return unquote(path) or None
    return db


def _check_file(url: Any, may_be_missing: bool) -> None:
    """A SQLite database's folder must exist (SqlPersistence's wording), and its file unless ``may_be_missing``."""
    path = sqlite_file(url) if url.get_backend_name() == "sqlite" else None
    if path is None or os.path.exists(path):
        return
    where = where_of(url)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise PersistenceError(f"Cannot open the SQLite database {where}: the folder {folder!r} does not exist.")
    if not may_be_missing:
        raise PersistenceError(f"Cannot open the SQLite database {where}: there is no file {path!r} (reading "
                               "never creates a database). Check the path, or the URL the runs wrote to.")


def _engine_on(url: Any) -> Any:
    """A synchronous engine on ``url``; a SQLite file must exist (reading never creates one)."""
    import sqlalchemy as sa

    from .database import backend_of

    u = sync_url(url)
    backend_of(u)  # (SQLite or PostgreSQL: the PersistenceError SqlPersistence raises for any other)
    _check_file(u, may_be_missing=False)
    return sa.create_engine(u)

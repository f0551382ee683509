"""One database as every path to it sees it: URLs, options, connection settings, the synchronous engine.

:class:`Database` is made once by :class:`~.store.SqlPersistence` from its arguments (checked
here: :func:`database_for`) and given to the driver it picks (:mod:`.driver`) and to the
frames' reads. It owns the synchronous ``Engine`` (:meth:`Database.sync_engine`: the frames,
the CLI, and PostgreSQL's schema work) and the per-connection settings every engine gets
(:meth:`Database.install_events`): SQLite's pragmas, PostgreSQL's ``search_path`` and
``synchronous_commit``.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional, Union
from urllib.parse import urlencode

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, create_engine, make_url

from ..._extras import require
from ...errors import PersistenceError
from .errors import driver_errors, masked_url, wrap
from .readonly import read_only_fallback
from .schema import ConnectionDb, ensure_schema

__all__ = ["Database", "database_for", "sqlite_pragmas", "ensure_schema_on", "pg_settings"]

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def sqlite_pragmas(dbapi_conn: Any, synchronous: str, busy_ms: int) -> None:
    """WAL, ``synchronous`` and the busy timeout: the settings of every we0nb SQLite connection."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        try:
            cur.execute("PRAGMA journal_mode = WAL")
        except Exception:  # on purpose: a read-only database cannot switch; a write will say so clearly
            pass
        cur.execute(f"PRAGMA synchronous = {synchronous}")
    finally:
        cur.close()


def pg_settings(schema: Optional[str], synchronous: str) -> list[str]:
    """What every PostgreSQL connection runs first: the schema, and the commit durability.

    NORMAL is like SQLite's: a killed client loses nothing (the server has the commit); a
    server crash or power loss may lose the last fraction of a second of commits. FULL: every
    commit is flushed to disk."""
    out = [f'SET search_path TO "{schema}"'] if schema is not None else []
    out.append("SET synchronous_commit TO " + ("off" if synchronous in ("OFF", "NORMAL") else "on"))
    return out


def ensure_schema_on(sync_conn: Any, where: str, pg_schema: Optional[str]) -> None:
    """:func:`~.schema.ensure_schema` on a SQLAlchemy connection (run it inside ``begin()``)."""
    ensure_schema(ConnectionDb(sync_conn, where, pg_schema))


@dataclass
class Database:
    """One database and the options it is used with (see :class:`~.store.SqlPersistence`)."""

    dialect: str  # "sqlite" | "postgresql"
    sync_url: URL
    async_url: URL
    where: str  # the database as error messages name it (no password)
    schema: Optional[str]
    synchronous: str
    busy_timeout: float
    engine_options: dict[str, Any]
    async_engine: Any = None  # an AsyncEngine passed in
    _sync_engine: Optional[Engine] = None  # an Engine passed in, or ours once made
    _sync_ready: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _installed: "weakref.WeakSet[Any]" = field(default_factory=weakref.WeakSet)

    def install_events(self, sync_engine: Engine) -> None:
        """Give every connection of ``sync_engine`` our settings (once per engine)."""
        if sync_engine in self._installed:
            return
        self._installed.add(sync_engine)
        if self.dialect == "sqlite":
            synchronous, busy_ms = self.synchronous, int(self.busy_timeout * 1000)

            @event.listens_for(sync_engine, "connect")
            def _on_connect(dbapi_conn: Any, record: Any) -> None:
                sqlite_pragmas(dbapi_conn, synchronous, busy_ms)
            return
        settings = pg_settings(self.schema, self.synchronous)

        @event.listens_for(sync_engine, "connect")
        def _on_connect_pg(dbapi_conn: Any, record: Any) -> None:
            cur = dbapi_conn.cursor()
            for stmt in settings:
                cur.execute(stmt)
            cur.close()
            dbapi_conn.commit()

    def sync_engine(self) -> Engine:
        """A cached synchronous ``Engine`` on the database and schema, tables created."""
        with self._lock:
            eng = self._sync_engine
            if eng is None:
                if self.sync_url.query.get("mode") == "memory":
                    from sqlalchemy.pool import SingletonThreadPool

                    eng = create_engine(self.sync_url, poolclass=SingletonThreadPool)
                else:
                    eng = self._read_only_engine() or create_engine(self.sync_url)
                self._sync_engine = eng
            self.install_events(eng)
            if not self._sync_ready:
                for attempt in (1, 2):
                    try:
                        with eng.begin() as conn:
                            ensure_schema_on(conn, self.where, self.schema)
                        break
                    except driver_errors() as e:  # lost a creation race with another process: look again
                        if attempt == 2:
                            raise wrap(e, self.where) from e
                self._sync_ready = True
            return eng

    def _read_only_engine(self) -> Optional[Engine]:
        """For a SQLite file on read-only storage: an engine that reads it as it can (see .readonly)."""
        if self.dialect != "sqlite":
            return None
        database, uri = sqlite_target(self.sync_url)
        ro = read_only_fallback(database, uri)
        if ro is None:
            return None
        import sqlite3

        return create_engine("sqlite://", creator=lambda: sqlite3.connect(ro, uri=True, check_same_thread=False))

    def ensure_schema(self) -> None:
        """Create or upgrade the schema through the synchronous engine; an engine made for this
        leaves no idle connection behind (it reconnects when used again)."""
        made_here = self._sync_engine is None
        eng = self.sync_engine()
        if made_here:
            eng.dispose()

    def dispose(self) -> None:
        """Close the synchronous engine's connections (it reconnects when used again)."""
        with self._lock:
            if self._sync_engine is not None:
                self._sync_engine.dispose()


def database_for(url_or_engine: Union[str, URL, Any], *, synchronous: str, busy_timeout: float, lease_ttl: float,
                 lease_renew: Optional[float], schema: Optional[str], inline_sqlite: bool,
                 engine_options: Optional[dict[str, Any]], token: str) -> Database:
    """The :class:`Database` SqlPersistence's arguments name (ValueError/TypeError for bad ones).
    ``token``: makes the name of an in-memory SQLite database unique to its store."""
    url, async_engine, sync_engine = _target(url_or_engine)
    backend = backend_of(url)
    sync = _check_options(backend, synchronous, busy_timeout, lease_ttl, lease_renew, schema)
    if backend == "sqlite":
        if (url.database or ":memory:") == ":memory:" and async_engine is None and sync_engine is None:
            # an in-memory database, shared by name with sync_engine() (same process only)
            url = url.set(database=f"file:we0nb-{os.getpid()}-{token}-{os.urandom(4).hex()}",
                          query={"mode": "memory", "cache": "shared", "uri": "true"})
            if not inline_sqlite:
                raise ValueError("SqlPersistence: an in-memory SQLite database needs inline_sqlite=True.")
        sync_url, async_url = url.set(drivername="sqlite"), url.set(drivername="sqlite+aiosqlite")
    else:
        if async_engine is None and sync_engine is None:  # the driver is an extra: one clear line
            require("psycopg", "SqlPersistence with a PostgreSQL URL", "postgres")
        sync_url = async_url = url.set(drivername="postgresql+psycopg")
    return Database(dialect=backend, sync_url=sync_url, async_url=async_url,
                    where=repr(sync_url.render_as_string(hide_password=True)), schema=schema, synchronous=sync,
                    busy_timeout=float(busy_timeout), engine_options=dict(engine_options or {}),
                    async_engine=async_engine, _sync_engine=sync_engine)


def sqlite_target(url: URL) -> tuple[str, bool]:
    """``(database, uri)`` for ``sqlite3.connect`` from a SQLAlchemy URL."""
    database = url.database or ":memory:"
    query = dict(url.query)
    if str(query.pop("uri", "false")).lower() in ("true", "1"):
        for k in ("timeout", "check_same_thread", "isolation_level", "detect_types", "cached_statements"):
            query.pop(k, None)
        q = urlencode({k: (v[-1] if isinstance(v, tuple) else v) for k, v in query.items()})
        target = database if database.startswith("file:") else f"file:{database}"
        return (f"{target}?{q}" if q else target), True
    return database, False


def _target(url_or_engine: Any) -> tuple[URL, Any, Optional[Engine]]:
    """``(url, async engine passed in or None, sync engine passed in or None)``."""
    if isinstance(url_or_engine, (str, URL)):
        try:
            return make_url(url_or_engine), None, None
        except Exception as e:
            shown = masked_url(str(url_or_engine))
            raise ValueError(f"SqlPersistence: {shown!r} is not a database URL ({e}).") from None
    if isinstance(url_or_engine, Engine):
        return url_or_engine.url, None, url_or_engine
    if hasattr(url_or_engine, "sync_engine") and hasattr(url_or_engine, "begin"):
        return url_or_engine.url, url_or_engine, None
    raise TypeError(
        "SqlPersistence(url_or_engine): expected a URL such as 'sqlite:///we0.db' or "
        f"'postgresql://user@host/db', or a SQLAlchemy AsyncEngine; got {type(url_or_engine).__name__}."
    )


def backend_of(url: URL) -> str:
    """``"sqlite"`` or ``"postgresql"``; a PersistenceError for any other database (we0nb keeps no data there)."""
    backend = url.get_backend_name()
    if backend == "postgres":
        backend = "postgresql"
    if backend not in ("sqlite", "postgresql"):
        raise PersistenceError(f"SqlPersistence supports SQLite and PostgreSQL, not {backend!r} ({url.drivername}).")
    return backend


def _check_options(backend: str, synchronous: str, busy_timeout: float, lease_ttl: float,
                   lease_renew: Optional[float], schema: Optional[str]) -> str:
    """Raise ValueError for a bad option; returns ``synchronous`` upper-cased."""
    sync = str(synchronous).upper()
    if sync not in _SYNCHRONOUS:
        raise ValueError(f"SqlPersistence(synchronous=...): expected 'NORMAL' or 'FULL', got {synchronous!r}.")
    if not isinstance(busy_timeout, (int, float)) or busy_timeout < 0:
        raise ValueError("SqlPersistence(busy_timeout=...): expected seconds >= 0.")
    if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
        raise ValueError("SqlPersistence(lease_ttl=...): expected seconds > 0.")
    renew = lease_ttl / 3.0 if lease_renew is None else lease_renew
    if not isinstance(renew, (int, float)) or not 0 < renew < lease_ttl:
        raise ValueError("SqlPersistence(lease_renew=...): expected seconds > 0 and below lease_ttl.")
    if schema is not None:
        if backend != "postgresql":
            raise ValueError("SqlPersistence(schema=...) is for PostgreSQL databases.")
        if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema):
            raise ValueError(f"SqlPersistence(schema=...): {schema!r} is not a plain SQL identifier.")
    return sync

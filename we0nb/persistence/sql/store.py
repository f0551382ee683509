"""SqlPersistence: the persistence port on SQL — SQLite by default, PostgreSQL for many kernels.

Every write is its own committed transaction, so the loop's writes *are* the durability
points (write-ahead of tools, the assistant message at step start, coalesced text
flushes); :meth:`SqlPersistence.flush` has nothing left to do.

Two ways to talk to the database, one set of SQL statements:

* **SQLite, inline** (the default for ``sqlite://`` URLs): statements run on the calling
  thread through one ``sqlite3`` connection in WAL mode. A WAL commit with
  ``synchronous=NORMAL`` takes ~20 µs — less than one hop to a driver thread — so this is
  both the fastest and the simplest path; it holds no event-loop objects, so one instance
  works across successive ``asyncio.run()`` calls. A write waits at most ``busy_timeout``
  for another process's write lock (write transactions here are a single statement).
* **Async engine** (PostgreSQL through psycopg 3, or any ``AsyncEngine`` you pass, or SQLite
  with ``inline_sqlite=False``): SQLAlchemy 2 asyncio. Async pools are bound to the event
  loop that created their connections, so there is one ``AsyncEngine`` per running loop,
  created lazily (an engine you pass is re-pooled when the loop changes); when
  ``asyncio.run()`` shuts a loop down, its pool is closed on that loop. Single statements
  run in autocommit (one round trip); batches run in one transaction.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (``"FULL"`` on request) and a busy
timeout; WAL checkpoints (the only fsyncs under NORMAL) run on a background thread every
few hundred commits instead of inside a commit. On PostgreSQL, ``synchronous="NORMAL"``
sets ``synchronous_commit=off`` for our connections — the same promise as SQLite's NORMAL:
a killed client loses nothing, a server crash may lose the last fraction of a second of
commits, nothing is ever corrupted — and ``"FULL"`` sets it ``on``.

The schema (``we0nb.persistence.sql.tables``) is created on first use, with a version row in
``we0_meta``; a database written by a newer version is refused with
:class:`~we0nb.SchemaVersionError`.

The session lease (``we0_leases``) works across processes and hosts: acquiring is an
atomic insert-if-absent or a compare-and-swap on the row that was seen (so two processes
cannot both win); a lease whose owner is on this host with a PID that is no longer alive is
taken over at once, any other lease only after it expires. A background task renews the
lease every ``lease_renew`` seconds while the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import socket
import sqlite3
import threading
import time
import weakref
from typing import Any, Iterator, NoReturn, Optional, Sequence, Union
from urllib.parse import urlencode

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, create_engine, make_url

from ...errors import CorruptRecordError, PersistenceError, SchemaVersionError, SessionBusyError
from ...messages import Message, MessageWithParts, Part, Session, Transcript
from . import tables as S
from ...models.view import load_views
from .errors import raise_persistence_error as _raise_wrapped
from ..base import Batch, Lease, MessageInfo, Persistence, RecentHistory, lease_owner, recent_start

__all__ = ["SqlPersistence"]

log = logging.getLogger("we0nb.persistence.sql")

_VERSION_KEY = "schema_version"
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")

#: owners (host:pid:run) of the leases this process holds right now, whatever the instance
_LIVE_OWNERS: set[str] = set()

_SESSION_ADAPTER: TypeAdapter[Session] = TypeAdapter(Session)
_MESSAGE_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)
_PART_ADAPTER: TypeAdapter[Any] = TypeAdapter(Part)
_MWP_VALIDATE = MessageWithParts.model_validate_json


# --------------------------------------------------------------------------- SQL text
# Written once in ``:name`` style (sqlite3); converted to ``%(name)s`` for psycopg.


def _upsert(table: Any, key: str) -> str:
    cols = [c.name for c in table.columns]
    return (
        f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)}) "
        f"ON CONFLICT ({key}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in cols if c != key)
    )


_SQL = {
    "upsert_session": _upsert(S.sessions, "id"),
    "upsert_message": _upsert(S.messages, "id"),
    "upsert_part": _upsert(S.parts, "id"),
    "get_session": "SELECT id, data FROM we0_sessions WHERE id = :sid",
    "list_sessions": "SELECT id, data FROM we0_sessions ORDER BY id",
    "load_messages": "SELECT id, data FROM we0_messages WHERE session_id = :sid ORDER BY id",
    "load_parts": "SELECT id, message_id, data FROM we0_parts WHERE session_id = :sid ORDER BY message_id, id",
    "delete_parts": "DELETE FROM we0_parts WHERE session_id = :sid AND message_id = :mid",
    "delete_message": "DELETE FROM we0_messages WHERE session_id = :sid AND id = :mid",
    "lease_insert": (
        "INSERT INTO we0_leases (session_id, owner, host, pid, run_id, expires) "
        "VALUES (:sid, :owner, :host, :pid, :run_id, :expires) ON CONFLICT (session_id) DO NOTHING"
    ),
    "lease_get": "SELECT owner, host, pid, expires FROM we0_leases WHERE session_id = :sid",
    "lease_take": (
        "UPDATE we0_leases SET owner = :owner, host = :host, pid = :pid, run_id = :run_id, expires = :expires "
        "WHERE session_id = :sid AND owner = :old_owner AND expires = :old_expires"
    ),
    "lease_renew": "UPDATE we0_leases SET expires = :expires WHERE session_id = :sid AND owner = :owner",
    "lease_release": "DELETE FROM we0_leases WHERE session_id = :sid AND owner = :owner",
    "version_get": "SELECT value FROM we0_meta WHERE key = :key",
    "version_set": "INSERT INTO we0_meta (key, value) VALUES (:key, :value) ON CONFLICT (key) DO NOTHING",
    "version_update": "UPDATE we0_meta SET value = :value WHERE key = :key",
    "recent_index": "SELECT id, role, summary, model_view FROM we0_messages WHERE session_id = :sid ORDER BY id",
    "load_messages_from": "SELECT id, data FROM we0_messages WHERE session_id = :sid AND id >= :mid ORDER BY id",
    "load_parts_from": (
        "SELECT id, message_id, data FROM we0_parts WHERE session_id = :sid AND message_id >= :mid "
        "ORDER BY message_id, id"
    ),
}
_PYFORMAT = re.compile(r":([A-Za-z_]\w*)")
_SQL_PG = {k: _PYFORMAT.sub(r"%(\1)s", v) for k, v in _SQL.items()}


# --------------------------------------------------------------------------- rows


def _session_row(s: Session) -> dict[str, Any]:
    return {
        "id": s.id,
        "title": s.title,
        "created": s.time.created,
        "updated": s.time.updated,
        "revert_message_id": s.revert.message_id if s.revert is not None else None,
        "data": s.model_dump_json(),
    }


def _message_row(m: MessageInfo, view: Optional[str] = None) -> dict[str, Any]:
    row = S.message_columns(m)
    row["data"] = m.model_dump_json()
    row["model_view"] = view
    return row


def _part_row(p: Any) -> dict[str, Any]:
    row = S.part_columns(p)
    row["data"] = p.model_dump_json()
    return row


# --------------------------------------------------------------------------- helpers


def _pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive on this host? (A zombie — killed, not yet reaped — is not.)"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # pragma: no cover - unusual platforms: assume alive, the TTL decides
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return False
    except (OSError, IndexError):
        pass
    return True


def _check_version(value: Any, where: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise PersistenceError(
            f"The database {where} has an unreadable we0nb schema version {value!r} in table we0_meta; "
            "it was not written by we0nb, or it is damaged."
        ) from None
    if v > S.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"The database {where} was written by a newer we0nb (schema version {v}; this version "
            f"reads schema version {S.SCHEMA_VERSION} and older). Upgrade we0nb (pip install -U we0nb) "
            "or point SqlPersistence at another database."
        )
    return v


def _ensure_schema_sync(conn: Connection, where: str, pg_schema: Optional[str]) -> None:
    """Create the tables and the version row if missing, or check the version (sync connection)."""
    if pg_schema is not None and conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
    style = _SQL_PG if conn.dialect.name == "postgresql" else _SQL
    dialect = conn.dialect.name
    if conn.dialect.has_table(conn, S.meta.name):
        row = conn.exec_driver_sql(style["version_get"], {"key": _VERSION_KEY}).first()
        if row is not None:
            version = _check_version(row[0], where)
            if version < S.SCHEMA_VERSION:
                for stmt in S.upgrade(version, dialect):
                    conn.exec_driver_sql(stmt)
                conn.exec_driver_sql(style["version_update"], {"key": _VERSION_KEY, "value": str(S.SCHEMA_VERSION)})
                log.info("upgraded %s from we0nb schema version %s to %s", where, version, S.SCHEMA_VERSION)
            return
    S.metadata.create_all(conn)
    for stmt in S.triggers(dialect):
        conn.exec_driver_sql(stmt)
    conn.exec_driver_sql(style["version_set"], {"key": _VERSION_KEY, "value": str(S.SCHEMA_VERSION)})
    row = conn.exec_driver_sql(style["version_get"], {"key": _VERSION_KEY}).first()
    _check_version(row[0] if row else S.SCHEMA_VERSION, where)


def _sqlite_pragmas(dbapi_conn: Any, synchronous: str, busy_ms: int) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        try:
            cur.execute("PRAGMA journal_mode = WAL")
        except Exception:  # a read-only database cannot switch; writes will say so clearly
            pass
        cur.execute(f"PRAGMA synchronous = {synchronous}")
    finally:
        cur.close()


# --------------------------------------------------------------------------- backends


class _Inline:
    """SQLite through one ``sqlite3`` connection, statements run on the calling thread."""

    def __init__(self, database: str, uri: bool, synchronous: str, busy_ms: int, where: str):
        self.database, self.uri, self.where = database, uri, where
        self.synchronous, self.busy_ms = synchronous, busy_ms
        self.lock = threading.RLock()
        self.conn: Optional[sqlite3.Connection] = None
        self.wal = False
        self.commits = 0
        self.ckpt_wake = threading.Event()
        self.ckpt_thread: Optional[threading.Thread] = None
        self.ckpt_stop = False

    def open(self) -> sqlite3.Connection:
        with self.lock:
            if self.conn is not None:
                return self.conn
            if not self.uri and self.database not in ("", ":memory:"):
                folder = os.path.dirname(os.path.abspath(self.database))
                if not os.path.isdir(folder):
                    raise PersistenceError(
                        f"Cannot open the SQLite database {self.where}: the folder {folder!r} does not exist."
                    )
            try:
                conn = sqlite3.connect(self.database, uri=self.uri, isolation_level=None,
                                       check_same_thread=False, timeout=self.busy_ms / 1000.0)
            except sqlite3.Error as e:
                raise PersistenceError(f"Cannot open the SQLite database {self.where}: {e}.") from e
            try:
                _sqlite_pragmas(conn, self.synchronous, self.busy_ms)
                self.wal = conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
                if self.wal:
                    # checkpoints (which fsync) run on a background thread, not in a commit
                    conn.execute("PRAGMA wal_autocheckpoint = 0")
                self._ensure_schema(conn)
                self._probe_writable(conn)
            except sqlite3.Error as e:  # e.g. "file is not a database"
                conn.close()
                raise PersistenceError(f"Cannot use the SQLite database {self.where}: {e}.") from e
            except BaseException:
                conn.close()
                raise
            self.conn = conn
            self.commits = 0
            return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        try:
            row = conn.execute(_SQL["version_get"], {"key": _VERSION_KEY}).fetchone()
        except sqlite3.OperationalError as e:
            if "no such table" not in str(e):
                self._raise(e)
            row = None
        if row is not None and _check_version(row[0], self.where) == S.SCHEMA_VERSION:
            return
        if row is not None:
            self._upgrade(conn)
            return
        # first use of this database: create the tables (DDL compiled by SQLAlchemy)
        from sqlalchemy.dialects import sqlite as sqlite_dialect
        from sqlalchemy.schema import CreateIndex, CreateTable

        dialect = sqlite_dialect.dialect()
        with self._schema_tx(conn):
            for table in S.metadata.sorted_tables:
                conn.execute(str(CreateTable(table, if_not_exists=True).compile(dialect=dialect)))
                for index in table.indexes:
                    conn.execute(str(CreateIndex(index, if_not_exists=True).compile(dialect=dialect)))
            for stmt in S.triggers("sqlite"):
                conn.execute(stmt)
            conn.execute(_SQL["version_set"], {"key": _VERSION_KEY, "value": str(S.SCHEMA_VERSION)})
            row = conn.execute(_SQL["version_get"], {"key": _VERSION_KEY}).fetchone()
        _check_version(row[0] if row else S.SCHEMA_VERSION, self.where)

    @contextlib.contextmanager
    def _schema_tx(self, conn: sqlite3.Connection) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on any error): schema work under the write lock."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:
            self._raise(e)

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """An older schema: upgrade it in place, under the write lock (another process may race)."""
        with self._schema_tx(conn):
            row = conn.execute(_SQL["version_get"], {"key": _VERSION_KEY}).fetchone()
            version = _check_version(row[0], self.where)
            for stmt in S.upgrade(version, "sqlite"):
                conn.execute(stmt)
            conn.execute(_SQL["version_update"], {"key": _VERSION_KEY, "value": str(S.SCHEMA_VERSION)})
        if version < S.SCHEMA_VERSION:
            log.info("upgraded %s from we0nb schema version %s to %s", self.where, version, S.SCHEMA_VERSION)

    def _probe_writable(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("INSERT OR REPLACE INTO we0_meta (key, value) VALUES ('write_probe', '')")
            finally:
                conn.execute("ROLLBACK")
        except sqlite3.Error as e:
            self._raise(e)

    def _raise(self, e: BaseException) -> NoReturn:
        _raise_wrapped(e, f"SQLite {self.where}")

    def close(self) -> None:
        thread = self.ckpt_thread
        if thread is not None:
            self.ckpt_stop = True
            self.ckpt_wake.set()
            thread.join(timeout=30)
            self.ckpt_thread = None
            self.ckpt_stop = False
        with self.lock:
            if self.conn is not None:
                self.conn.close()  # the last connection checkpoints and removes the WAL
                self.conn = None

    # ---- WAL checkpoints off the calling thread
    CHECKPOINT_EVERY = 1000  # commits (a few thousand WAL pages: each checkpoint fsyncs)

    def _committed(self) -> None:
        self.commits += 1
        if self.commits >= self.CHECKPOINT_EVERY and self.wal:
            self.commits = 0
            if self.ckpt_thread is None or not self.ckpt_thread.is_alive():
                self.ckpt_thread = threading.Thread(target=self._checkpointer, name="we0nb-sqlite-checkpoint",
                                                    daemon=True)
                self.ckpt_thread.start()
            self.ckpt_wake.set()

    def _checkpointer(self) -> None:
        try:
            conn = sqlite3.connect(self.database, uri=self.uri, isolation_level=None, check_same_thread=False,
                                   timeout=self.busy_ms / 1000.0)
        except sqlite3.Error:  # pragma: no cover - the writer's connection opened just fine
            return
        try:
            _sqlite_pragmas(conn, self.synchronous, self.busy_ms)
            while True:
                self.ckpt_wake.wait()
                self.ckpt_wake.clear()
                if self.ckpt_stop:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as e:  # busy or read-only: the next round tries again
                    log.debug("WAL checkpoint skipped: %s", e)
        finally:
            conn.close()

    # each call is one committed transaction (autocommit for a single statement)
    def execute(self, key: str, params: dict[str, Any]) -> int:
        with self.lock:
            conn = self.conn or self.open()
            try:
                n = conn.execute(_SQL[key], params).rowcount
            except sqlite3.Error as e:
                self._raise(e)
            self._committed()
            return n

    def transaction(self, ops: Sequence[tuple[str, Any]]) -> None:
        """Several statements (``(key, params)`` or ``(key, [params, ...])``) in one transaction."""
        with self.lock:
            conn = self.conn or self.open()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for key, params in ops:
                        if isinstance(params, list):
                            conn.executemany(_SQL[key], params)
                        else:
                            conn.execute(_SQL[key], params)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                self._raise(e)
            self._committed()

    def fetchall(self, key: str, params: dict[str, Any]) -> list[Any]:
        with self.lock:
            conn = self.conn or self.open()
            try:
                return conn.execute(_SQL[key], params).fetchall()
            except sqlite3.Error as e:
                self._raise(e)


class _Async:
    """An AsyncEngine per running event loop (async pools are bound to their loop)."""

    def __init__(self, owner: "SqlPersistence", engine: Any = None):
        self.owner = owner
        self.user_engine = engine
        self.user_loop: Optional[weakref.ReferenceType] = None
        self.engines: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.ready = False
        self.guards: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.sql = _SQL_PG if owner.dialect == "postgresql" else _SQL
        self.autocommit: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    async def auto(self) -> Any:
        """The engine in autocommit mode: a single statement is one round trip, no BEGIN/COMMIT."""
        eng = await self.engine()
        auto = self.autocommit.get(eng.sync_engine)
        if auto is None:
            auto = eng.execution_options(isolation_level="AUTOCOMMIT")
            self.autocommit[eng.sync_engine] = auto
        return auto

    async def engine(self) -> Any:
        loop = asyncio.get_running_loop()
        if self.user_engine is not None:
            eng = self.user_engine
            previous = self.user_loop() if self.user_loop is not None else None
            if previous is not loop:
                if self.user_loop is not None:
                    # connections of the previous loop cannot be used (or closed) from this one
                    await eng.dispose(close=False)
                self.user_loop = weakref.ref(loop)
                self.owner._install_events(eng.sync_engine)
                await self._guard(loop, eng)
        else:
            eng = self.engines.get(loop)
            if eng is None:
                from sqlalchemy.ext.asyncio import create_async_engine

                eng = create_async_engine(self.owner._async_url, **self.owner._engine_options)
                self.owner._install_events(eng.sync_engine)
                self.engines[loop] = eng
                for old_loop, old in list(self.engines.items()):
                    if old_loop is not loop and old_loop.is_closed():
                        # its connections belong to a closed loop: drop them, do not close them
                        self.engines.pop(old_loop, None)
                        await old.dispose(close=False)
                await self._guard(loop, eng)
        if not self.ready:
            await self._ensure(eng)
        return eng

    async def _guard(self, loop: asyncio.AbstractEventLoop, eng: Any) -> None:
        """Close ``eng``'s connections while their loop still runs, when it shuts down.

        ``asyncio.run()`` finalizes live async generators (``loop.shutdown_asyncgens()``)
        before closing the loop: this one's ``finally`` disposes of the pool there, so no
        connection outlives the loop it belongs to.
        """
        async def guard() -> Any:
            try:
                yield
            finally:
                self.guards.pop(loop, None)
                if self.engines.get(loop) is eng:
                    del self.engines[loop]
                if self.user_engine is eng:
                    self.user_loop = None
                try:
                    await eng.dispose()
                except Exception:  # pragma: no cover - shutting down anyway
                    pass

        agen = guard()
        await agen.__anext__()
        self.guards[loop] = agen  # the loop keeps only a weak reference

    async def _ensure(self, eng: Any) -> None:
        where, schema = self.owner._where, self.owner.schema
        try:
            async with eng.begin() as conn:
                await conn.run_sync(_ensure_schema_sync, where, schema)
        except PersistenceError:
            raise
        except Exception as e:
            # two processes creating the tables at once: one loses the race; look again
            try:
                async with eng.begin() as conn:
                    await conn.run_sync(_ensure_schema_sync, where, schema)
            except PersistenceError:
                raise
            except Exception:
                self._raise(e)
        self.ready = True

    def _raise(self, e: BaseException) -> NoReturn:
        _raise_wrapped(e, self.owner._where)

    async def execute(self, key: str, params: dict[str, Any]) -> int:
        eng = await self.auto()
        try:
            async with eng.connect() as conn:  # autocommit: the statement commits by itself
                result = await conn.exec_driver_sql(self.sql[key], params)
                return result.rowcount
        except PersistenceError:
            raise
        except Exception as e:
            self._raise(e)

    async def transaction(self, ops: Sequence[tuple[str, Any]]) -> None:
        eng = await self.engine()
        try:
            async with eng.begin() as conn:
                for key, params in ops:
                    if isinstance(params, list) and not params:
                        continue
                    await conn.exec_driver_sql(self.sql[key], params)
        except PersistenceError:
            raise
        except Exception as e:
            self._raise(e)

    async def fetchall(self, key: str, params: dict[str, Any]) -> list[Any]:
        eng = await self.auto()
        try:
            async with eng.connect() as conn:
                result = await conn.exec_driver_sql(self.sql[key], params)
                return list(result.all())
        except Exception as e:
            self._raise(e)

    async def close(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover
            loop = None
        engines = [self.user_engine] if self.user_engine is not None else []
        own = list(self.engines.items())
        self.engines = weakref.WeakKeyDictionary()
        for lp, eng in own:
            await eng.dispose(close=(lp is loop))
        for eng in engines:
            same = self.user_loop is not None and self.user_loop() is loop
            await eng.dispose(close=same)
            self.user_loop = None


# --------------------------------------------------------------------------- the persistence


class SqlPersistence(Persistence):
    """Sessions, messages and parts in SQL: ``SqlPersistence("sqlite:///we0.db")``.

    ``url_or_engine``: a SQLAlchemy URL (``sqlite:///file.db``, ``postgresql://user@host/db``;
    async driver names such as ``sqlite+aiosqlite`` or ``postgresql+psycopg_async`` are
    accepted too) or an existing ``AsyncEngine``.

    Options: ``synchronous`` (SQLite: ``"NORMAL"`` — the default, a power loss may lose the
    last commits but never corrupts — or ``"FULL"`` — every commit survives a power loss),
    ``busy_timeout`` (seconds a write waits for another writer), ``lease_ttl`` (seconds a
    lease of a run that stopped renewing it blocks others), ``lease_renew`` (seconds between
    renewals, default ``lease_ttl / 3``), ``schema`` (PostgreSQL schema to use, created if
    missing), ``inline_sqlite`` (run SQLite statements on the calling thread — the default;
    False goes through aiosqlite), ``engine_options`` (passed to ``create_async_engine``).
    """

    keeps_views = True

    def __init__(
        self,
        url_or_engine: Union[str, URL, Any] = "sqlite:///we0.db",
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        lease_ttl: float = 15.0,
        lease_renew: Optional[float] = None,
        schema: Optional[str] = None,
        inline_sqlite: bool = True,
        engine_options: Optional[dict[str, Any]] = None,
    ):
        user_engine = None
        sync_user_engine = None
        if isinstance(url_or_engine, (str, URL)):
            try:
                url = make_url(url_or_engine)
            except Exception as e:
                raise ValueError(f"SqlPersistence: {url_or_engine!r} is not a database URL ({e}).") from None
        elif isinstance(url_or_engine, Engine):
            sync_user_engine = url_or_engine
            url = url_or_engine.url
        elif hasattr(url_or_engine, "sync_engine") and hasattr(url_or_engine, "begin"):
            user_engine = url_or_engine
            url = url_or_engine.url
        else:
            raise TypeError(
                "SqlPersistence(url_or_engine): expected a URL such as 'sqlite:///we0.db' or "
                f"'postgresql://user@host/db', or a SQLAlchemy AsyncEngine; got {type(url_or_engine).__name__}."
            )
        backend = url.get_backend_name()
        if backend == "postgres":
            backend = "postgresql"
        if backend not in ("sqlite", "postgresql"):
            raise PersistenceError(
                f"SqlPersistence supports SQLite and PostgreSQL, not {backend!r} ({url.drivername})."
            )
        sync = str(synchronous).upper()
        if sync not in _SYNCHRONOUS:
            raise ValueError(f"SqlPersistence(synchronous=...): expected 'NORMAL' or 'FULL', got {synchronous!r}.")
        if not isinstance(busy_timeout, (int, float)) or busy_timeout < 0:
            raise ValueError("SqlPersistence(busy_timeout=...): expected seconds >= 0.")
        if not isinstance(lease_ttl, (int, float)) or lease_ttl <= 0:
            raise ValueError("SqlPersistence(lease_ttl=...): expected seconds > 0.")
        if lease_renew is None:
            lease_renew = lease_ttl / 3.0
        if not isinstance(lease_renew, (int, float)) or not 0 < lease_renew < lease_ttl:
            raise ValueError("SqlPersistence(lease_renew=...): expected seconds > 0 and below lease_ttl.")
        if schema is not None:
            if backend != "postgresql":
                raise ValueError("SqlPersistence(schema=...) is for PostgreSQL databases.")
            if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema):
                raise ValueError(f"SqlPersistence(schema=...): {schema!r} is not a plain SQL identifier.")

        self.dialect = backend
        self.schema: Optional[str] = schema
        self.synchronous = sync
        self.busy_timeout = float(busy_timeout)
        self.lease_ttl = float(lease_ttl)
        self.lease_renew = float(lease_renew)
        self._engine_options = dict(engine_options or {})
        if backend == "sqlite":
            if (url.database or ":memory:") == ":memory:" and user_engine is None and sync_user_engine is None:
                # an in-memory database, shared by name with sync_engine() (same process only)
                url = url.set(database=f"file:we0nb-{os.getpid()}-{id(self):x}-{os.urandom(4).hex()}",
                              query={"mode": "memory", "cache": "shared", "uri": "true"})
                if not inline_sqlite:
                    raise ValueError("SqlPersistence: an in-memory SQLite database needs inline_sqlite=True.")
            self._sync_url = url.set(drivername="sqlite")
            self._async_url = url.set(drivername="sqlite+aiosqlite")
        else:
            self._sync_url = url.set(drivername="postgresql+psycopg")
            self._async_url = url.set(drivername="postgresql+psycopg")
        self._where = repr(self._sync_url.render_as_string(hide_password=True))
        self._sync_engine: Optional[Engine] = sync_user_engine
        self._sync_engine_ready = False
        self._sync_lock = threading.Lock()
        self._installed: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._heartbeats: dict[tuple[str, str], asyncio.Task] = {}
        self._host = socket.gethostname()[:128]

        self._inline: Optional[_Inline] = None
        self._async: Optional[_Async] = None
        if backend == "sqlite" and inline_sqlite and user_engine is None:
            database, uri = self._sqlite_target(url)
            self._inline = _Inline(database, uri, sync, int(self.busy_timeout * 1000), self._where)
        else:
            self._async = _Async(self, user_engine)

    # ------------------------------------------------------------------ public helpers

    def __repr__(self) -> str:
        extra = f", schema={self.schema!r}" if self.schema else ""
        return f"SqlPersistence({self._sync_url.render_as_string(hide_password=True)!r}{extra})"

    @property
    def url(self) -> str:
        """The database as a synchronous SQLAlchemy URL (``sqlite:///…``, ``postgresql+psycopg://…``)."""
        return self._sync_url.render_as_string(hide_password=False)

    def sync_engine(self) -> Engine:
        """A cached synchronous ``Engine`` on the same database and schema, tables created."""
        with self._sync_lock:
            eng = self._sync_engine
            if eng is None:
                if self._sync_url.query.get("mode") == "memory":
                    from sqlalchemy.pool import SingletonThreadPool

                    eng = create_engine(self._sync_url, poolclass=SingletonThreadPool)
                else:
                    eng = create_engine(self._sync_url)
                self._install_events(eng)
                self._sync_engine = eng
            elif eng not in self._installed:
                self._install_events(eng)
            if not self._sync_engine_ready:
                try:
                    with eng.begin() as conn:
                        _ensure_schema_sync(conn, self._where, self.schema)
                except PersistenceError:
                    raise
                except Exception:
                    with eng.begin() as conn:  # lost a creation race with another process: look again
                        _ensure_schema_sync(conn, self._where, self.schema)
                self._sync_engine_ready = True
            return eng

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _sqlite_target(url: URL) -> tuple[str, bool]:
        database = url.database or ":memory:"
        query = dict(url.query)
        if str(query.pop("uri", "false")).lower() in ("true", "1"):
            for k in ("timeout", "check_same_thread", "isolation_level", "detect_types", "cached_statements"):
                query.pop(k, None)
            q = urlencode({k: (v[-1] if isinstance(v, tuple) else v) for k, v in query.items()})
            target = database if database.startswith("file:") else f"file:{database}"
            return (f"{target}?{q}" if q else target), True
        return database, False

    def _install_events(self, sync_engine: Engine) -> None:
        if sync_engine in self._installed:
            return
        self._installed.add(sync_engine)
        if self.dialect == "sqlite":
            synchronous, busy_ms = self.synchronous, int(self.busy_timeout * 1000)

            @event.listens_for(sync_engine, "connect")
            def _on_connect(dbapi_conn: Any, record: Any) -> None:
                _sqlite_pragmas(dbapi_conn, synchronous, busy_ms)

        else:
            settings = []
            if self.schema is not None:
                settings.append(f'SET search_path TO "{self.schema}"')
            if self.synchronous in ("OFF", "NORMAL"):
                # like SQLite's NORMAL: a killed client loses nothing (the server has the commit);
                # a server crash or power loss may lose the last fraction of a second of commits
                settings.append("SET synchronous_commit TO off")
            else:
                settings.append("SET synchronous_commit TO on")  # FULL: every commit is flushed to disk
            if settings:
                @event.listens_for(sync_engine, "connect")
                def _on_connect_pg(dbapi_conn: Any, record: Any) -> None:
                    cur = dbapi_conn.cursor()
                    for stmt in settings:
                        cur.execute(stmt)
                    cur.close()
                    dbapi_conn.commit()

    async def _exec(self, key: str, params: dict[str, Any]) -> int:
        if self._inline is not None:
            return self._inline.execute(key, params)
        assert self._async is not None
        return await self._async.execute(key, params)

    async def _tx(self, ops: Sequence[tuple[str, Any]]) -> None:
        if self._inline is not None:
            self._inline.transaction(ops)
        else:
            assert self._async is not None
            await self._async.transaction(ops)

    async def _fetch(self, key: str, params: dict[str, Any]) -> list[Any]:
        if self._inline is not None:
            return self._inline.fetchall(key, params)
        assert self._async is not None
        return await self._async.fetchall(key, params)

    # ------------------------------------------------------------------ sessions

    def _session(self, sid: str, data: str) -> Session:
        try:
            s = _SESSION_ADAPTER.validate_json(data)
        except ValidationError as e:
            raise CorruptRecordError(
                f"Corrupt session record {sid!r} in {self._where}: its JSON does not parse or validate "
                f"({e.error_count()} error(s): {e.errors()[0]['msg']}). Fix or delete the row in we0_sessions."
            ) from e
        if s.id != sid:
            raise CorruptRecordError(
                f"Corrupt session record {sid!r} in {self._where}: its JSON says id {s.id!r}."
            )
        return s

    async def get_session(self, session_id: str) -> Optional[Session]:
        rows = await self._fetch("get_session", {"sid": session_id})
        return self._session(rows[0][0], rows[0][1]) if rows else None

    async def upsert_session(self, session: Session) -> None:
        await self._exec("upsert_session", _session_row(session))

    async def list_sessions(self) -> list[Session]:
        return [self._session(sid, data) for sid, data in await self._fetch("list_sessions", {})]

    # ------------------------------------------------------------------ messages and parts

    async def upsert_message(self, message: MessageInfo) -> None:
        await self._exec("upsert_message", _message_row(message))

    async def upsert_part(self, part: Part) -> None:
        await self._exec("upsert_part", _part_row(part))

    async def commit(self, writes: Sequence[Batch], *, lease: Optional[Lease] = None) -> None:
        if lease is not None:
            await self.check_lease(lease)
        ops: list[tuple[str, Any]] = []
        for m, ps, v in writes:
            if ps:
                ops.append(("upsert_part", [_part_row(p) for p in ps]))
            if m is not None:
                # after the parts: writing a part drops its message's view (a trigger)
                ops.append(("upsert_message", [_message_row(m, v)]))
        if ops:
            await self._tx(ops)

    async def load_transcript(self, session_id: str) -> Transcript:
        params = {"sid": session_id}
        inline = self._inline
        if inline is not None:
            # one synchronous section: fetch and build with the cyclic GC paused (see _build)
            paused = gc.isenabled()
            if paused:
                gc.disable()
            try:
                srows = inline.fetchall("get_session", params)
                if not srows:
                    return Transcript(session=None, messages=[])
                session = self._session(srows[0][0], srows[0][1])
                mrows = inline.fetchall("load_messages", params)
                prows = inline.fetchall("load_parts", params)
                return Transcript.model_construct(session=session,
                                                  messages=self._build_fast(session_id, mrows, prows))
            finally:
                if paused:
                    gc.enable()
        srows = await self._fetch("get_session", params)
        if not srows:
            return Transcript(session=None, messages=[])
        session = self._session(srows[0][0], srows[0][1])
        mrows = await self._fetch("load_messages", params)
        prows = await self._fetch("load_parts", params)
        return Transcript.model_construct(session=session, messages=self._build(session_id, mrows, prows))

    async def load_recent(self, session_id: str) -> RecentHistory:
        """The older messages' stored model views and the recent messages as objects.

        Reads one light row per message (id, role, summary flag, view) and full rows only
        for the recent messages (:func:`~we0nb.persistence.base.recent_start`), so a cold start
        costs the views' decoding, not validating the whole transcript.
        """
        params = {"sid": session_id}
        srows = await self._fetch("get_session", params)
        if not srows:
            return RecentHistory(session=None, earlier=[], messages=[])
        session = self._session(srows[0][0], srows[0][1])
        index = await self._fetch("recent_index", params)
        s, k = recent_start([r[1] for r in index], [bool(r[2]) for r in index], [r[3] is not None for r in index])
        earlier: list[Any] = []
        if k:
            try:
                earlier = load_views([r[3] for r in index[s:k]])
            except ValueError as e:  # a damaged view: rebuild from the objects instead
                log.warning("ignoring the stored model views of session %r in %s: %s", session_id, self._where, e)
                earlier, k = [], 0
        if k == len(index):
            return RecentHistory(session=session, earlier=earlier, messages=[])
        params["mid"] = index[k][0]
        mrows = await self._fetch("load_messages_from", params)
        prows = await self._fetch("load_parts_from", params)
        return RecentHistory(session=session, earlier=earlier, messages=self._build(session_id, mrows, prows))

    def _build(self, sid: str, mrows: list[Any], prows: list[Any]) -> list[MessageWithParts]:
        # thousands of objects that all survive: the cyclic GC would rescan them again and
        # again while they are created (about half the load time), and they hold no cycles
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._build_fast(sid, mrows, prows)
        finally:
            if paused:
                gc.enable()

    def _build_fast(self, sid: str, mrows: list[Any], prows: list[Any]) -> list[MessageWithParts]:
        by_msg: dict[str, list[Any]] = {}
        for row in prows:
            lst = by_msg.get(row[1])
            if lst is None:
                by_msg[row[1]] = [row]
            else:
                lst.append(row)
        # one JSON document and one validation call per message: the fast path for a healthy
        # transcript (several times faster than one call over one huge document)
        validate = _MWP_VALIDATE
        out = []
        empty: list[Any] = []
        for mid, data in mrows:
            plist = by_msg.get(mid) or empty
            try:
                m = validate('{"info":' + data + ',"parts":[' + ",".join([r[2] for r in plist]) + "]}")
            except ValidationError:
                m = None
            if m is None or m.info.id != mid or m.info.session_id != sid or len(m.parts) != len(plist) or any(
                    p.id != r[0] or p.session_id != sid or p.message_id != mid for p, r in zip(m.parts, plist)):
                # a row does not parse, validate or match its columns: find and name it
                m = self._build_slow(sid, [(mid, data)], by_msg)[0]
            out.append(m)
        return out

    def _build_slow(self, sid: str, mrows: list[Any], by_msg: dict[str, list[Any]]) -> list[MessageWithParts]:
        """Row by row, to name the bad record."""
        out = []
        for mid, data in mrows:
            try:
                info = _MESSAGE_ADAPTER.validate_json(data)
            except ValidationError as e:
                raise CorruptRecordError(self._corrupt(sid, mid, None, e)) from e
            if info.id != mid or info.session_id != sid:
                raise CorruptRecordError(self._corrupt(sid, mid, None, None, f"its JSON says message {info.id!r} "
                                                                             f"of session {info.session_id!r}"))
            parts = []
            for pid, _, pdata in by_msg.get(mid) or ():
                try:
                    part = _PART_ADAPTER.validate_json(pdata)
                except ValidationError as e:
                    raise CorruptRecordError(self._corrupt(sid, mid, pid, e)) from e
                if part.id != pid or part.message_id != mid or part.session_id != sid:
                    raise CorruptRecordError(self._corrupt(sid, mid, pid, None, f"its JSON says part {part.id!r} of "
                                                                                f"message {part.message_id!r}"))
                parts.append(part)
            out.append(MessageWithParts.model_construct(info=info, parts=parts))
        return out

    def _corrupt(self, sid: str, mid: str, pid: Optional[str], e: Optional[ValidationError],
                 detail: Optional[str] = None) -> str:
        what = f"part {pid!r} of message {mid!r}" if pid else f"message {mid!r}"
        table = "we0_parts" if pid else "we0_messages"
        if detail is None and e is not None:
            first = e.errors()[0]
            loc = ".".join(str(x) for x in first.get("loc", ())) or "(document)"
            detail = f"its JSON does not parse or validate: {first['msg']} at {loc}"
        return (f"Corrupt record in session {sid!r}: {what} in {self._where} — {detail}. "
                f"Other sessions still load; fix or delete the row (id {pid or mid!r}) in {table}.")

    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        ids = list(message_ids)
        if not ids:
            return
        rows = [{"sid": session_id, "mid": m} for m in ids]
        await self._tx([("delete_parts", rows), ("delete_message", rows)])

    # ------------------------------------------------------------------ the session lease

    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        owner = lease_owner(run_id)[:256]  # the column widths (PostgreSQL enforces them)
        host, pid = self._host, os.getpid()
        for _ in range(5):
            expires = time.time() + self.lease_ttl
            new = {"sid": session_id, "owner": owner, "host": host, "pid": pid, "run_id": run_id,
                   "expires": expires}
            if await self._exec("lease_insert", new) == 1:
                break
            rows = await self._fetch("lease_get", {"sid": session_id})
            if not rows:
                continue  # released in between: try the insert again
            old_owner, old_host, old_pid, old_expires = rows[0]
            if old_host != host:
                dead = False  # another machine: only the TTL can tell
            elif old_pid == pid:
                # this PID: a live run of this process, or a crashed process whose PID we reuse
                # (common in containers after a restart)
                dead = old_owner not in _LIVE_OWNERS
            else:
                dead = not _pid_alive(int(old_pid))
            if not dead and old_expires >= time.time():
                raise SessionBusyError(session_id, old_owner)
            why = "its process is gone" if dead else "it expired"
            if await self._exec("lease_take", dict(new, old_owner=old_owner, old_expires=old_expires)) == 1:
                log.info("took over the lease of session %r from %s (%s)", session_id, old_owner, why)
                break
            # someone else changed the row first: look again
        else:
            raise SessionBusyError(session_id, None)
        lease = Lease(session_id=session_id, run_id=run_id, owner=owner, persistence=self)
        _LIVE_OWNERS.add(owner)
        self._heartbeats[(session_id, owner)] = asyncio.ensure_future(self._heartbeat(session_id, owner))
        return lease

    async def _heartbeat(self, session_id: str, owner: str) -> None:
        """Renew the lease every ``lease_renew`` seconds until release_lease cancels this task."""
        while True:
            await asyncio.sleep(self.lease_renew)
            try:
                n = await self._exec("lease_renew", {"sid": session_id, "owner": owner,
                                                     "expires": time.time() + self.lease_ttl})
            except Exception as e:  # a busy database: try again at the next tick
                log.warning("could not renew the lease of session %r: %s", session_id, e)
                continue
            if n == 0:
                log.warning("the lease of session %r (%s) was taken over by another run", session_id, owner)
                return

    async def release_lease(self, lease: Lease) -> None:
        _LIVE_OWNERS.discard(lease.owner)
        task = self._heartbeats.pop((lease.session_id, lease.owner), None)
        if task is not None and not task.done():
            try:
                task.cancel()
            except RuntimeError:  # its event loop is closed: the task is gone with it
                pass
        await self._exec("lease_release", {"sid": lease.session_id, "owner": lease.owner})

    # ------------------------------------------------------------------ lifecycle

    async def flush(self) -> None:
        """Nothing to do: every write is its own committed transaction."""

    async def close(self) -> None:
        """Close connections (they reopen on the next use)."""
        if self._inline is not None:
            self._inline.close()
        if self._async is not None:
            await self._async.close()
        with self._sync_lock:
            if self._sync_engine is not None:
                self._sync_engine.dispose()

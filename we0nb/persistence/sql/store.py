"""SqlPersistence: the persistence port on SQL — SQLite by default, PostgreSQL for many kernels.

Every write is its own committed transaction, so the loop's writes *are* the durability
points; :meth:`SqlPersistence.commit` writes several together, and with a lease only while
the run still holds it. :meth:`SqlPersistence.flush` has nothing left to do.

The package, one concern per module:

* ``tables.py`` — the tables (SQLAlchemy Core) and the flattened columns, shared with the frames;
* ``schema.py`` — the one create/upgrade routine (versions, DDL, triggers);
* ``statements.py`` — every statement, compiled from the tables for each dialect, and the rows;
* ``inline.py`` — SQLite on one ``sqlite3`` connection on the calling thread (the default);
* ``pg.py`` — PostgreSQL on psycopg 3's own async connections (the default for a PostgreSQL URL);
* ``pg_group.py`` — PostgreSQL's group commit: what many runs send at once, in one round trip;
* ``sqlite_group.py`` — SQLite's group commit: what many runs commit in one pass of the loop, in one transaction;
* ``sqlite_writer.py`` — SQLite's writer process for many runs at once (``sqlite_writer_process.py``, the
  process; ``sqlite_tx.py``, the transactions both it and ``inline.py`` run; ``sqlite_frames.py``, the
  frames on the pipes between them);
* ``engine.py`` — SQLAlchemy asyncio engines (an engine passed in, aiosqlite, PostgreSQL with other
  ``engine_options``);
* ``loops.py`` — a loop's connections closed on that loop when it shuts down;
* ``lease.py`` — the session lease: acquire, take over, heartbeat, release;
* ``records.py`` — rows back into objects, naming corrupt records;
* ``errors.py`` — driver errors as :class:`~we0nb.PersistenceError`;
* ``store.py`` — this class, mapping the port onto them.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (``"FULL"`` on request); a write that
finds the database locked waits with an async back-off (never on the loop) up to
``busy_timeout``. On PostgreSQL, ``synchronous="NORMAL"`` sets ``synchronous_commit=off``
for our connections — the same promise as SQLite's NORMAL: a killed client loses nothing,
a server crash may lose the last fraction of a second of commits, nothing is ever
corrupted — and ``"FULL"`` sets it ``on``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import logging
import re
import socket
import threading
import weakref
from typing import Any, Awaitable, Optional, Sequence, TypeVar, Union
from urllib.parse import urlencode

from sqlalchemy.engine import URL, Engine, create_engine, make_url

from ..._extras import require
from ...errors import CorruptRecordError, PersistenceError
from ...messages import Part, Session, Transcript
from ...models.view import load_views
from ..base import Batch, Lease, MessageInfo, Persistence, RecentHistory, recent_start
from ..batches import BatchInfo, BatchItem, ItemEnd, NewItem
from . import batches as _batches
from . import lease as leases
from .engine import AsyncEngines, ensure_schema_on, install_events
from .errors import driver_errors, wrap
from .inline import InlineSqlite, Op
from .pg import NATIVE_OPTIONS, PgConnections
from .records import build_messages, gc_paused, session_from_row
from .sqlite_group import SqliteGroup
from .statements import message_row, part_row, session_row

__all__ = ["SqlPersistence"]

A = TypeVar("A")
B = TypeVar("B")

log = logging.getLogger("we0nb.persistence.sql")

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


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
    False goes through aiosqlite), ``writer_process`` (opt-in, a SQLite file on a machine with a
    second core: while several runs of one event loop write at once, as in a batch, a second
    process runs their writes; off by default, as W7 measured no clear gain on 2 shared cores),
    ``engine_options`` (passed to ``create_async_engine``; on
    PostgreSQL, ``pool_size``, ``max_overflow`` and ``connect_args`` alone keep the default
    path, psycopg's own async connections, with at most ``pool_size + max_overflow`` of them).
    """

    keeps_views = True
    commit_waits = True

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
        writer_process: bool = False,
        engine_options: Optional[dict[str, Any]] = None,
    ):
        url, user_engine, sync_user_engine = _target(url_or_engine)
        backend = _backend(url)
        self.dialect = backend
        self.schema: Optional[str] = schema
        self.synchronous = _check_options(backend, synchronous, busy_timeout, lease_ttl, lease_renew, schema)
        self.busy_timeout = float(busy_timeout)
        self.lease_ttl = float(lease_ttl)
        self.lease_renew = float(lease_renew if lease_renew is not None else lease_ttl / 3.0)
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
            if user_engine is None and sync_user_engine is None:  # the driver is an extra: one clear line
                require("psycopg", "SqlPersistence with a PostgreSQL URL", "postgres")
            self._sync_url = url.set(drivername="postgresql+psycopg")
            self._async_url = url.set(drivername="postgresql+psycopg")
        self._where = repr(self._sync_url.render_as_string(hide_password=True))
        self._sync_engine: Optional[Engine] = sync_user_engine
        self._sync_engine_ready = False
        self._sync_lock = threading.Lock()
        self._installed: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._heartbeats: dict[Any, Any] = {}  # event loop → lease.py's heartbeat of its leases
        self._host = socket.gethostname()[:128]
        self._inline: Optional[InlineSqlite] = None
        self._group: Optional[SqliteGroup] = None
        if backend == "sqlite" and inline_sqlite and user_engine is None:
            database, uri = _sqlite_target(url)
            self._inline = InlineSqlite(database, uri, self.synchronous, self.busy_timeout, self._where,
                                        writer_process=bool(writer_process))
            self._group = SqliteGroup(self._inline)
            self._db: Any = self._inline
        elif backend == "postgresql" and user_engine is None and set(self._engine_options) <= NATIVE_OPTIONS:
            self._db = PgConnections(self)
        else:
            self._db = AsyncEngines(self, user_engine)

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
                self._sync_engine = eng
            self._install_events(eng)
            if not self._sync_engine_ready:
                for attempt in (1, 2):
                    try:
                        with eng.begin() as conn:
                            ensure_schema_on(conn, self._where, self.schema)
                        break
                    except driver_errors() as e:  # lost a creation race with another process: look again
                        if attempt == 2:
                            raise wrap(e, self._where) from e
                self._sync_engine_ready = True
            return eng

    # ------------------------------------------------------------------ sessions

    async def get_session(self, session_id: str) -> Optional[Session]:
        rows = await self._db.fetchall("get_session", {"sid": session_id})
        return session_from_row(rows[0][0], rows[0][1], self._where) if rows else None

    async def upsert_session(self, session: Session) -> None:
        await self._db.execute("upsert_session", session_row(session))

    async def list_sessions(self) -> list[Session]:
        """Every session, by id; a corrupt session row is skipped with a warning naming it."""
        out = []
        for sid, data in await self._db.fetchall("list_sessions", {}):
            try:
                out.append(session_from_row(sid, data, self._where))
            except CorruptRecordError as e:
                log.warning("list_sessions skips session %r: %s", sid, e)
        return out

    # ------------------------------------------------------------------ messages and parts

    async def upsert_message(self, message: MessageInfo) -> None:
        await self._db.execute("upsert_message", message_row(message))

    async def upsert_part(self, part: Part) -> None:
        await self._db.execute("upsert_part", part_row(part))

    async def commit(self, writes: Sequence[Batch], *, lease: Optional[Lease] = None,
                     session: Optional[Session] = None) -> None:
        """One transaction; with ``lease``, its renewal first — no row changed means another run
        holds the session: nothing is written and :class:`~we0nb.LeaseLostError` is raised."""
        ops: list[Op] = [("upsert_session", [session_row(session)])] if session is not None else []
        for message, parts, view in writes:
            if parts:
                ops.append(("upsert_part", [part_row(p) for p in parts]))
            if message is not None:
                # after the parts: writing a part drops its message's view (a trigger)
                ops.append(("upsert_message", [message_row(message, view)]))
        guard = None
        if lease is not None:
            lease.check()
            guard = leases.renewal(self, lease)
        elif not ops:
            return
        if self._group is not None and lease is not None and leases.held_here(self) > 1:
            # other runs write now too: together, in the writer process once it runs, else here
            if self._group.db.writer() is not None:
                written = await self._group.db.commit(ops, guard)
            else:
                self._group.db.want_writer()
                written = await self._group.commit(ops, guard)
        else:
            written = await self._db.commit(ops, guard)
        if not written:
            assert lease is not None
            raise lease.mark_lost(await leases.holder(self, lease.session_id))

    async def check_lease(self, lease: Lease) -> None:
        await leases.check(self, lease)

    async def load_transcript(self, session_id: str) -> Transcript:
        params = {"sid": session_id}
        queries = [("get_session", params), ("load_messages", params), ("load_parts", params)]
        if self._inline is not None:
            with gc_paused():  # one synchronous section: fetch and build (see records.gc_paused)
                rows = self._inline.fetch_now(queries)
                if rows is not None:  # (None: the database is locked; wait on the async path)
                    return self._transcript(session_id, *rows)
        return self._transcript(session_id, *[await self._db.fetchall(k, p) for k, p in queries])

    def _transcript(self, session_id: str, srows: list[Any], mrows: list[Any], prows: list[Any]) -> Transcript:
        if not srows:
            return Transcript(session=None, messages=[])
        session = session_from_row(srows[0][0], srows[0][1], self._where)
        return Transcript.model_construct(session=session,
                                          messages=build_messages(session_id, mrows, prows, self._where))

    async def load_recent(self, session_id: str) -> RecentHistory:
        """The older messages' stored model views and the recent messages as objects.

        Reads one light row per message (id, role, summary flag, view) and full rows only
        for the recent messages (:func:`~we0nb.persistence.base.recent_start`), so a cold start
        costs the views' decoding, not validating the whole transcript.
        """
        params = {"sid": session_id}
        srows, index = await self._fetch_both(("get_session", params), ("recent_index", params))
        if not srows:
            return RecentHistory(session=None, earlier=[], messages=[])
        session = session_from_row(srows[0][0], srows[0][1], self._where)
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
        mrows, prows = await self._fetch_both(("load_messages_from", params), ("load_parts_from", params))
        return RecentHistory(session=session, earlier=earlier,
                             messages=build_messages(session_id, mrows, prows, self._where))

    async def _fetch_both(self, a: Op, b: Op) -> tuple[list[Any], list[Any]]:
        return await self._both(self._db.fetchall(*a), self._db.fetchall(*b))

    async def _both(self, first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
        """Two statements, ``first`` then ``second``, where the second does not need the first's
        answer: on PostgreSQL at once (they go to the server together, in this order: one round
        trip), elsewhere one after the other."""
        if isinstance(self._db, PgConnections):
            await self._db.pool()  # (ready first: each statement is then queued as its task starts, in order)
            a, b = await asyncio.gather(first, second)
            return a, b
        try:
            a = await first
        except BaseException:
            if inspect.iscoroutine(second):
                second.close()  # (never started)
            raise
        return a, await second

    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        rows = [{"sid": session_id, "mid": m} for m in message_ids]
        if rows:
            await self._db.transaction([("delete_parts", rows), ("delete_message", rows)])

    # ------------------------------------------------------------------ the session lease

    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        return await leases.acquire(self, session_id, run_id)

    async def lease_and_session(self, session_id: str, run_id: str) -> tuple[Lease, Optional[Session]]:
        """The lease and the session's row sent together (on PostgreSQL one round trip)."""
        lease, rows = await leases.acquire_and_read(self, session_id, run_id, ("get_session", {"sid": session_id}))
        try:
            return lease, session_from_row(rows[0][0], rows[0][1], self._where) if rows else None
        except BaseException:  # (a damaged row: the run never starts, its session is given back)
            await lease.release()
            raise

    async def release_lease(self, lease: Lease) -> None:
        await leases.release(self, lease)
        # (a writer still starting counts: it would be left running with no lease to stop it)
        if self._inline is not None and self._inline.wanted and not leases.held_here(self):
            await self._inline.stop_writer()  # the loop's last run ended: so does its writer process

    # ------------------------------------------------------------------ batches (sql/batches.py)

    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        return await _batches.open_batch(self, name, items, session_ids_given, now)

    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float,
                                expires: float) -> list[BatchItem]:
        return await _batches.claim(self, name, owner, n, now, expires)

    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> int:
        return await _batches.renew(self, name, owner, expires)

    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        return await _batches.end(self, name, item, owner, end)

    async def end_and_claim(self, name: str, item: int, owner: str, end: ItemEnd, *, claim: int, now: float,
                            expires: float) -> tuple[bool, list[BatchItem]]:
        if not claim:
            return await self.end_batch_item(name, item, owner, end), []
        return await _batches.end_and_claim(self, name, item, owner, end, claim, now, expires)

    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        return await _batches.requeue(self, name, items)

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        return await _batches.free_dead(self, name, live)

    async def batch_items(self, name: str) -> list[BatchItem]:
        return await _batches.items(self, name)

    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        return await _batches.infos(self, name)

    # ------------------------------------------------------------------ lifecycle

    async def flush(self) -> None:
        """Nothing to do: every write is its own committed transaction."""

    async def close(self) -> None:
        """Close connections (they reopen on the next use); nothing waits on the event loop."""
        await self._db.close()
        with self._sync_lock:
            if self._sync_engine is not None:
                self._sync_engine.dispose()

    # ------------------------------------------------------------------ internals

    def _install_events(self, sync_engine: Engine) -> None:
        if sync_engine not in self._installed:
            self._installed.add(sync_engine)
            install_events(sync_engine, self.dialect, self.synchronous, int(self.busy_timeout * 1000), self.schema)


# --------------------------------------------------------------------------- arguments


def _target(url_or_engine: Any) -> tuple[URL, Any, Optional[Engine]]:
    """``(url, async engine passed in or None, sync engine passed in or None)``."""
    if isinstance(url_or_engine, (str, URL)):
        try:
            return make_url(url_or_engine), None, None
        except Exception as e:
            raise ValueError(f"SqlPersistence: {url_or_engine!r} is not a database URL ({e}).") from None
    if isinstance(url_or_engine, Engine):
        return url_or_engine.url, None, url_or_engine
    if hasattr(url_or_engine, "sync_engine") and hasattr(url_or_engine, "begin"):
        return url_or_engine.url, url_or_engine, None
    raise TypeError(
        "SqlPersistence(url_or_engine): expected a URL such as 'sqlite:///we0.db' or "
        f"'postgresql://user@host/db', or a SQLAlchemy AsyncEngine; got {type(url_or_engine).__name__}."
    )


def _backend(url: URL) -> str:
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


def _sqlite_target(url: URL) -> tuple[str, bool]:
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

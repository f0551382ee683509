"""SqlPersistence: the persistence port on SQL — SQLite by default, PostgreSQL for many kernels.

Every write is its own committed transaction, so the loop's writes *are* the durability
points; :meth:`SqlPersistence.commit` writes several together, and with a lease only while
the run still holds it. :meth:`SqlPersistence.flush` has nothing left to do.

The package, one concern per module:

* ``tables.py`` — the tables (SQLAlchemy Core) and the flattened columns, shared with the frames;
* ``schema.py`` — the one create/upgrade routine (versions, DDL, triggers);
* ``statements.py`` — every statement as a named constant, compiled from the tables for each dialect, and the rows;
* ``database.py`` — the database and its options, connection settings, the synchronous engine;
* ``driver.py`` — the one interface to a database (:class:`~.driver.Driver`) and the guard rule; its drivers:
* ``inline.py`` — SQLite on one ``sqlite3`` connection on the calling thread (the default), with
  ``sqlite_group.py``, its group commit: what many runs commit in one pass of the loop, in one transaction;
* ``pg.py`` — PostgreSQL on psycopg 3's own async connections (the default for a PostgreSQL URL), with
  ``pg_group.py``, its group commit: what many runs send at once, in one round trip;
* ``engine.py`` — SQLAlchemy asyncio engines (an engine passed in, aiosqlite, PostgreSQL with other
  ``engine_options``);
* ``loops.py`` — a loop's connections closed on that loop when it shuts down;
* ``lease.py`` — the session lease: acquire, take over, heartbeat, release;
* ``batches.py`` — the batch queue;
* ``records.py`` — rows back into objects, naming corrupt records;
* ``errors.py`` — driver errors as :class:`~we0nb.PersistenceError`;
* ``columns.py``, ``sources.py`` — the frames' column reads;
* ``copies.py``, ``copy_sql.py`` — a session's rows copied under new ids in the database (a fork);
* ``store.py`` — this class, mapping the port's capabilities onto them.

SQLite runs in WAL mode with ``synchronous=NORMAL`` (``"FULL"`` on request); a write that
finds the database locked waits with an async back-off (never on the loop) up to
``busy_timeout``. On PostgreSQL, ``synchronous="NORMAL"`` sets ``synchronous_commit=off``
for our connections — the same promise as SQLite's NORMAL: a killed client loses nothing,
a server crash may lose the last fraction of a second of commits, nothing is ever
corrupted — and ``"FULL"`` sets it ``on``.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Optional, Sequence, Union

from sqlalchemy.engine import URL, Engine

from ...errors import CorruptRecordError
from ...messages import MessageWithParts, Session, Transcript, assembled
from ...models.base import ModelMessage
from ...models.view import load_views
from ..base import Lease, Persistence, RecentHistory, Write, recent_start
from ..batches import BatchInfo, BatchItem, BatchQueue, ItemCost, ItemEnd, NewItem
from ..columns import ColumnReader, ColumnReads
from ..copies import CopyStore, Rename, SessionIndex
from . import statements as q
from .batches import SqlBatchQueue
from .copies import SqlCopies
from .database import database_for, sqlite_target
from .driver import Driver, Op
from .engine import AsyncEngines
from .inline import InlineSqlite
from .lease import SqlLeases
from .pg import NATIVE_OPTIONS, PgConnections
from .records import build_messages, gc_paused, session_from_row
from ..scores import ScoreRecord, ScoreStore
from .scores import SqlScores
from .statements import message_row, part_row, session_row

__all__ = ["SqlPersistence"]

log = logging.getLogger("we0nb.persistence.sql")


class SqlPersistence(Persistence, BatchQueue, ColumnReads, ScoreStore, CopyStore):
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
    False goes through aiosqlite), ``engine_options`` (passed to ``create_async_engine``; on
    PostgreSQL, ``pool_size``, ``max_overflow`` and ``connect_args`` alone keep the default
    path, psycopg's own async connections, with at most ``pool_size + max_overflow`` of them).
    ``writer_process`` is accepted and ignored (deprecated: SQLite's opt-in writer process was
    removed, as it measured no gain).
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
        writer_process: Optional[bool] = None,
        engine_options: Optional[dict[str, Any]] = None,
    ):
        if writer_process is not None:
            warnings.warn("SqlPersistence(writer_process=...) has no effect: SQLite's writer process was removed "
                          "(it measured no gain); drop the argument.", DeprecationWarning, stacklevel=2)
        db = database_for(url_or_engine, synchronous=synchronous, busy_timeout=busy_timeout, lease_ttl=lease_ttl,
                          lease_renew=lease_renew, schema=schema, inline_sqlite=inline_sqlite,
                          engine_options=engine_options, token=f"{id(self):x}")
        self._database = db
        self.dialect, self.schema, self.synchronous, self.busy_timeout = db.dialect, schema, db.synchronous, \
            db.busy_timeout
        self._where = db.where
        self._db: Driver
        if db.dialect == "sqlite" and inline_sqlite and db.async_engine is None:
            database, uri = sqlite_target(db.sync_url)
            self._db = InlineSqlite(database, uri, db.synchronous, db.busy_timeout, db.where)
        elif db.dialect == "postgresql" and db.async_engine is None and set(db.engine_options) <= NATIVE_OPTIONS:
            self._db = PgConnections(db)
        else:
            self._db = AsyncEngines(db)
        renew = float(lease_renew if lease_renew is not None else lease_ttl / 3.0)
        self._leases = SqlLeases(self, self._db, float(lease_ttl), renew)
        self._batches = SqlBatchQueue(self._db)
        self._scores = SqlScores(self._db)
        self._copies = SqlCopies(self._db, db.where)

    # ------------------------------------------------------------------ public helpers

    def __repr__(self) -> str:
        extra = f", schema={self.schema!r}" if self.schema else ""
        return f"SqlPersistence({self._database.sync_url.render_as_string(hide_password=True)!r}{extra})"

    @property
    def url(self) -> str:
        """The database as a synchronous SQLAlchemy URL (``sqlite:///…``, ``postgresql+psycopg://…``)."""
        return self._database.sync_url.render_as_string(hide_password=False)

    @property
    def lease_ttl(self) -> float:
        """Seconds a lease of a run that stopped renewing it blocks others."""
        return self._leases.ttl

    @lease_ttl.setter
    def lease_ttl(self, value: float) -> None:
        self._leases.ttl = float(value)

    @property
    def lease_renew(self) -> float:
        """Seconds between the renewals of the leases held."""
        return self._leases.renew_every

    @lease_renew.setter
    def lease_renew(self, value: float) -> None:
        self._leases.renew_every = float(value)

    def sync_engine(self) -> Engine:
        """A cached synchronous ``Engine`` on the same database and schema, tables created."""
        return self._database.sync_engine()

    def column_reader(self) -> ColumnReader:
        """The frames' bulk reads of this database (:class:`~.columns.SqlReader`, on :meth:`sync_engine`)."""
        from .columns import open_reader

        reader = open_reader(self)
        assert reader is not None  # (a store with a synchronous engine always has one)
        return reader

    # ------------------------------------------------------------------ sessions and transcripts

    async def get_session(self, session_id: str) -> Optional[Session]:
        rows = await self._db.fetchall(q.GET_SESSION, {"sid": session_id})
        return session_from_row(rows[0][0], rows[0][1], self._where) if rows else None

    async def upsert_session(self, session: Session) -> None:
        await self._db.execute(q.UPSERT_SESSION, session_row(session))

    async def list_sessions(self) -> list[Session]:
        """Every session, by id; a corrupt session row is skipped with a warning naming it."""
        out = []
        for sid, data in await self._db.fetchall(q.LIST_SESSIONS, {}):
            try:
                out.append(session_from_row(sid, data, self._where))
            except CorruptRecordError as e:
                log.warning("list_sessions skips session %r: %s", sid, e)
        return out

    async def commit(self, writes: Sequence[Write], *, lease: Optional[Lease] = None,
                     session: Optional[Session] = None) -> None:
        """One transaction; with ``lease``, its renewal first — no row changed means another run
        holds the session: nothing is written and :class:`~we0nb.LeaseLostError` is raised."""
        ops = _write_ops(writes, session)
        if lease is None:
            if ops:
                await self._db.commit(ops, None, crowded=False)
            return
        lease.check()
        # crowded: other runs of this loop write now too (SQLite then writes them together)
        if not await self._db.commit(ops, self._leases.guard(lease), crowded=self._leases.held_here() > 1):
            raise lease.mark_lost(await self._leases.holder(lease.session_id))

    async def load_transcript(self, session_id: str) -> Transcript:
        params = {"sid": session_id}
        queries = [(q.GET_SESSION, params), (q.LOAD_MESSAGES, params), (q.LOAD_PARTS, params)]
        with gc_paused():  # one synchronous section: fetch and build (see records.gc_paused)
            rows = self._db.read_now(queries)
            if rows is not None:  # (None: not this driver, or the database is locked: the async path)
                return self._transcript(session_id, *rows)
        return self._transcript(session_id, *[await self._db.fetchall(k, p) for k, p in queries])

    def _transcript(self, session_id: str, srows: list[Any], mrows: list[Any], prows: list[Any]) -> Transcript:
        if not srows:
            return Transcript(session=None, messages=[])
        session = session_from_row(srows[0][0], srows[0][1], self._where)
        return assembled(Transcript, session=session,
                         messages=build_messages(session_id, mrows, prows, self._where))

    async def load_recent(self, session_id: str) -> RecentHistory:
        """The older messages' stored model views and the recent messages as objects.

        Reads one light row per message (id, role, summary flag, view) and full rows only
        for the recent messages (:func:`~we0nb.persistence.base.recent_start`), so a cold start
        costs the views' decoding, not validating the whole transcript.
        """
        params = {"sid": session_id}
        srows, index = await self._db.run([(q.GET_SESSION, params, True), (q.RECENT_INDEX, params, True)])
        if not srows:
            return RecentHistory(session=None, earlier=[], messages=[])
        session = session_from_row(srows[0][0], srows[0][1], self._where)
        s, k = recent_start([r[1] for r in index], [bool(r[2]) for r in index], [r[3] is not None for r in index])
        earlier: list[ModelMessage] = []
        if k:
            try:
                earlier = load_views([r[3] for r in index[s:k]])
            except ValueError as e:  # a damaged view: rebuild from the objects instead
                log.warning("ignoring the stored model views of session %r in %s: %s", session_id, self._where, e)
                earlier, k = [], 0
        if k == len(index):
            return RecentHistory(session=session, earlier=earlier, messages=[])
        params["mid"] = index[k][0]
        mrows, prows = await self._db.run([(q.LOAD_MESSAGES_FROM, params, True), (q.LOAD_PARTS_FROM, params, True)])
        return RecentHistory(session=session, earlier=earlier,
                             messages=build_messages(session_id, mrows, prows, self._where))

    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        rows = [{"sid": session_id, "mid": m} for m in message_ids]
        if rows:
            await self._db.transaction([(q.DELETE_PARTS, rows), (q.DELETE_MESSAGE, rows)])

    async def flush(self) -> None:
        """Nothing to do: every write is its own committed transaction."""

    async def close(self) -> None:
        """Close connections (they reopen on the next use); nothing waits on the event loop."""
        await self._db.close()
        self._database.dispose()

    # ------------------------------------------------------------------ copies (we0nb.persistence.copies)

    async def session_index(self, session_id: str, upto: Optional[str] = None) -> Optional[SessionIndex]:
        return await self._copies.session_index(session_id, upto)

    async def load_messages(self, session_id: str, message_ids: Sequence[str]) -> list[MessageWithParts]:
        return await self._copies.load_messages(session_id, message_ids)

    async def copy_rows(self, source: str, target: str, messages: Sequence[Rename], parts: Sequence[Rename],
                        writes: Sequence[Write], *, session: Session, lease: Lease) -> None:
        """One transaction, after the lease's renewal (no row changed: another run holds ``target``,
        nothing is written and :class:`~we0nb.LeaseLostError` is raised)."""
        lease.check()
        ops = [*_write_ops((), session), *self._copies.copy_ops(source, target, messages, parts),
               *_write_ops(writes, None)]
        if not await self._db.transaction(ops, self._leases.guard(lease)):
            raise lease.mark_lost(await self._leases.holder(lease.session_id))

    # ------------------------------------------------------------------ the session lease (lease.py)

    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        return await self._leases.acquire(session_id, run_id)

    async def lease_and_session(self, session_id: str, run_id: str) -> tuple[Lease, Optional[Session]]:
        """The lease and the session's row sent together (on PostgreSQL one round trip)."""
        lease, rows = await self._leases.acquire_and_read(session_id, run_id, (q.GET_SESSION, {"sid": session_id}))
        try:
            return lease, session_from_row(rows[0][0], rows[0][1], self._where) if rows else None
        except BaseException:  # (a damaged row: the run never starts, its session is given back)
            await lease.release()
            raise

    async def release_lease(self, lease: Lease) -> None:
        await self._leases.release(lease)

    async def check_lease(self, lease: Lease) -> None:
        await self._leases.check(lease)

    # ------------------------------------------------------------------ the batch queue (batches.py)

    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        return await self._batches.open_batch(name, items, session_ids_given=session_ids_given, now=now)

    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float, expires: float,
                                token: Optional[str] = None) -> list[BatchItem]:
        return await self._batches.claim_batch_items(name, owner, n, now=now, expires=expires, token=token)

    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> list[int]:
        return await self._batches.renew_batch_claims(name, owner, expires)

    async def release_batch_claims(self, name: str, owner: str, items: Sequence[int]) -> int:
        return await self._batches.release_batch_claims(name, owner, items)

    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        return await self._batches.end_batch_item(name, item, owner, end)

    async def end_and_claim(self, name: str, item: int, owner: str, end: ItemEnd, *, claim: int, now: float,
                            expires: float, token: Optional[str] = None) -> tuple[bool, list[BatchItem]]:
        return await self._batches.end_and_claim(name, item, owner, end, claim=claim, now=now, expires=expires,
                                                 token=token)

    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        return await self._batches.requeue_batch_items(name, items)

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        return await self._batches.free_dead_claims(name, live)

    async def batch_items(self, name: str) -> list[BatchItem]:
        return await self._batches.batch_items(name)

    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        return await self._batches.list_batches(name)

    async def batch_costs(self, name: str) -> list[ItemCost]:
        return await self._batches.batch_costs(name)

    # ------------------------------------------------------------------ scores (we0nb.persistence.scores)

    async def write_scores(self, scores: Sequence[ScoreRecord]) -> None:
        await self._scores.write_scores(scores)

    async def read_scores(self, batch: str, scorer: Optional[str] = None) -> list[ScoreRecord]:
        return await self._scores.read_scores(batch, scorer)


def _write_ops(writes: Sequence[Write], session: Optional[Session]) -> list[Op]:
    """A commit's statements: the session's row, then each write's parts and message."""
    ops: list[Op] = [(q.UPSERT_SESSION, [session_row(session)])] if session is not None else []
    for message, parts, view in writes:
        if parts:
            _add(ops, q.UPSERT_PART, [part_row(p) for p in parts])
        if message is not None:
            # after the parts: writing a part drops its message's view (a trigger)
            _add(ops, q.UPSERT_MESSAGE, [message_row(message, view)])
    return ops


def _add(ops: list[Op], stmt: Any, rows: list[Any]) -> None:
    """Append ``rows`` of ``stmt`` to ``ops``: to the last op when it is the same statement (one
    ``executemany`` for a run of writes of one kind, e.g. a fork's messages; the order is kept)."""
    if ops and ops[-1][0] is stmt:
        ops[-1][1].extend(rows)
    else:
        ops.append((stmt, rows))

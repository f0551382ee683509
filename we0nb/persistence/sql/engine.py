"""The async engine path: SQLAlchemy 2 asyncio (PostgreSQL through psycopg 3, any
``AsyncEngine`` passed in, SQLite with ``inline_sqlite=False`` through aiosqlite).

Async pools are bound to the event loop that created their connections, so there is one
``AsyncEngine`` per running loop, created lazily (an engine you pass is re-pooled when the
loop changes); when ``asyncio.run()`` shuts a loop down, its pool is closed on that loop.
Single statements run in autocommit (one round trip); batches run in one transaction.
Statements are the precompiled text of :mod:`.statements`, run with ``exec_driver_sql``.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Optional, Sequence

from sqlalchemy import event

from .errors import driver_errors, wrap
from .inline import Op, sqlite_pragmas
from .loops import at_shutdown, running_loop
from .schema import ConnectionDb, ensure_schema
from .statements import statements

__all__ = ["AsyncEngines", "GuardFailed", "install_events", "ensure_schema_on"]


class GuardFailed(Exception):
    """The guard statement of a transaction changed no row: roll back, write nothing."""


def install_events(sync_engine: Any, dialect: str, synchronous: str, busy_ms: int, schema: Optional[str]) -> None:
    """Per-connection settings: SQLite's pragmas; PostgreSQL's search_path and synchronous_commit."""
    if dialect == "sqlite":
        @event.listens_for(sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, record: Any) -> None:
            sqlite_pragmas(dbapi_conn, synchronous, busy_ms)
        return
    settings = []
    if schema is not None:
        settings.append(f'SET search_path TO "{schema}"')
    # NORMAL is like SQLite's: a killed client loses nothing (the server has the commit); a
    # server crash or power loss may lose the last fraction of a second of commits. FULL: every
    # commit is flushed to disk.
    settings.append("SET synchronous_commit TO " + ("off" if synchronous in ("OFF", "NORMAL") else "on"))

    @event.listens_for(sync_engine, "connect")
    def _on_connect_pg(dbapi_conn: Any, record: Any) -> None:
        cur = dbapi_conn.cursor()
        for stmt in settings:
            cur.execute(stmt)
        cur.close()
        dbapi_conn.commit()


def ensure_schema_on(sync_conn: Any, where: str, pg_schema: Optional[str]) -> None:
    """:func:`~.schema.ensure_schema` on a SQLAlchemy connection (run it inside ``begin()``)."""
    ensure_schema(ConnectionDb(sync_conn, where, pg_schema))


class AsyncEngines:
    """An AsyncEngine per running event loop (async pools are bound to their loop)."""

    def __init__(self, owner: Any, engine: Any = None):
        self.owner = owner  # the SqlPersistence: URL, options, install_events
        self.where = owner._where
        self.user_engine = engine
        self.user_loop: Optional[weakref.ReferenceType] = None
        self.engines: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.ready = False
        self.guards: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.sql = statements(owner.dialect)
        self.autocommit: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ the async interface

    async def execute(self, key: str, params: dict[str, Any]) -> int:
        try:
            eng = await self._auto()
            async with eng.connect() as conn:  # autocommit: the statement commits by itself
                result = await conn.exec_driver_sql(self.sql[key], params)
                return result.rowcount
        except driver_errors() as e:
            raise wrap(e, self.where) from e

    async def fetchall(self, key: str, params: dict[str, Any]) -> list[Any]:
        try:
            eng = await self._auto()
            async with eng.connect() as conn:
                result = await conn.exec_driver_sql(self.sql[key], params)
                return list(result.all())
        except driver_errors() as e:
            raise wrap(e, self.where) from e

    async def transaction(self, ops: Sequence[Op], guard: Optional[Op] = None) -> bool:
        """``ops`` in one transaction; ``guard`` first, which must change one row (else False)."""
        try:
            eng = await self.engine()
            async with eng.begin() as conn:
                if guard is not None:
                    result = await conn.exec_driver_sql(self.sql[guard[0]], guard[1])
                    if result.rowcount != 1:
                        raise GuardFailed
                for key, params in ops:
                    if isinstance(params, list) and not params:
                        continue
                    await conn.exec_driver_sql(self.sql[key], params)
        except GuardFailed:
            return False
        except driver_errors() as e:
            raise wrap(e, self.where) from e
        return True

    commit = transaction  # a run's commit (PostgreSQL's own path groups them: pg_group.py)

    async def close(self) -> None:
        loop = running_loop()
        own = list(self.engines.items())
        self.engines = weakref.WeakKeyDictionary()
        for lp, eng in own:
            await eng.dispose(close=(lp is loop))
        if self.user_engine is not None:
            same = self.user_loop is not None and self.user_loop() is loop
            await self.user_engine.dispose(close=same)
            self.user_loop = None

    # ------------------------------------------------------------------ engines per loop

    async def _auto(self) -> Any:
        """The engine in autocommit mode: a single statement is one round trip, no BEGIN/COMMIT."""
        eng = await self.engine()
        auto = self.autocommit.get(eng.sync_engine)
        if auto is None:
            auto = eng.execution_options(isolation_level="AUTOCOMMIT")
            self.autocommit[eng.sync_engine] = auto
        return auto

    async def engine(self) -> Any:
        """This loop's engine, its schema ensured."""
        loop = asyncio.get_running_loop()
        if self.user_engine is not None:
            eng = self.user_engine
            if self.user_loop is None or self.user_loop() is not loop:
                if self.user_loop is not None:
                    # connections of the previous loop cannot be used (or closed) from this one
                    await eng.dispose(close=False)
                self.user_loop = weakref.ref(loop)
                self.owner._install_events(eng.sync_engine)
                await self._guard(loop, eng)
        else:
            eng = self.engines.get(loop)
            if eng is None:
                eng = await self._new_engine(loop)
        if not self.ready:
            await self._ensure(eng)
        return eng

    async def _new_engine(self, loop: asyncio.AbstractEventLoop) -> Any:
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
        return eng

    async def _guard(self, loop: asyncio.AbstractEventLoop, eng: Any) -> None:
        """Dispose of ``eng``'s pool on its loop when it shuts down (:func:`.loops.at_shutdown`),
        so no connection outlives the loop it belongs to."""
        async def cleanup() -> None:
            if self.engines.get(loop) is eng:
                del self.engines[loop]
            if self.user_engine is eng:
                self.user_loop = None
            await eng.dispose()

        await at_shutdown(loop, self.guards, cleanup)

    async def _ensure(self, eng: Any) -> None:
        """Create or upgrade the schema once per instance (a lost creation race is tried again once)."""
        schema = self.owner.schema
        for attempt in (1, 2):
            try:
                async with eng.begin() as conn:
                    await conn.run_sync(ensure_schema_on, self.where, schema)
                break
            except driver_errors() as e:
                # two processes creating SQLite tables at once through SQLAlchemy: one loses; look again
                if attempt == 2:
                    raise wrap(e, self.where) from e
        self.ready = True

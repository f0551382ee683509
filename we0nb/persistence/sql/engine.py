"""The async engine driver: SQLAlchemy 2 asyncio (any ``AsyncEngine`` passed in, SQLite with
``inline_sqlite=False`` through aiosqlite, PostgreSQL with ``engine_options`` beyond psycopg's own path).

Async pools are bound to the event loop that created their connections, so there is one
``AsyncEngine`` per running loop, created lazily (an engine you pass is re-pooled when the
loop changes); when ``asyncio.run()`` shuts a loop down, its pool is closed on that loop.
Single statements run in autocommit (one round trip); transactions in ``begin()``.
Statements are the precompiled text of :mod:`.statements`, run with ``exec_driver_sql``.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Optional, Sequence

from .database import Database, ensure_schema_on
from .driver import Call, Guard, Op, Params, guarded
from .errors import driver_errors, wrap
from .loops import at_shutdown, running_loop
from .statements import Stmt, compiled

__all__ = ["AsyncEngines"]


class AsyncEngines:
    """The :class:`~.driver.Driver` on SQLAlchemy's asyncio engines: one per running event loop."""

    def __init__(self, db: Database):
        self.db = db
        self.dialect, self.where = db.dialect, db.where
        self.user_engine = db.async_engine
        self.user_loop: Optional[weakref.ReferenceType] = None
        self.engines: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.ready = False
        self.guards: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.sql = compiled(db.dialect)
        self.autocommit: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------ the driver

    async def execute(self, stmt: Stmt, params: Params) -> int:
        try:
            eng = await self._auto()
            async with eng.connect() as conn:  # autocommit: the statement commits by itself
                result = await conn.exec_driver_sql(self.sql[stmt], params)
                return int(result.rowcount)
        except driver_errors() as e:
            raise wrap(e, self.where) from e

    async def fetchall(self, stmt: Stmt, params: Params) -> list[Any]:
        try:
            eng = await self._auto()
            async with eng.connect() as conn:
                result = await conn.exec_driver_sql(self.sql[stmt], params)
                return list(result.all())
        except driver_errors() as e:
            raise wrap(e, self.where) from e

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """One statement after the other."""
        return [await (self.fetchall if rows else self.execute)(stmt, params) for stmt, params, rows in calls]

    async def transaction(self, ops: Sequence[Op], guard: Optional[Guard] = None) -> bool:
        try:
            eng = await self.engine()
            async with eng.begin() as conn:
                async def step(stmt: Stmt, params: Any) -> int:
                    return int((await conn.exec_driver_sql(self.sql[stmt], params)).rowcount)

                return await guarded(step, ops, guard)
        except driver_errors() as e:
            raise wrap(e, self.where) from e

    async def commit(self, ops: Sequence[Op], guard: Optional[Guard], *, crowded: bool) -> bool:
        return await self.transaction(ops, guard)

    def read_now(self, queries: Sequence[tuple[Stmt, Params]]) -> Optional[list[list[Any]]]:
        return None

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
                self.db.install_events(eng.sync_engine)
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

        eng = create_async_engine(self.db.async_url, **self.db.engine_options)
        self.db.install_events(eng.sync_engine)
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
        for attempt in (1, 2):
            try:
                async with eng.begin() as conn:
                    await conn.run_sync(ensure_schema_on, self.where, self.db.schema)
                break
            except driver_errors() as e:
                # two processes creating SQLite tables at once through SQLAlchemy: one loses; look again
                if attempt == 2:
                    raise wrap(e, self.where) from e
        self.ready = True

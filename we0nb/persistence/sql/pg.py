"""PostgreSQL on psycopg 3's own ``AsyncConnection``: the run's hot path without SQLAlchemy.

Why: through SQLAlchemy's asyncio layer every statement crosses a greenlet, a pool checkout
and its events; on these 2-core machines that was ~0.65 ms of client CPU per autocommit
statement against ~0.17 ms on the bare connection (W7 of ``shared/BENCH.md`` runs ~70
statements per item, and a batch is CPU-bound on one event loop). The statements are the
same precompiled text (:mod:`.statements`, psycopg's ``%(name)s`` style) and the interface
is the :class:`~.driver.Driver`; the schema is made by the synchronous engine
(:meth:`~.database.Database.sync_engine`) in a worker thread, once per instance.

Connections are bound to the event loop that opened them, so there is one small pool per
running loop; each connection runs in autocommit (a single statement is one round trip),
and a transaction is an explicit ``BEGIN … COMMIT`` on one of them. A connection that comes
back in an unknown state (a cancelled statement, a broken socket) is closed, never reused.
When ``asyncio.run()`` shuts a loop down, its pool is closed on that loop.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Optional, Sequence, cast

from .database import Database, pg_settings
from .driver import Call, Guard, Op, Params, guarded
from .errors import driver_errors, wrap
from .loops import at_shutdown, running_loop
from .pg_group import GroupCommit
from .statements import Stmt, compiled

__all__ = ["PgConnections", "NATIVE_OPTIONS"]

#: the ``engine_options`` this path honours; any other option goes through SQLAlchemy
NATIVE_OPTIONS = frozenset({"pool_size", "max_overflow", "connect_args"})


class _Pool:
    """Up to ``size`` connections of one event loop; callers beyond it wait for one."""

    def __init__(self, conns: "PgConnections", size: int):
        self.group = GroupCommit(conns)
        self.idle: list[Any] = []
        self.slots = asyncio.Semaphore(size)
        self.open: "weakref.WeakSet[Any]" = weakref.WeakSet()


class PgConnections:
    """The PostgreSQL :class:`~.driver.Driver`: pools of psycopg ``AsyncConnection`` per running event loop."""

    dialect = "postgresql"

    def __init__(self, db: Database):
        self.db = db
        self.where = db.where
        self.sql = compiled("postgresql")
        opts = db.engine_options
        self.size = max(1, int(opts.get("pool_size", 5)) + int(opts.get("max_overflow", 10)))
        self.connect_args = dict(opts.get("connect_args", {}))
        self.conninfo = conninfo(db.sync_url)
        self.settings = pg_settings(db.schema, db.synchronous)
        self.pools: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool]" = weakref.WeakKeyDictionary()
        self.guards: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = weakref.WeakKeyDictionary()
        self.ready = False

    # ------------------------------------------------------------------ the driver

    async def execute(self, stmt: Stmt, params: Params) -> int:
        """One statement (sent with the others of this moment: :mod:`.pg_group`); its row count."""
        return int(await (await self.pool()).group.statement(stmt, params, rows=False))

    async def fetchall(self, stmt: Stmt, params: Params) -> list[Any]:
        """One query (sent with the others of this moment); its rows."""
        return list(await (await self.pool()).group.statement(stmt, params, rows=True))

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """Sent at once: they go to the server together, in this order (one round trip)."""
        group = (await self.pool()).group  # (ready first: each statement is then queued in order)
        return list(await asyncio.gather(*(group.statement(stmt, params, rows) for stmt, params, rows in calls)))

    async def commit(self, ops: Sequence[Op], guard: Optional[Guard], *, crowded: bool) -> bool:
        """:meth:`transaction`, sent together with the other runs' commits of this moment
        (:mod:`.pg_group`); the same outcome, fewer round trips."""
        if guard is None or not GroupCommit.takes(ops, guard):
            return await self.transaction(ops, guard)
        pool = await self.pool()
        return await pool.group.commit(ops, guard)

    async def transaction(self, ops: Sequence[Op], guard: Optional[Guard] = None) -> bool:
        async with _Lent(self) as conn:
            async with conn.transaction():
                cur = conn.cursor()

                async def step(stmt: Stmt, params: Any) -> int:
                    if isinstance(params, list):
                        await cur.executemany(self.sql[stmt], params)
                    else:
                        await cur.execute(self.sql[stmt], params)
                    return int(cur.rowcount)

                return await guarded(step, ops, guard)

    def read_now(self, queries: Sequence[tuple[Stmt, Params]]) -> Optional[list[list[Any]]]:
        return None

    # ------------------------------------------------------------------ for the group commit

    def lend(self) -> "_Lent":
        """``async with conns.lend() as conn``: one connection of this loop's pool."""
        return _Lent(self)

    async def execute_now(self, stmt: Stmt, params: Params) -> int:
        """One statement on a connection of its own (prepared by psycopg once it recurs)."""
        async with _Lent(self) as conn:
            cur = await conn.execute(self.sql[stmt], params)
            return int(cur.rowcount)

    async def fetchall_now(self, stmt: Stmt, params: Params) -> list[Any]:
        async with _Lent(self) as conn:
            cur = await conn.execute(self.sql[stmt], params)
            return list(await cur.fetchall())

    async def close(self) -> None:
        """Close this loop's connections; another loop's are dropped (they cannot be closed from here)."""
        loop = running_loop()
        pools = list(self.pools.items())
        self.pools = weakref.WeakKeyDictionary()  # connections lent out now are closed when given back
        for lp, pool in pools:
            if lp is loop:
                await _close_all(pool, lent_too=False)

    # ------------------------------------------------------------------ pools per loop

    async def pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self.pools.get(loop)
        if pool is None:
            pool = self.pools[loop] = _Pool(self, self.size)
            for old in [lp for lp in self.pools if lp is not loop and lp.is_closed()]:
                self.pools.pop(old, None)  # connections of a closed loop: nothing can close them now
            await self._guard(loop, pool)
        if not self.ready:
            await asyncio.to_thread(self.db.ensure_schema)  # (once per instance)
            self.ready = True
        return pool


    async def connect(self) -> Any:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True, **self.connect_args)
        try:
            for stmt in self.settings:
                await conn.execute(cast(Any, stmt))  # (text built from our constants, not a LiteralString to the checker)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _guard(self, loop: asyncio.AbstractEventLoop, pool: _Pool) -> None:
        """Close ``pool``'s connections on their loop when it shuts down (:func:`.loops.at_shutdown`)."""
        async def cleanup() -> None:
            if self.pools.get(loop) is pool:
                del self.pools[loop]
            await _close_all(pool)

        await at_shutdown(loop, self.guards, cleanup)


class _Lent:
    """``async with _Lent(conns) as conn``: a connection of this loop's pool, given back after
    (closed instead when its state is not clean); driver errors become PersistenceError."""

    __slots__ = ("conns", "pool", "conn")

    def __init__(self, conns: PgConnections):
        self.conns = conns
        self.pool: Optional[_Pool] = None
        self.conn: Any = None

    async def __aenter__(self) -> Any:
        try:
            pool = await self.conns.pool()
            await pool.slots.acquire()
            self.pool = pool
            self.conn = pool.idle.pop() if pool.idle else await self._open(pool)
            return self.conn
        except BaseException as e:
            if self.pool is not None:
                self.pool.slots.release()
            if isinstance(e, driver_errors()):
                raise wrap(e, self.conns.where) from e
            raise

    async def _open(self, pool: _Pool) -> Any:
        conn = await self.conns.connect()
        pool.open.add(conn)
        return conn

    async def __aexit__(self, et: Any, e: Any, tb: Any) -> None:
        pool, conn = self.pool, self.conn
        assert pool is not None
        pool.slots.release()
        if _clean(conn) and self.conns.pools.get(asyncio.get_running_loop()) is pool:
            pool.idle.append(conn)
        else:
            pool.open.discard(conn)
            await _close(conn)
        if e is not None and isinstance(e, driver_errors()):
            raise wrap(e, self.conns.where) from e


def _clean(conn: Any) -> bool:
    from psycopg.pq import TransactionStatus

    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


async def _close(conn: Any) -> None:
    try:
        await conn.close()
    except Exception:  # on purpose: it is being thrown away; nothing is left to tell
        pass


async def _close_all(pool: _Pool, lent_too: bool = True) -> None:
    """Close the idle connections, and with ``lent_too`` those lent out (the loop is ending)."""
    conns = list(pool.open) if lent_too else list(pool.idle)
    pool.idle.clear()
    for conn in conns:
        pool.open.discard(conn)
        await _close(conn)


def conninfo(url: Any) -> str:
    """``url`` as libpq's ``keyword='value'`` connection string. (Rendered back as a URL, its query
    is written the way forms are, a space as ``+``, which libpq does not read as one: ``options=``
    with two ``-c`` settings became one setting with the other glued to its value.)"""
    fields: dict[str, Any] = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
                              "dbname": url.database}
    for key, value in url.query.items():
        fields[key] = value[-1] if isinstance(value, tuple) else value
    return " ".join(f"{key}='{_quoted(str(value))}'" for key, value in fields.items() if value is not None)


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


"""The one interface SqlPersistence has to a database: :class:`Driver`, and the guard rule.

Each backend has one driver: :class:`~.inline.InlineSqlite` (SQLite on a ``sqlite3``
connection on the calling thread), :class:`~.pg.PgConnections` (PostgreSQL on psycopg 3's
own async connections) and :class:`~.engine.AsyncEngines` (SQLAlchemy's asyncio engines: an
engine passed in, aiosqlite, PostgreSQL with other ``engine_options``). The store, the lease
(:mod:`.lease`) and the batch queue (:mod:`.batches`) reach the database through this
interface alone, naming the statements they run (:mod:`.statements`).

A commit is conditional on a *guard*: a statement run first in the transaction — the run's
lease renewal (``LEASE_RENEW``), or a batch's insert (``BATCH_INSERT``) — and the rest is
written only when it :func:`held`. That rule is here once; every driver (and PostgreSQL's
group commit, which renews the leases of many commits in one statement) decides by it.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional, Protocol, Sequence

from .statements import Stmt

__all__ = ["Params", "Op", "Guard", "Call", "Driver", "held", "guarded", "write_together"]

#: a statement's parameters, by name
Params = dict[str, Any]
#: one step of a transaction: ``(statement, params)``, or ``(statement, [params, ...])`` for many rows
Op = tuple[Stmt, Any]
#: the statement a transaction runs first: the rest is written only when it :func:`held`
Guard = tuple[Stmt, Params]
#: a statement sent with others (:meth:`Driver.run`): its params, and whether its rows (True) or
#: its row count (False) come back
Call = tuple[Stmt, Params, bool]


def held(rowcount: int) -> bool:
    """The guard rule: a guard holds when it changed exactly one row — the lease's row, renewed
    because its owner still holds it; the batch's row, inserted because there was none."""
    return rowcount == 1


async def guarded(step: Callable[[Stmt, Any], Awaitable[int]], ops: Sequence[Op], guard: Optional[Guard]) -> bool:
    """``guard``, then (when it :func:`held`) every op, through ``step`` (one statement, its row count)
    inside the caller's transaction. Returns whether the ops were written."""
    if guard is not None and not held(await step(*guard)):
        return False
    for stmt, params in ops:
        if not (isinstance(params, list) and not params):
            await step(stmt, params)
    return True


class Driver(Protocol):
    """What SqlPersistence needs of a database. Every method turns a driver error into
    :class:`~we0nb.PersistenceError`; a statement is never cut in half by a cancel."""

    #: ``"sqlite"`` or ``"postgresql"``
    dialect: str
    #: the database as error messages name it
    where: str

    async def execute(self, stmt: Stmt, params: Params) -> int:
        """One statement, committed on its own; its row count."""
        ...

    async def fetchall(self, stmt: Stmt, params: Params) -> list[Any]:
        """One query; its rows."""
        ...

    async def run(self, calls: Sequence[Call]) -> list[Any]:
        """Statements that do not need each other's answers, in order: each one's rows or row
        count. Sent together where the backend can (PostgreSQL: one round trip); on SQLite
        inline, calls that write run in one transaction."""
        ...

    async def transaction(self, ops: Sequence[Op], guard: Optional[Guard] = None) -> bool:
        """``ops`` in one transaction, after ``guard``: False (nothing written) when it did not hold."""
        ...

    async def commit(self, ops: Sequence[Op], guard: Optional[Guard], *, crowded: bool) -> bool:
        """A run's commit: :meth:`transaction`'s outcome, possibly written together with other
        runs' commits of the same moment (group commit). ``crowded``: other runs of this event
        loop commit too (SQLite then groups; PostgreSQL groups whatever arrives together)."""
        ...

    def read_now(self, queries: Sequence[tuple[Stmt, Params]]) -> Optional[list[list[Any]]]:
        """Several reads at once, synchronously, where the backend can (SQLite inline, when the
        database is not locked); None: use the async path."""

    async def close(self) -> None:
        """Close the connections (they reopen on the next use)."""


async def write_together(db: "Driver", stmt: Stmt, params: Params) -> bool:
    """A write of at most one row, sent with the other writes of this moment; whether it changed
    one (:func:`held`). On SQLite it is one more commit of the pass's group (:mod:`.sqlite_group`:
    one transaction for all, not one each — a batch's lease inserts and releases and its items'
    ends were a third of its transactions and a fifth of its WAL); PostgreSQL's driver sends every
    statement with the others of its moment already (:mod:`.pg_group`)."""
    if db.dialect == "sqlite":
        return await db.commit([], (stmt, params), crowded=True)
    return held(await db.execute(stmt, params))

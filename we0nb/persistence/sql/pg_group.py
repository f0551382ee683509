"""Group commit on PostgreSQL: the commits that many runs make at once, in one round trip.

Why: a batch keeps ~100 runs going on one event loop, and each model step commits two or
three times (the write-ahead before a tool, the step's end). One commit alone is 4–6 round
trips (BEGIN, the lease renewal, the upserts, COMMIT), and each round trip costs ~0.1 ms of
client CPU in psycopg's async path on these machines — the cost that made a PostgreSQL
batch CPU-bound (W7 of ``shared/BENCH.md``).

How: :meth:`GroupCommit.commit` queues the commit and waits. While no send is under way,
one starts at once with everything queued (so a lone commit waits for nobody); commits that
arrive during a send go together in the next one. A send is three statements in one simple
query, which PostgreSQL runs as one transaction: the renewal of every lease of the group
(``RETURNING`` the sessions whose lease was still held), then every part, then every
message — each row written only ``WHERE EXISTS`` its run's lease, which the renewal has just
locked, so the answer cannot change before the commit. A commit whose lease was not renewed
wrote nothing (its lease was lost), exactly as on the one-commit path. Parts go before
messages as there: writing a part drops its message's stored view (a trigger), and the
message's write then stores the new one. A row written twice in a group keeps the later write.

A send that fails (a value the server refuses, a lost connection) writes nothing, and each
of its commits is then tried alone on the usual path, so an error reaches only the commit
that caused it. Values are bound on the client (psycopg's ``ClientCursor``, escaped by
libpq), the only way to send several statements with parameters in one round trip.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Optional, Sequence

from sqlalchemy import String

from . import tables as S
from .inline import Op

__all__ = ["GroupCommit"]

#: the most commits one send carries
MAX_COMMITS = 256
#: the statements a grouped commit may hold (their rows are written by one statement each)
_ROWS = ("upsert_part", "upsert_message")


class _Commit:
    __slots__ = ("ops", "guard", "done")

    def __init__(self, ops: Sequence[Op], guard: Op, done: asyncio.Future):
        self.ops, self.guard, self.done = ops, guard, done


class GroupCommit:
    """The queue of one event loop's commits for one :class:`~.pg.PgConnections`."""

    def __init__(self, conns: Any):
        self.conns = conns  # PgConnections: lend(), transaction(), the statements
        self.queue: list[_Commit] = []
        self.sender: Optional[asyncio.Future] = None  # the task sending, while there is one

    @staticmethod
    def takes(ops: Sequence[Op], guard: Optional[Op]) -> bool:
        """Can this commit go in a group (a lease renewal as its guard, then parts and messages)?"""
        return guard is not None and guard[0] == "lease_renew" and all(k in _ROWS for k, _ in ops)

    async def commit(self, ops: Sequence[Op], guard: Optional[Op]) -> bool:
        done = asyncio.get_running_loop().create_future()
        self.queue.append(_Commit(ops, guard, done))
        if self.sender is None:
            self.sender = asyncio.ensure_future(self._send_all())
        return await done

    async def _send_all(self) -> None:
        group: list[_Commit] = []
        try:
            while self.queue:
                group, self.queue = self.queue[:MAX_COMMITS], self.queue[MAX_COMMITS:]
                group = [c for c in group if not c.done.done()]  # (a cancelled caller: not sent)
                if group:
                    await self._send(group)
        finally:
            self.sender = None
            for c in group + self.queue:  # (left only when this task was cancelled: its loop is ending)
                if not c.done.done():
                    c.done.cancel()
            self.queue = []

    async def _send(self, group: list[_Commit]) -> None:
        try:
            written = await self._together(group)
        except Exception:  # on purpose: nothing was written; each commit alone gets its own outcome
            for c in group:
                await self._alone(c)
            return
        for c, ok in zip(group, written):
            if not c.done.done():
                c.done.set_result(ok)

    async def _alone(self, c: _Commit) -> None:
        try:
            ok = await self.conns.transaction(c.ops, c.guard)
        except Exception as e:
            if not c.done.done():
                c.done.set_exception(e)
            return
        if not c.done.done():
            c.done.set_result(ok)

    async def _together(self, group: list[_Commit]) -> list[bool]:
        """Send ``group`` as one transaction; per commit, was it written (its lease held)?"""
        from psycopg import AsyncClientCursor

        leases: list[tuple[Any, ...]] = []
        rows: dict[str, dict[str, tuple[Any, ...]]] = {"upsert_part": {}, "upsert_message": {}}
        for c in group:
            lease = c.guard[1]
            sid, holder = lease["sid"], lease["holder"]
            leases.append((sid, holder, lease["expires"]))
            for key, params in c.ops:
                table, names = rows[key], _columns(key)
                for row in (params if isinstance(params, list) else [params]):
                    table.pop(row["id"], None)  # a later write of the same row wins (and goes last)
                    table[row["id"]] = (sid, holder, *[row[n] for n in names])
        async with self.conns.lend() as conn:
            cur = AsyncClientCursor(conn)
            text = [_renew_all(cur, leases)]
            for key, table in rows.items():  # parts first: writing a part drops its message's view
                if table:
                    text.append(_upsert_all(cur, key, list(table.values())))
            # several statements in one simple query run as one implicit transaction: an error
            # rolls all of them back, and the connection is left idle
            await cur.execute(";\n".join(text))
            renewed = {r[0] for r in await cur.fetchall()}
            while cur.nextset():
                pass
        return [c.guard[1]["sid"] in renewed for c in group]


# --------------------------------------------------------------------------- the statements


def _values(cur: Any, template: str, rows: Sequence[tuple[Any, ...]]) -> str:
    return ", ".join(cur.mogrify(template, r) for r in rows)


def _renew_all(cur: Any, leases: Sequence[tuple[str, str, float]]) -> str:
    """Renew every lease of the group still held (``RETURNING`` those renewed)."""
    return (f"UPDATE {S.leases.name} AS l SET expires = CAST(v.expires AS FLOAT) "
            f"FROM (VALUES {_values(cur, '(%s, %s, %s)', leases)}) AS v(sid, holder, expires) "
            "WHERE l.session_id = v.sid AND l.owner = v.holder RETURNING l.session_id")


def _table(key: str) -> Any:
    return {"upsert_part": S.parts, "upsert_message": S.messages}[key]


@functools.lru_cache(maxsize=None)
def _columns(key: str) -> tuple[str, ...]:
    return tuple(c.name for c in _table(key).columns)


@functools.lru_cache(maxsize=None)
def _upsert_parts(key: str) -> tuple[str, str, str]:
    """``(head, row template, tail)`` of the conditional upsert of many rows into ``key``'s table.

    Every value is cast: a VALUES list has no column types to infer them from (strings to an
    unbounded type, since a cast to ``VARCHAR(n)`` would cut silently where the insert refuses)."""
    from sqlalchemy.dialects import postgresql

    t = _table(key)
    d = postgresql.dialect()
    names = list(_columns(key))
    casts = ", ".join(
        f"CAST(v.{n} AS {(String() if isinstance(c.type, String) else c.type).compile(dialect=d)})"
        for n, c in zip(names, t.columns))
    head = (f"INSERT INTO {t.name} ({', '.join(names)}) SELECT {casts} FROM (VALUES ")
    template = "(" + ", ".join(["%s"] * (len(names) + 2)) + ")"
    tail = (f") AS v(we0_sid, we0_holder, {', '.join(names)}) "
            f"WHERE EXISTS (SELECT 1 FROM {S.leases.name} AS l WHERE l.session_id = v.we0_sid "
            "AND l.owner = v.we0_holder) "
            f"ON CONFLICT (id) DO UPDATE SET {', '.join(f'{n} = excluded.{n}' for n in names if n != 'id')}")
    return head, template, tail


def _upsert_all(cur: Any, key: str, rows: Sequence[tuple[Any, ...]]) -> str:
    """Upsert ``rows`` (each ``(session id, lease holder, *columns)``) where that lease is held."""
    head, template, tail = _upsert_parts(key)
    return head + _values(cur, template, rows) + tail

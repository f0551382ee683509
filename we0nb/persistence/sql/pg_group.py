"""Group commit on PostgreSQL: the commits that many runs make at once, in one round trip.

Why: a batch keeps ~100 runs going on one event loop, and each model step commits two or
three times (the write-ahead before a tool, the step's end). One commit alone is 4–6 round
trips (BEGIN, the lease renewal, the upserts, COMMIT), and each round trip costs ~0.1 ms of
client CPU in psycopg's async path on these machines — the cost that made a PostgreSQL
batch CPU-bound (W7 of ``shared/BENCH.md``).

How: :meth:`GroupCommit.commit` queues the commit and waits. While no send is under way,
one starts at once with everything queued (so a lone commit waits for nobody); commits that
arrive during a send go together in the next one. A send is up to four statements in one
simple query, which PostgreSQL runs as one transaction: the renewal of every lease of the
group (``RETURNING`` the sessions whose lease was still held: a commit's guard :func:`~.driver.held`
when its session's row came back once), then every session row, every part and every message —
each row written only ``WHERE EXISTS`` its run's lease, which the renewal has just locked, so the
answer cannot change before the commit. A commit whose lease was not renewed wrote nothing (its
lease was lost), exactly as on the one-commit path. Parts go before
messages as there: writing a part drops its message's stored view (a trigger), and the
message's write then stores the new one. A row written twice in a group keeps the later write.
One send is under way at a time, so commits land in the order they were made; a commit once
queued is sent even if its caller is cancelled meanwhile (the run's writer has let go of its
rows, which would otherwise be lost).

A send that fails on an error the server answered (a value it refuses) wrote nothing, and each
of its entries is then tried alone on the usual path, so an error reaches only the commit
that caused it. A send whose connection failed may have committed: its entries are tried
alone too — all of them may be sent again but a claim and an item's end, whose outcome is read
back instead (:mod:`.pg_retry`; the same when an entry sent alone loses its answer). Values are bound on the client, the only way to send several statements
with parameters in one round trip: as quoted literals of our own (:func:`_literal`) where
the server reads standard strings, else by psycopg's ``ClientCursor.mogrify``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union, cast

from sqlalchemy import String

from . import pg_retry
from . import statements as q
from . import tables as S
from .driver import Guard, Op, Params, held
from .statements import Stmt

if TYPE_CHECKING:
    from .pg import PgConnections

__all__ = ["GroupCommit"]

#: the most entries (commits, single statements) one send carries
MAX_COMMITS = 256
#: the statements a grouped commit may hold (their rows are written by one statement each), in the
#: order they are sent (parts before messages: a part drops its message's view)
_ROWS = (q.UPSERT_SESSION, q.UPSERT_PART, q.UPSERT_MESSAGE)
_TABLES = {q.UPSERT_SESSION: S.sessions, q.UPSERT_PART: S.parts, q.UPSERT_MESSAGE: S.messages}


class _Commit:
    """A run's commit: its lease renewal, then its rows; the result is whether it was written."""

    __slots__ = ("ops", "guard", "done")

    def __init__(self, ops: Sequence[Op], guard: Guard, done: asyncio.Future):
        self.ops, self.guard, self.done = ops, guard, done


class _Statement:
    """One statement on its own; the result is its rows (``rows``) or its row count."""

    __slots__ = ("stmt", "params", "rows", "done")

    def __init__(self, stmt: Stmt, params: Params, rows: bool, done: asyncio.Future):
        self.stmt, self.params, self.rows, self.done = stmt, params, rows, done


_Entry = Union[_Commit, _Statement]


class GroupCommit:
    """The queue of one event loop's commits and single statements for one
    :class:`~.pg.PgConnections`."""

    def __init__(self, conns: "PgConnections"):
        self.conns = conns
        self.queue: list[_Entry] = []
        self.sender: Optional[asyncio.Future] = None  # the task sending, while there is one

    @staticmethod
    def takes(ops: Sequence[Op], guard: Optional[Guard]) -> bool:
        """Can this commit go in a group (a lease renewal as its guard, then parts and messages)?"""
        return guard is not None and guard[0] is q.LEASE_GUARD and all(k in _TABLES for k, _ in ops)

    async def commit(self, ops: Sequence[Op], guard: Guard) -> bool:
        return await self._queued(_Commit(ops, guard, asyncio.get_running_loop().create_future()))

    async def statement(self, stmt: Stmt, params: Params, rows: bool) -> Any:
        """One statement, sent with the others of this moment: its rows, or its row count."""
        return await self._queued(_Statement(stmt, params, rows, asyncio.get_running_loop().create_future()))

    async def _queued(self, entry: _Entry) -> Any:
        done = entry.done
        self.queue.append(entry)
        if self.sender is None:
            self.sender = asyncio.ensure_future(self._send_all())
        return await done

    async def _send_all(self) -> None:
        group: list[_Entry] = []
        try:
            while self.queue:
                group, self.queue = self.queue[:MAX_COMMITS], self.queue[MAX_COMMITS:]
                # a commit is sent even when its caller was cancelled meanwhile (the run has let go
                # of those rows: they would be lost); a lone statement whose caller left is not
                group = [e for e in group if isinstance(e, _Commit) or not e.done.done()]
                if group:
                    await self._send(group)
        finally:
            self.sender = None
            for c in group + self.queue:  # (left only when this task was cancelled: its loop is ending)
                if not c.done.done():
                    c.done.cancel()
            self.queue = []

    async def _send(self, group: list[_Entry]) -> None:
        if len(group) == 1:  # alone: the prepared path (the server plans it once per connection)
            await self._alone(group[0])
            return
        try:
            results = await self._together(group)
        except Exception as exc:  # on purpose: each entry alone gets its own outcome
            await self._retry(group, pg_retry.outcome_unknown(exc))
            return
        for e, result in zip(group, results):
            if not e.done.done():
                e.done.set_result(result)

    async def _retry(self, group: list[_Entry], unknown: bool) -> None:
        """Each entry of a failed send alone; ``unknown``: the send may have committed (see
        :mod:`.pg_retry`). A worker's claims merged into one are retried as that one claim."""
        sent, shares = _merge_claims([e for e in group if isinstance(e, _Statement)])
        merged = {id(m) for _, members in shares for m in members}
        for e in group:
            if id(e) not in merged:
                await self._alone(e, unknown)
        for claim, members in shares:
            try:
                got = await self._outcome(claim, unknown)
            except Exception as exc:
                for m in members:
                    if not m.done.done():
                        m.done.set_exception(exc)
                continue
            for m, rows in _share(got, members):
                if not m.done.done():
                    m.done.set_result(rows)

    async def _alone(self, e: _Entry, unknown: bool = False) -> None:
        try:
            result = await self._outcome(e, unknown)
        except Exception as exc:
            if not e.done.done():
                e.done.set_exception(exc)
            return
        if not e.done.done():
            e.done.set_result(result)

    async def _outcome(self, e: _Entry, unknown: bool) -> Any:
        """``e`` sent alone: its result, or its error raised. A statement that must not run twice
        (:data:`~.pg_retry.ONCE`) whose earlier send may have committed (``unknown``), or whose
        answer is lost now, has its outcome read back instead (:func:`~.pg_retry.resolve`); any
        other entry whose answer is lost now is sent once more (a commit's upserts under its lease,
        a renewal, a read: twice is once)."""
        st = e if isinstance(e, _Statement) and e.stmt in pg_retry.ONCE else None
        if unknown and st is not None:
            return await pg_retry.resolve(self.conns.fetchall_now, self.conns.execute_now, st.stmt, st.params)
        try:
            return await self._send_alone(e)
        except Exception as exc:
            if not pg_retry.outcome_unknown(exc):
                raise
            if st is not None:
                return await pg_retry.resolve(self.conns.fetchall_now, self.conns.execute_now, st.stmt, st.params)
            return await self._send_alone(e)  # (once more, on a new connection: twice is once for these)

    async def _send_alone(self, e: _Entry) -> Any:
        if isinstance(e, _Commit):
            return await self.conns.transaction(e.ops, e.guard)
        return await (self.conns.fetchall_now if e.rows else self.conns.execute_now)(e.stmt, e.params)

    async def _together(self, group: list[_Entry]) -> list[Any]:
        """Send ``group`` as one transaction: per entry, its result (see the entry's class)."""
        from psycopg import AsyncClientCursor

        statements = [e for e in group if isinstance(e, _Statement)]
        commits = [e for e in group if isinstance(e, _Commit)]
        leases: list[tuple[Any, ...]] = []
        rows: dict[Stmt, dict[str, tuple[Any, ...]]] = {stmt: {} for stmt in _ROWS}
        for c in commits:
            lease = c.guard[1]
            sid, holder = lease["sid"], lease["holder"]
            leases.append((sid, holder, lease["ttl"]))
            for key, params in c.ops:
                table, names = rows[key], _columns(key)
                for row in (params if isinstance(params, list) else [params]):
                    table.pop(row["id"], None)  # a later write of the same row wins (and goes last)
                    table[row["id"]] = (sid, holder, *[row[n] for n in names])
        sql = self.conns.sql
        sent, shares = _merge_claims(statements)
        async with self.conns.lend() as conn:
            cur = AsyncClientCursor(conn)
            standard = conn.info.parameter_status("standard_conforming_strings") == "on"
            text = [_bind(cur, sql[e.stmt], e.params, standard) for e in sent]
            if commits:
                text.append(_renew_all(cur, leases, standard))
                for key, table in rows.items():  # (parts before messages: a part drops its message's view)
                    if table:
                        text.append(_upsert_all(cur, key, list(table.values()), standard))
            # several statements in one simple query run as one implicit transaction: an error
            # rolls all of them back, and the connection is left idle
            await cur.execute(cast(Any, ";\n".join(text)))  # (our statements joined: not a LiteralString to the checker)
            out: dict[int, Any] = {}
            for e in sent:
                out[id(e)] = await cur.fetchall() if e.rows else cur.rowcount
                cur.nextset()
            for e, members in shares:  # the merged claim's rows, shared out in the claimers' order
                for m, share in _share(out[id(e)], members):
                    out[id(m)] = share
            if commits:
                renewed = collections.Counter(r[0] for r in await cur.fetchall())  # rows renewed, by session
                while cur.nextset():
                    pass
                for c in commits:
                    out[id(c)] = held(renewed[c.guard[1]["sid"]])
        return [out[id(e)] for e in group]


def _merge_claims(statements: list[_Statement]) -> tuple[list[_Statement], list[tuple[_Statement, list[_Statement]]]]:
    """The statements to send: the claims of one worker on one batch (its slots turning over
    at once) as one claim of their total, which the server scans for once. Returns the
    statements and, per merged claim, ``(claim sent, the claims it stands for)``."""
    sent: list[_Statement] = []
    by_worker: dict[tuple[Any, ...], list[_Statement]] = {}
    for e in statements:
        if e.stmt is q.BATCH_CLAIM:
            p = e.params
            members = by_worker.setdefault((p["b"], p["owner"], p["host"], p["pid"]), [])
            members.append(e)
            if len(members) > 1:
                continue
        sent.append(e)
    shares = []
    for members in by_worker.values():
        if len(members) > 1:
            first = members[0]
            merged = _Statement(first.stmt, dict(first.params, n=sum(m.params["n"] for m in members)), True,
                                first.done)
            sent[sent.index(first)] = merged
            shares.append((merged, members))
    return sent, shares


def _share(got: list[Any], members: list[_Statement]) -> list[tuple[_Statement, list[Any]]]:
    """A merged claim's rows shared out in its claimers' order, each up to the number it asked for."""
    out = []
    for m in members:
        k = m.params["n"]
        out.append((m, got[:k]))
        got = got[k:]
    return out


# --------------------------------------------------------------------------- the statements


def _bind(cur: Any, sql: str, params: dict[str, Any], standard: bool) -> str:
    """A statement with its ``%(name)s`` parameters as literals (:func:`_literal`; psycopg's
    ``mogrify`` where the server does not read standard strings). The statements are compiled
    for psycopg, whose placeholders are Python's ``%`` format (a literal ``%`` is ``%%``)."""
    if standard:
        return sql % {k: _literal(v) for k, v in params.items()}
    return cur.mogrify(sql, params)


def _values(cur: Any, template: str, rows: Sequence[tuple[Any, ...]], standard: bool) -> str:
    """``rows`` as a VALUES list: by :func:`_literal` (~10× cheaper than psycopg's per-value
    adaptation, which was a fifth of the client's CPU in W7) where the server reads standard
    strings, else by psycopg's ``mogrify``."""
    if standard:
        return ", ".join("(" + ", ".join(map(_literal, r)) + ")" for r in rows)
    return ", ".join(cur.mogrify(template, r) for r in rows)


_FLOAT_WORDS = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}


def _literal(v: Any) -> str:
    """A value of a row column as an SQL literal, for a server with ``standard_conforming_strings``
    (there a quote doubled is the whole escaping of a string: a backslash is an ordinary
    character). Every value but NULL is a quoted literal, so each VALUES column is text and
    its cast parses the value with the column type's own input (as a parameter sent as text
    is: ``-0.0``, ``NaN`` and every float's shortest repr come back exact). The columns hold
    str, int, float, bool and None only; anything else raises, and the group is then done
    commit by commit through psycopg's own adaptation. A NUL (which no PostgreSQL text holds)
    is refused by the server, with the same outcome."""
    t = type(v)
    if t is str:
        return "'" + v.replace("'", "''") + "'"
    if v is None:
        return "NULL"
    if t is bool:
        return "'true'" if v else "'false'"
    if t is int:
        return f"'{v}'"
    if t is float:
        text = repr(v)
        return "'" + _FLOAT_WORDS.get(text, text) + "'"
    raise TypeError(f"no SQL literal for a {t.__name__} in a grouped commit")


def _renew_all(cur: Any, leases: Sequence[tuple[str, str, float]], standard: bool) -> str:
    """Renew every lease of the group still held, to the server's now + its ttl (``RETURNING``
    those renewed)."""
    return (f"UPDATE {S.leases.name} AS l SET expires = CAST(EXTRACT(EPOCH FROM now()) AS FLOAT) "
            "+ CAST(v.ttl AS FLOAT) "
            f"FROM (VALUES {_values(cur, '(%s, %s, %s)', leases, standard)}) AS v(sid, holder, ttl) "
            "WHERE l.session_id = v.sid AND l.owner = v.holder RETURNING l.session_id")


@functools.lru_cache(maxsize=None)
def _columns(stmt: Stmt) -> tuple[str, ...]:
    return tuple(c.name for c in _TABLES[stmt].columns)


@functools.lru_cache(maxsize=None)
def _upsert_parts(stmt: Stmt) -> tuple[str, str, str]:
    """``(head, row template, tail)`` of the conditional upsert of many rows into ``key``'s table.

    Every value is cast: a VALUES list has no column types to infer them from (strings to an
    unbounded type, since a cast to ``VARCHAR(n)`` would cut silently where the insert refuses)."""
    from sqlalchemy.dialects import postgresql

    t = _TABLES[stmt]
    d = postgresql.dialect()
    names = list(_columns(stmt))
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


def _upsert_all(cur: Any, stmt: Stmt, rows: Sequence[tuple[Any, ...]], standard: bool) -> str:
    """Upsert ``rows`` (each ``(session id, lease holder, *columns)``) where that lease is held."""
    head, template, tail = _upsert_parts(stmt)
    return head + _values(cur, template, rows, standard) + tail

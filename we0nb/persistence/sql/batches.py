"""The batch queue on SQL (``we0_batches``, ``we0_batch_items``): :class:`SqlBatchQueue`.

Claiming is one statement: an UPDATE of the first claimable items (queued, claim expired)
that returns them — atomic on SQLite (one writer at a time), and on PostgreSQL the rows are
picked ``FOR UPDATE SKIP LOCKED``, so concurrent claimers neither get the same item nor
wait on each other. Ending, renewing and freeing a claim are conditional on its owner.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Optional, Sequence

from ..._ids import new_id
from ...errors import PersistenceError
from ..batches import BatchInfo, BatchItem, BatchQueue, ItemCost, ItemEnd, NewItem, check_same_prompts, fingerprint
from . import statements as q
from .driver import Driver, Params, write_together
from .lease import pid_alive
from .pg_retry import outcome_unknown, resolve
from .statements import END_COLUMNS, Stmt
from .tables import cut

__all__ = ["SqlBatchQueue", "item_from_row", "owner_process", "read_items", "read_infos", "costs_from_rows",
           "read_costs"]


def item_from_row(row: Any) -> BatchItem:
    (batch, item, sid, prompt, status, queued, owner, expires, attempts, started, finished, duration, text, output,
     error, steps, tool_calls, input_tokens, output_tokens) = row
    return BatchItem(batch=batch, item=item, session_id=sid, prompt=prompt, status=status, queued=bool(queued),
                     owner=owner, expires=expires, attempts=attempts, started=started, finished=finished,
                     duration=duration, text=text, output=output, error=error, steps=steps, tool_calls=tool_calls,
                     input_tokens=input_tokens, output_tokens=output_tokens)


class SqlBatchQueue(BatchQueue):
    """The :class:`~we0nb.persistence.batches.BatchQueue` of one database, through its driver."""

    def __init__(self, db: Driver) -> None:
        self.db = db
        self.host = socket.gethostname()[:128]

    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        """Create the batch and its items in one transaction (guarded by the batch's insert), or
        check the existing one."""
        fp = fingerprint(items)
        head = {"name": name, "created": now, "updated": now, "items": len(items), "fingerprint": fp}
        rows = [_new_item(name, i, it) for i, it in enumerate(items)]
        created = await self.db.transaction([(q.BATCH_ITEM_INSERT, rows)] if rows else [], (q.BATCH_INSERT, head))
        if not created:
            got = await self.db.fetchall(q.BATCH_GET, {"b": name})
            _, _, _, n, stored_fp = got[0]
            if stored_fp != fp or n != len(items) or session_ids_given:
                stored = await self.db.fetchall(q.BATCH_PROMPTS, {"b": name})
                check_same_prompts(name, [(p, s) for p, s in stored], items, session_ids_given)
        return (await self.list_batches(name))[0]

    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float, expires: float,
                                token: Optional[str] = None) -> list[BatchItem]:
        params = self._claim_params(name, owner, n, now, expires, token)
        try:
            rows = await self.db.fetchall(q.BATCH_CLAIM, params)
        except PersistenceError as e:
            rows = await self._read_back(e, q.BATCH_CLAIM, params)
        return _claimed(rows)

    async def _read_back(self, error: PersistenceError, stmt: Stmt, params: Params) -> Any:
        """A claim's or an end's outcome after ``error``: read back when the error left it unknown
        (a connection lost after the statement may have committed: :mod:`.pg_retry`), else raised."""
        if not outcome_unknown(error):
            raise error
        return await resolve(self.db.fetchall, self.db.execute, stmt, params)

    def _claim_params(self, name: str, owner: str, n: int, now: float, expires: float,
                      token: Optional[str]) -> Params:
        host, pid = owner_process(owner, self.host)
        here = time.time()  # (PostgreSQL takes now and expires as offsets from this clock: statements.db_now)
        return {"b": name, "owner": owner[:256], "host": host, "pid": pid, "n": n, "now": now, "expires": expires,
                "token": (token or new_id("clm"))[:64], "now_ofs": now - here, "ttl": expires - here}

    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> list[int]:
        rows = await self.db.fetchall(q.BATCH_RENEW, {"b": name, "holder": owner[:256], "expires": expires,
                                                      "ttl": expires - time.time()})
        return sorted(int(r[0]) for r in rows)

    async def release_batch_claims(self, name: str, owner: str, items: Sequence[int]) -> int:
        n = 0
        for i in items:
            n += await self.db.execute(q.BATCH_RELEASE, {"b": name, "holder": owner[:256], "item": i})
        return n

    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        params = _end_params(name, item, owner, end)
        try:
            return await write_together(self.db, q.BATCH_END, params)
        except PersistenceError as e:
            return await self._read_back(e, q.BATCH_END, params) == 1

    async def end_and_claim(self, name: str, item: int, owner: str, end: ItemEnd, *, claim: int, now: float,
                            expires: float, token: Optional[str] = None) -> tuple[bool, list[BatchItem]]:
        """An end and a claim of up to ``claim`` items, sent together (:meth:`~.driver.Driver.run`: on
        SQLite one transaction, on PostgreSQL one round trip, where a worker's claims of one moment merge)."""
        if not claim:
            return await self.end_batch_item(name, item, owner, end), []
        end_params, claim_params = _end_params(name, item, owner, end), self._claim_params(name, owner, claim, now,
                                                                                          expires, token)
        try:
            ended, rows = await self.db.run([(q.BATCH_END, end_params, False), (q.BATCH_CLAIM, claim_params, True)])
        except PersistenceError as e:  # (either may have committed: each is read back)
            ended = await self._read_back(e, q.BATCH_END, end_params)
            rows = await self._read_back(e, q.BATCH_CLAIM, claim_params)
        return ended == 1, _claimed(rows)

    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        n = 0
        for i in items:  # (a row count per item: executemany reports none reliably)
            n += await self.db.execute(q.BATCH_REQUEUE, {"b": name, "item": i})
        return n

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        me, mine = self.host, os.getpid()
        n = 0
        for owner, host, pid in await self.db.fetchall(q.BATCH_OWNERS, {"b": name}):
            if host != me or pid is None:
                continue  # another machine: only the expiry can tell
            gone = owner not in live if pid == mine else not pid_alive(int(pid))
            if gone:
                n += await self.db.execute(q.BATCH_FREE, {"b": name, "holder": owner})
        return n

    async def batch_items(self, name: str) -> list[BatchItem]:
        return [item_from_row(r) for r in await self.db.fetchall(q.BATCH_ITEMS, {"b": name})]

    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        if name is None:
            heads = await self.db.fetchall(q.BATCH_LIST, {})
            counts = await self.db.fetchall(q.BATCH_COUNTS_ALL, {})
        else:
            heads = await self.db.fetchall(q.BATCH_GET, {"b": name})
            counts = await self.db.fetchall(q.BATCH_COUNTS, {"b": name}) if heads else []
        out = {h[0]: BatchInfo(name=h[0], created=h[1], updated=h[2], items=h[3], fingerprint=h[4]) for h in heads}
        _add_counts(out, counts)
        return list(out.values())

    async def batch_costs(self, name: str) -> list[ItemCost]:
        return costs_from_rows(await self.db.fetchall(q.BATCH_COSTS, {"b": name}))


def _new_item(name: str, i: int, it: NewItem) -> Params:
    return {"batch": name, "item": i, "session_id": it.session_id, "prompt": it.prompt, "status": "pending",
            "queued": True, "owner": None, "host": None, "pid": None, "expires": 0.0, "attempts": 0,
            "started": None, "finished": None, "duration": 0.0, "text": None, "output": None, "error": None,
            "steps": 0, "tool_calls": 0, "input_tokens": 0, "output_tokens": 0, "claim": None}


def _claimed(rows: list[Any]) -> list[BatchItem]:
    got = [item_from_row(r) for r in rows]
    got.sort(key=lambda it: it.item)
    return got


def owner_process(owner: str, default_host: str) -> tuple[str, int]:
    """``(host, pid)`` of an owner made by :func:`~we0nb.persistence.base.lease_owner` (``host:pid:id``)."""
    parts = owner.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0][:128], int(parts[1])
    return default_host, os.getpid()


def _end_params(name: str, item: int, owner: str, e: ItemEnd) -> Params:
    params = {k: getattr(e, k) for k in END_COLUMNS if k != "expires"}
    for k in ("text", "output", "error"):  # flattened text columns: NUL-safe (see tables.cut)
        params[k] = cut(params[k])
    delay = e.not_before - time.time() if e.not_before > 0 else None  # (PostgreSQL: on the server's clock)
    params.update(b=name, item=item, holder=owner[:256], run_time=e.run_time, expires=e.not_before, delay=delay)
    return params


# --------------------------------------------------------------------------- synchronous reads (frames, CLI)


def read_items(conn: Any, name: str) -> list[BatchItem]:
    """The batch's items through a synchronous SQLAlchemy connection (none without the tables)."""
    from sqlalchemy import inspect, select

    from . import tables as S
    from .statements import ITEM_COLUMNS

    if not inspect(conn).has_table(S.batch_items.name):
        return []
    I = S.batch_items
    rows = conn.execute(select(*[I.c[n] for n in ITEM_COLUMNS]).where(I.c.batch == name).order_by(I.c.item))
    return [item_from_row(tuple(r)) for r in rows]


def read_infos(conn: Any) -> list[BatchInfo]:
    """Every batch with its counts, through a synchronous SQLAlchemy connection."""
    from sqlalchemy import func, inspect, select

    from . import tables as S

    if not inspect(conn).has_table(S.batches.name):
        return []
    B, I = S.batches, S.batch_items
    heads = conn.execute(select(B.c.name, B.c.created, B.c.updated, B.c["items"], B.c.fingerprint).order_by(B.c.name))
    out = {h[0]: BatchInfo(name=h[0], created=h[1], updated=h[2], items=h[3], fingerprint=h[4]) for h in heads}
    counts = conn.execute(select(I.c.batch, I.c.status, I.c.queued, func.count(), func.max(I.c.finished))
                          .group_by(I.c.batch, I.c.status, I.c.queued))
    _add_counts(out, [tuple(r) for r in counts])
    return list(out.values())


def costs_from_rows(rows: list[Any]) -> list[ItemCost]:
    """``batch_costs`` rows (item, sum of known costs, calls without one) as :class:`ItemCost`."""
    return [ItemCost(int(item), float(priced or 0.0), int(unpriced or 0)) for item, priced, unpriced in rows]


def read_costs(conn: Any, name: str) -> list[ItemCost]:
    """What each item of batch ``name`` cost so far, through a synchronous SQLAlchemy connection."""
    from sqlalchemy import inspect

    from . import tables as S

    if not inspect(conn).has_table(S.batch_items.name):
        return []
    dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    return costs_from_rows(list(conn.exec_driver_sql(q.compiled(dialect)[q.BATCH_COSTS], {"b": name})))


def _add_counts(out: dict[str, BatchInfo], counts: list[Any]) -> None:
    for batch, status, queued, count, finished in counts:
        info = out.get(batch)
        if info is None:
            continue
        if finished is not None and finished > info.updated:
            info.updated = finished
        info.counts[status] = info.counts.get(status, 0) + count
        if queued or status == "running":
            info.unfinished += count

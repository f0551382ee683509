"""The batch methods of SqlPersistence (``we0_batches``, ``we0_batch_items``).

Claiming is one statement: an UPDATE of the first claimable items (queued, claim expired)
that returns them — atomic on SQLite (one writer at a time), and on PostgreSQL the rows are
picked ``FOR UPDATE SKIP LOCKED``, so concurrent claimers neither get the same item nor
wait on each other. Ending, renewing and freeing a claim are conditional on its owner.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from ..batches import BatchInfo, BatchItem, ItemEnd, NewItem, check_same_prompts, fingerprint
from .lease import pid_alive
from .tables import cut
from .statements import END_COLUMNS

__all__ = ["open_batch", "claim", "renew", "end", "end_and_claim", "requeue", "free_dead", "items", "infos"]


def item_from_row(row: Any) -> BatchItem:
    (batch, item, sid, prompt, status, queued, owner, expires, attempts, started, finished, duration, text, output,
     error, steps, tool_calls, input_tokens, output_tokens) = row
    return BatchItem(batch=batch, item=item, session_id=sid, prompt=prompt, status=status, queued=bool(queued),
                     owner=owner, expires=expires, attempts=attempts, started=started, finished=finished,
                     duration=duration, text=text, output=output, error=error, steps=steps, tool_calls=tool_calls,
                     input_tokens=input_tokens, output_tokens=output_tokens)


async def open_batch(store: Any, name: str, new: Sequence[NewItem], session_ids_given: bool, now: float) -> BatchInfo:
    """Create the batch and its items in one transaction, or check the existing one."""
    fp = fingerprint(new)
    head = {"name": name, "created": now, "updated": now, "items": len(new), "fingerprint": fp}
    rows = [{"batch": name, "item": i, "session_id": it.session_id, "prompt": it.prompt, "status": "pending",
             "queued": True, "owner": None, "host": None, "pid": None, "expires": 0.0, "attempts": 0,
             "started": None, "finished": None, "duration": 0.0, "text": None, "output": None, "error": None,
             "steps": 0, "tool_calls": 0, "input_tokens": 0, "output_tokens": 0} for i, it in enumerate(new)]
    ops = [("batch_item_insert", rows)] if rows else []
    created = await store._db.transaction(ops, ("batch_insert", head))
    if not created:
        got = await store._db.fetchall("batch_get", {"b": name})
        _, _, _, n, stored_fp = got[0]
        if stored_fp != fp or n != len(new) or session_ids_given:
            stored = await store._db.fetchall("batch_prompts", {"b": name})
            check_same_prompts(name, [(p, s) for p, s in stored], new, session_ids_given)
    return (await infos(store, name))[0]


async def claim(store: Any, name: str, owner: str, n: int, now: float, expires: float) -> list[BatchItem]:
    return _claimed(await store._db.fetchall("batch_claim", _claim_params(store, name, owner, n, now, expires)))


def _claim_params(store: Any, name: str, owner: str, n: int, now: float, expires: float) -> dict[str, Any]:
    host, pid = owner_process(owner, store._host)
    return {"b": name, "owner": owner[:256], "host": host, "pid": pid, "n": n, "now": now, "expires": expires}


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


async def renew(store: Any, name: str, owner: str, expires: float) -> int:
    return await store._db.execute("batch_renew", {"b": name, "holder": owner[:256], "expires": expires})


async def end(store: Any, name: str, item: int, owner: str, e: ItemEnd) -> bool:
    return await store._db.execute("batch_end", _end_params(name, item, owner, e)) == 1


def _end_params(name: str, item: int, owner: str, e: ItemEnd) -> dict[str, Any]:
    params = {k: getattr(e, k) for k in END_COLUMNS if k != "expires"}
    for k in ("text", "output", "error"):  # flattened text columns: NUL-safe (see tables.cut)
        params[k] = cut(params[k])
    params.update(b=name, item=item, holder=owner[:256], run_time=e.run_time, expires=e.not_before)
    return params


async def end_and_claim(store: Any, name: str, item: int, owner: str, e: ItemEnd, n: int, now: float,
                        expires: float) -> tuple[bool, list[BatchItem]]:
    """An end and a claim of up to ``n`` items: on SQLite in one transaction (one commit, not two),
    on PostgreSQL sent at once (one round trip; a worker's claims of one moment are merged there)."""
    end_params, claim_params = _end_params(name, item, owner, e), _claim_params(store, name, owner, n, now, expires)
    if store._inline is not None:
        ended, rows = await store._inline.statements([("batch_end", end_params, False),
                                                      ("batch_claim", claim_params, True)])
    else:
        ended, rows = await store._both(store._db.execute("batch_end", end_params),
                                        store._db.fetchall("batch_claim", claim_params))
    return ended == 1, _claimed(rows)


async def requeue(store: Any, name: str, which: Sequence[int]) -> int:
    rows = [{"b": name, "item": i} for i in which]
    if not rows:
        return 0
    n = 0
    for row in rows:  # (a row count per item: executemany reports none reliably)
        n += await store._db.execute("batch_requeue", row)
    return n


async def free_dead(store: Any, name: str, live: Sequence[str]) -> int:
    me, mine = store._host, os.getpid()
    n = 0
    for owner, host, pid in await store._db.fetchall("batch_owners", {"b": name}):
        if host != me or pid is None:
            continue  # another machine: only the expiry can tell
        gone = owner not in live if pid == mine else not pid_alive(int(pid))
        if gone:
            n += await store._db.execute("batch_free", {"b": name, "holder": owner})
    return n


async def items(store: Any, name: str) -> list[BatchItem]:
    return [item_from_row(r) for r in await store._db.fetchall("batch_items", {"b": name})]


async def infos(store: Any, name: Optional[str] = None) -> list[BatchInfo]:
    if name is None:
        heads = await store._db.fetchall("batch_list", {})
        counts = await store._db.fetchall("batch_counts_all", {})
    else:
        heads = await store._db.fetchall("batch_get", {"b": name})
        counts = await store._db.fetchall("batch_counts", {"b": name}) if heads else []
    out = {h[0]: BatchInfo(name=h[0], created=h[1], updated=h[2], items=h[3], fingerprint=h[4]) for h in heads}
    _add_counts(out, counts)
    return list(out.values())


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

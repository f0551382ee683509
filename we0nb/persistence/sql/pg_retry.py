"""A statement whose answer was lost: what it did, read back instead of guessed (PostgreSQL).

Why: a connection that drops after the server committed a statement but before its answer
arrived leaves the outcome unknown. The group commit (:mod:`.pg_group`) then tries each of its
entries again on its own. Most may simply be sent again — a run's commit (upserts under its
lease), a renewal, a release, a read: twice is once. Two may not: a claim sent again claims
*other* items, and the worker never learns of the first ones (their heartbeat kept them
``running`` for ever: a batch that never ended); an item's end sent again finds its claim
already ended and reports it taken over. So these two are never sent twice while their outcome
is unknown; what they did is read back:

* a claim carries a token its claimer chose (``we0_batch_items.claim``): its rows are those
  the claimer holds with that token — none when it did not commit;
* an end is known by what it writes: the item still ``running`` under its owner means it did
  not commit (it is sent now), the item with the end's status, time and attempts means it did.

The batch queue (:class:`~.batches.SqlBatchQueue`) reads them back the same way when an error that
leaves the outcome unknown reaches it (SQLAlchemy's asyncio engine on PostgreSQL, or a read back
that failed itself).
"""

from __future__ import annotations

import sys
from typing import Any, Awaitable, Callable

from . import statements as q
from .driver import Params
from .statements import Stmt

__all__ = ["ONCE", "outcome_unknown", "resolve"]

#: a statement's rows, or its row count (a driver's ``fetchall``/``execute``)
Send = Callable[[Stmt, Params], Awaitable[Any]]

#: the statements never sent twice when their outcome is unknown (their outcome is read instead)
ONCE = frozenset({q.BATCH_CLAIM, q.BATCH_END})


def outcome_unknown(exc: BaseException) -> bool:
    """Whether ``exc`` leaves it unknown what the server did: the connection failed (no SQLSTATE,
    or an ``08``/``57P`` one: the link or the server process went away). An error the server
    answered with rolled its transaction back (nothing was written); an error raised before
    anything was sent wrote nothing either."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return False
    seen: set[int] = set()
    e: Any = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, psycopg.Error):
            state = getattr(e, "sqlstate", None)
            return state is None or state.startswith(("08", "57P"))
        e = e.__cause__ or e.__context__
    return False


async def resolve(fetchall: Send, execute: Send, stmt: Stmt, params: Params) -> Any:
    """What ``stmt`` (one of :data:`ONCE`) did, as its own answer would have said: a claim's
    rows, an end's row count (read through ``fetchall``; an end that did not commit is sent now
    through ``execute``)."""
    if stmt is q.BATCH_CLAIM:
        return await fetchall(q.BATCH_MINE, {"b": params["b"], "holder": params["owner"], "token": params["token"]})
    state = await fetchall(q.BATCH_STATE, {"b": params["b"], "item": params["item"]})
    if not state:
        return 0
    status, queued, owner, finished, attempts = state[0]
    if owner == params["holder"] and status == "running":  # it did not commit: send it now
        return await execute(stmt, params)
    ours = (owner is None and status == params["status"] and bool(queued) == bool(params["queued"])
            and finished == params["finished"] and attempts == params["attempts"])
    return int(ours)

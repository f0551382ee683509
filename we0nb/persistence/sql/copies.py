"""Copies on SQL (:class:`~we0nb.persistence.copies.CopyStore`): the index, and the copy's statements.

The index is two light reads (ids, roles, times, statuses; whether each row is copyable and a
call keyed, decided in the database: see :mod:`.copy_sql`). The copy is two ``INSERT … SELECT``
statements, one for the parts and one for the messages, that read the source rows and write the
renamed ones without their documents ever leaving the database; the renames go in as one JSON
parameter each.
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

import pydantic_core

from ...messages import MessageWithParts
from ..copies import IndexedMessage, IndexedPart, Rename, SessionIndex
from . import statements as q
from .driver import Driver, Op, Params
from .records import build_messages, session_from_row
from .statements import Stmt

__all__ = ["SqlCopies"]


def _json_text(value: str) -> str:
    """``value`` as a JSON string, exactly as pydantic writes it in a document."""
    return pydantic_core.to_json(value).decode()


class SqlCopies:
    """The copy capability of one database, through its driver."""

    def __init__(self, db: Driver, where: str) -> None:
        self.db, self.where = db, where

    async def session_index(self, session_id: str, upto: Optional[str] = None) -> Optional[SessionIndex]:
        params: Params = {"sid": session_id, "src": _json_text(session_id), "upto": upto}
        queries: list[tuple[Stmt, Params]]
        if upto is None:
            queries = [(q.GET_SESSION, {"sid": session_id}), (q.COPY_MESSAGE_INDEX, params),
                       (q.COPY_PART_INDEX, params)]
        else:
            queries = [(q.GET_SESSION, {"sid": session_id}), (q.COPY_MESSAGE_INDEX_UPTO, params),
                       (q.COPY_PART_INDEX_UPTO, params)]
        rows = self.db.read_now(queries)
        if rows is None:  # (not SQLite inline, or the database is locked: sent together)
            rows = await self.db.run([(k, p, True) for k, p in queries])
        srows, mrows, prows = rows
        if not srows:
            return None
        session = session_from_row(srows[0][0], srows[0][1], self.where)
        parts: dict[str, list[IndexedPart]] = {}
        for pid, mid, ptype, status, copyable, keyed in prows:
            own = parts.get(mid)
            if own is None:
                own = parts[mid] = []
            own.append(IndexedPart(pid, ptype, status, bool(copyable), bool(keyed)))
        return SessionIndex(session, [IndexedMessage(mid, role, float(created), bool(done), parent, bool(copyable),
                                                     tuple(parts.get(mid, ())))
                                      for mid, role, created, done, parent, copyable in mrows])

    async def load_messages(self, session_id: str, message_ids: Sequence[str]) -> list[MessageWithParts]:
        if not message_ids:
            return []
        params = {"sid": session_id, "mid": min(message_ids)}
        mrows, prows = await self.db.run([(q.LOAD_MESSAGES_FROM, params, True), (q.LOAD_PARTS_FROM, params, True)])
        wanted = set(message_ids)
        return build_messages(session_id, [r for r in mrows if r[0] in wanted], [r for r in prows if r[1] in wanted],
                              self.where)

    def copy_ops(self, source: str, target: str, messages: Sequence[Rename], parts: Sequence[Rename]) -> list[Op]:
        """The two statements of a copy: the parts first (a part written after its message would
        drop the message's model view: a trigger), then the messages."""
        base: Params = {"sid": source, "src": _json_text(source), "dst": target, "dstj": _json_text(target)}
        ops: list[Op] = []
        for stmt, renames in ((q.COPY_PARTS, parts), (q.COPY_MESSAGES, messages)):
            if renames:
                ops.append((stmt, {**base, "rows": json.dumps(renames)}))  # (tuples: JSON arrays)
        return ops

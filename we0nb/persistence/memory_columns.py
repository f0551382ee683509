"""The column reads of a store that keeps its records in this process (:class:`~we0nb.MemoryPersistence`).

:class:`TranscriptColumns` builds the columns of :mod:`.columns` from transcripts: the flattened
ones with the functions the SQL tables are written with (:mod:`.sql.tables`: NUL → U+FFFD,
lengths cut), the values only a record's JSON holds whole — so a history gives the same columns
here as from SQL. Reads are synchronous: the records are in memory.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Optional, Sequence

import pydantic_core

from ..messages import MessageWithParts, Part, Transcript, in_doubt_of
from .batches import BatchInfo, BatchItem
from .columns import MESSAGE_NAMES, PART_NAMES, SESSION_NAMES, TOOL_CALL_NAMES, ColumnReader, Convert, Fetched

__all__ = ["TranscriptColumns"]

_TEXT_TYPES = ("text", "reasoning")


class TranscriptColumns(ColumnReader):
    """A :class:`~.columns.ColumnReader` over transcripts held in this process.

    ``transcripts``: every session's transcript; ``batches``/``items``: the batch records."""

    def __init__(self, where: str, transcripts: Callable[[], list[Transcript]],
                 batches: Callable[[], list[BatchInfo]], items: Callable[[str], list[BatchItem]]):
        self.where = where
        self._transcripts, self._batches, self._items = transcripts, batches, items

    def batches(self) -> list[BatchInfo]:
        return self._batches()

    def batch_items(self, name: str) -> list[BatchItem]:
        return self._items(name)

    def sessions(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        rows = []
        for tr in self._selected(ids):
            s = tr.session
            if s is not None and _in_window(s.time.created, since, until):
                revert = s.revert.message_id if s.revert is not None else None
                rows.append((s.id, s.time.created, s.time.updated, len(tr.messages), revert, s.title,
                             s.forked_from, s.forked_at))
        return _fetched(SESSION_NAMES, rows, convert)

    def messages(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        from .sql.tables import message_columns

        rows = []
        for sid, m in self._messages(ids, since, until):
            info = m.info
            cols = message_columns(info)
            cols["session_id"], cols["message_id"] = sid, info.id
            cols["error_message"] = info.error.message if info.error is not None else None  # whole, as ``data`` keeps it
            cols["cost"] = getattr(info, "cost", None)  # (in the document: the SQL reader extracts it from ``data``)
            rows.append(tuple(cols[n] for n in MESSAGE_NAMES))
        return _fetched(MESSAGE_NAMES, rows, convert)

    def parts(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
              until: Optional[int] = None, convert: Optional[Convert] = None, *, tools_only: bool = False) -> Fetched:
        names = TOOL_CALL_NAMES if tools_only else PART_NAMES
        rows = []
        for sid, m in self._messages(ids, since, until):
            for part in m.parts:
                if tools_only and part.type != "tool":
                    continue
                row = _part_row(sid, part, tools_only)
                rows.append(tuple(row[n] for n in names))
        return _fetched(names, rows, convert)

    def message_costs(self, ids: Optional[Sequence[str]] = None) -> Fetched:
        """session_id, role and cost of every message of the sessions: what a session's cost is summed from."""
        rows = [(sid, m.info.role, getattr(m.info, "cost", None)) for sid, m in self._messages(ids, None, None)]
        return _fetched(("session_id", "role", "cost"), rows, None)

    def _selected(self, ids: Optional[Sequence[str]]) -> list[Transcript]:
        got = self._transcripts()
        if ids is None:
            return got
        wanted = set(ids)
        return [tr for tr in got if tr.session is not None and tr.session.id in wanted]

    def _messages(self, ids: Optional[Sequence[str]], since: Optional[int],
                  until: Optional[int]) -> Iterator[tuple[str, MessageWithParts]]:
        for tr in self._selected(ids):
            if tr.session is None:
                continue
            for m in tr.messages:
                if _in_window(m.info.time.created, since, until):
                    yield tr.session.id, m


def _part_row(sid: str, part: Part, tools_only: bool) -> dict[str, Any]:
    """A part's columns: the flattened ones (as stored in SQL) and, for tool calls, the document's."""
    from .sql.tables import part_columns

    cols = part_columns(part)
    row: dict[str, Any] = {"session_id": sid, "message_id": part.message_id, "part_id": part.id, "type": part.type,
                           "tool": cols["tool"], "status": cols["status"], "start": cols["time_start"],
                           "end": cols["time_end"], "text": None}
    if part.type in _TEXT_TYPES:
        row["text"] = part.text  # type: ignore[union-attr]
    elif part.type == "compaction":
        row["text"] = part.summary  # type: ignore[union-attr]
    if tools_only and part.type == "tool":
        st = part.state  # type: ignore[union-attr]
        meta = getattr(st, "metadata", None)
        row.update(call_id=cols["call_id"], interrupted=cols["interrupted"],
                   interrupt_reason=cols["interrupt_reason"], recalled=cols["recalled"], input=_dump(st.input),
                   output=getattr(st, "output", None), error=getattr(st, "error", None),
                   metadata=_dump(meta) if meta is not None else None)
        row.update(_approval(part))
        # the exactly-once facts, read as ToolPart reads them (in doubt: of a call flagged interrupted)
        row.update(idempotency_key=part.idempotency_key, attempts=part.attempts,  # type: ignore[union-attr]
                   in_doubt=in_doubt_of(cols["interrupted"], (meta or {}).get("in_doubt")),
                   reconciled=part.reconciled,  # type: ignore[union-attr]
                   attachments=len(getattr(st, "attachments", None) or ()))
    return row


def _approval(part: Any) -> dict[str, Any]:
    """A tool call's approval columns, as the SQL reader reads them off its document."""
    approval, detail = part.approval, part.approval_detail
    if detail is None:
        return {"approval": approval, "approval_reason": None, "approved_input": None, "decided": None}
    reason = None if approval is None else detail.reason if approval == "denied" else detail.why
    return {"approval": approval, "approval_reason": reason,
            "approved_input": _dump(detail.input) if detail.input is not None else None, "decided": detail.decided}


def _dump(obj: Any) -> str:
    return pydantic_core.to_json(obj).decode()


def _in_window(t: Optional[float], since: Optional[int], until: Optional[int]) -> bool:
    """Whether time ``t``, in whole microseconds as the frames show it, is in ``[since, until)``."""
    if since is None and until is None:
        return True
    if t is None:
        return False
    us = math.floor(t * 1e6 + 0.5)
    return (since is None or us >= since) and (until is None or us < until)


def _fetched(names: Sequence[str], rows: list[tuple[Any, ...]], convert: Optional[Convert]) -> Fetched:
    chunk = dict(zip(names, zip(*rows))) if rows else {n: () for n in names}
    return Fetched(list(names), [convert(chunk) if convert is not None else chunk])

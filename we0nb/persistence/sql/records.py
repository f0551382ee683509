"""Rows back into objects: sessions, and messages with their parts.

The fast path validates one JSON document per message (its ``data`` and its parts'
``data`` joined); a row that does not parse, validate or match its columns sends that
message down the slow path, row by row, which names the bad record in a
:class:`~we0nb.CorruptRecordError` (other sessions still load).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator, Optional

from pydantic import TypeAdapter, ValidationError

from ...errors import CorruptRecordError
from ...messages import Message, MessageWithParts, Part, Session, assembled

__all__ = ["session_from_row", "build_messages", "gc_paused"]

_SESSION: TypeAdapter[Session] = TypeAdapter(Session)
_MESSAGE: TypeAdapter[Any] = TypeAdapter(Message)
_PART: TypeAdapter[Any] = TypeAdapter(Part)
_MWP_VALIDATE = MessageWithParts.model_validate_json


def session_from_row(sid: str, data: str, where: str) -> Session:
    try:
        s = _SESSION.validate_json(data)
    except ValidationError as e:
        raise CorruptRecordError(
            f"Corrupt session record {sid!r} in {where}: its JSON does not parse or validate "
            f"({e.error_count()} error(s): {e.errors()[0]['msg']}). Fix or delete the row in we0_sessions."
        ) from e
    if s.id != sid:
        raise CorruptRecordError(f"Corrupt session record {sid!r} in {where}: its JSON says id {s.id!r}.")
    return s


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while thousands of lasting, acyclic objects are made (rows, messages):
    it would rescan them again and again as they are created (about half the load time)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def build_messages(sid: str, mrows: list[Any], prows: list[Any], where: str) -> list[MessageWithParts]:
    """``mrows`` (id, data) and ``prows`` (id, message_id, data), both in order, as objects."""
    with gc_paused():
        return _build_fast(sid, mrows, prows, where)


def _build_fast(sid: str, mrows: list[Any], prows: list[Any], where: str) -> list[MessageWithParts]:
    by_msg: dict[str, list[Any]] = {}
    for row in prows:
        lst = by_msg.get(row[1])
        if lst is None:
            by_msg[row[1]] = [row]
        else:
            lst.append(row)
    # one JSON document and one validation call per message: the fast path for a healthy
    # transcript (several times faster than one call over one huge document)
    validate = _MWP_VALIDATE
    out = []
    empty: list[Any] = []
    for mid, data in mrows:
        plist = by_msg.get(mid) or empty
        try:
            m = validate('{"info":' + data + ',"parts":[' + ",".join([r[2] for r in plist]) + "]}")
        except ValidationError:
            m = None
        if m is None or m.info.id != mid or m.info.session_id != sid or len(m.parts) != len(plist) or any(
                p.id != r[0] or p.session_id != sid or p.message_id != mid for p, r in zip(m.parts, plist)):
            # a row does not parse, validate or match its columns: find and name it
            m = _build_slow(sid, mid, data, plist, where)
        out.append(m)
    return out


def _build_slow(sid: str, mid: str, data: str, plist: list[Any], where: str) -> MessageWithParts:
    """Row by row, to name the bad record."""
    try:
        info = _MESSAGE.validate_json(data)
    except ValidationError as e:
        raise CorruptRecordError(_corrupt(where, sid, mid, None, e)) from e
    if info.id != mid or info.session_id != sid:
        raise CorruptRecordError(_corrupt(where, sid, mid, None, None,
                                          f"its JSON says message {info.id!r} of session {info.session_id!r}"))
    parts = []
    for pid, _, pdata in plist:
        try:
            part = _PART.validate_json(pdata)
        except ValidationError as e:
            raise CorruptRecordError(_corrupt(where, sid, mid, pid, e)) from e
        if part.id != pid or part.message_id != mid or part.session_id != sid:
            raise CorruptRecordError(_corrupt(where, sid, mid, pid, None,
                                              f"its JSON says part {part.id!r} of message {part.message_id!r}"))
        parts.append(part)
    return assembled(MessageWithParts, info=info, parts=parts)


def _corrupt(where: str, sid: str, mid: str, pid: Optional[str], e: Optional[ValidationError],
             detail: Optional[str] = None) -> str:
    what = f"part {pid!r} of message {mid!r}" if pid else f"message {mid!r}"
    table = "we0_parts" if pid else "we0_messages"
    if detail is None and e is not None:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "(document)"
        detail = f"its JSON does not parse or validate: {first['msg']} at {loc}"
    return (f"Corrupt record in session {sid!r}: {what} in {where} — {detail}. "
            f"Other sessions still load; fix or delete the row (id {pid or mid!r}) in {table}.")

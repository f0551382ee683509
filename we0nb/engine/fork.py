"""Fork: a session's history up to a message, copied into a new session, executing nothing.

A fork is where a what-if starts: the copy holds the source's visible messages (a revert is
respected) up to and including ``at``, with their parts, under new ids in the same order. The
source is not changed. The copy is closed as prompt mode would close it, but nothing is asked
of the outside world (no reconcile, no tool, no model): every unfinished call ends interrupted
with reason ``"fork"`` (:func:`~we0nb.engine.recovery.decide` with ``situation="fork"``;
``in_doubt`` when it was running in the source), and an unfinished assistant message gets its
completion time. Copied calls keep their states and their idempotency keys (the record of what
ran in the source, under that key); a call the fork makes later is a part of the fork's session,
so its key (:func:`~we0nb._ids.call_key`) differs from every call of the source.

Everything goes through :class:`~we0nb.persistence.base.SessionStore` (one ``commit``, the new
session's row first), under the new session's lease: any store that passes the conformance suite
can be forked, and a fork of a session that is running copies what is persisted at that instant.
"""

from __future__ import annotations

from typing import Any, Optional

from .._ids import new_id, new_ids, now
from ..messages import (UNFINISHED_MESSAGE, UNFINISHED_REASON, AssistantMessage, MessageError, MessageTime,
                        MessageWithParts, Part, Session, SessionTime, ToolPart, snapshot)
from ..models.view import dump_view
from ..persistence.base import Persistence, Write
from .executor import interrupted, key_of
from .history import convert
from .recovery import plan_recovery
from .request import check_session_id
from .revert import visible_messages

__all__ = ["fork_session"]


async def fork_session(persistence: Persistence, session_id: str, *, at: Optional[str] = None,
                       new_session_id: Optional[str] = None) -> str:
    """Copy ``session_id`` up to message ``at`` (None: all of it) into a new session; its id.

    Raises ValueError, writing nothing, for an unknown session, an ``at`` that is not one of
    its visible messages, or a ``new_session_id`` that exists already.
    """
    check_session_id(session_id, "fork(session_id)")
    if at is not None and not isinstance(at, str):
        raise TypeError(f"fork(at=...): expected a message id (a string) or None, got {type(at).__name__}.")
    target = new_session_id if new_session_id is not None else new_id("ses")
    check_session_id(target, "fork(new_session_id=...)")
    if target == session_id:
        raise ValueError(f"fork(new_session_id=...): {target!r} is the session being forked; "
                         "pass a new id (or none: one is made).")
    source = await persistence.load_transcript(session_id)
    if source.session is None:
        raise ValueError(f"fork(): session {session_id!r} does not exist in this store.")
    copied = _upto(source.session, source.messages, session_id, at)
    lease = await persistence.acquire_lease(target, new_id("run"))
    try:
        if await persistence.get_session(target) is not None:
            raise ValueError(f"fork(new_session_id=...): session {target!r} exists already; pass a new id.")
        t = now()
        session = Session(id=target, title=source.session.title, time=SessionTime(created=t, updated=t),
                          forked_from=session_id, forked_at=at)
        writes = _copy(copied, target, persistence.keeps_views)
        await persistence.commit(writes, lease=lease, session=session)
        await persistence.flush()
    finally:
        await lease.release()
    return target


def _upto(session: Session, messages: list[MessageWithParts], session_id: str,
          at: Optional[str]) -> list[MessageWithParts]:
    """The visible messages up to and including ``at``."""
    visible = visible_messages(session, messages)
    if at is None:
        return visible
    for i, m in enumerate(visible):
        if m.info.id == at:
            return visible[:i + 1]
    if any(m.info.id == at for m in messages):
        raise ValueError(f"fork(at=...): message {at!r} of session {session_id!r} is hidden by a revert; "
                         "fork at a visible message (or unrevert the session first).")
    raise ValueError(f"fork(at=...): message {at!r} is not in session {session_id!r}; pass the id of one of "
                     "its messages (see agent.transcript(session_id)).")


def _copy(messages: list[MessageWithParts], target: str, views: bool) -> list[Write]:
    """The copy's writes: new ids in the same order, the last message closed as a fork closes it.

    Every part first (one write), then the messages with their model views: a store writes each
    kind in one go, and a part written after its message would drop the message's view."""
    names = iter(new_ids([k for m in messages for k in ("msg", *("prt",) * len(m.parts))]))
    renamed: dict[str, str] = {}
    infos: list[Write] = []
    parts: list[Part] = []
    for m in messages:
        closed = _closed(m) if m.info.role == "assistant" else m
        mid = next(names)
        renamed[m.info.id] = mid
        update: dict[str, Any] = {"id": mid, "session_id": target}
        parent = getattr(closed.info, "parent_id", None)
        if parent is not None:
            update["parent_id"] = renamed.get(parent, parent)
        info = _with(closed.info, update)
        own: list[Part] = [_with(_keyed(p), {"id": next(names), "session_id": target, "message_id": mid})
                           for p in closed.parts]
        parts.extend(own)
        view = dump_view(convert(MessageWithParts.model_construct(info=info, parts=own))) if views else None
        infos.append((info, (), view))
    return [(None, parts, None), *infos] if parts else infos


def _with(m: Any, fields: dict[str, Any]) -> Any:
    """A shallow copy of the model ``m`` with ``fields`` replaced (ids and a session: values
    already valid, so no validation — ``model_copy`` costs ten times more)."""
    c = snapshot(m)
    c.__dict__.update(fields)
    return c


def _closed(m: MessageWithParts) -> MessageWithParts:
    """``m`` as a fork leaves it: unfinished calls interrupted ("fork"), the message completed.

    Keys are fixed first (:func:`key_of`, from the source's ids): a copied call keeps the key it
    had in the source."""
    info = m.info
    assert isinstance(info, AssistantMessage)
    plan = plan_recovery(info, m.parts, {}, "fork")
    if not plan.needed:
        return m
    actions = {a.part_id: a for a in plan.tool_actions}
    parts: list[Part] = []
    for p in m.parts:
        a = actions.get(p.id)
        if isinstance(p, ToolPart) and a is not None and a.action == "interrupt":
            p = p.model_copy(update={"state": interrupted(p, a)})
        parts.append(p)
    if plan.close_message:
        error = info.error or MessageError(reason=UNFINISHED_REASON, message=UNFINISHED_MESSAGE,
                                           metadata={"recovered": True, "mode": "fork"})
        info = info.model_copy(update={"time": MessageTime(created=info.time.created, completed=now()),
                                       "error": error})
    return MessageWithParts.model_construct(info=info, parts=parts)


def _keyed(p: Part) -> Part:
    """A copied call with its source key written in (a call stored before keys were written
    would otherwise derive its key from the fork's ids)."""
    if not isinstance(p, ToolPart) or "idempotency_key" in p.state.metadata:
        return p
    state = p.state.model_copy(update={"metadata": {**p.state.metadata, "idempotency_key": key_of(p)}})
    return p.model_copy(update={"state": state})

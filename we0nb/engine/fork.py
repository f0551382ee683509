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
A store with :class:`~we0nb.persistence.copies.CopyStore` (SQL) is read through a light index
instead, and copies the messages that change only their ids itself (in the database, documents
never loaded); the engine still decides everything and writes the others (an unfinished message,
a call without its key) as objects, in the same transaction.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .._ids import new_id, new_ids, now
from ..errors import CorruptRecordError, PersistenceError
from ..messages import (UNFINISHED_MESSAGE, UNFINISHED_REASON, AssistantMessage, MessageError, MessageTime,
                        MessageWithParts, Part, Session, SessionTime, ToolPart, assembled, snapshot)
from ..models.view import dump_view
from ..persistence.base import Lease, MessageInfo, Persistence, Write
from ..persistence.copies import CopyStore, IndexedMessage, Rename
from .executor import interrupted, key_of
from .history import convert
from .recovery import plan_recovery
from .request import check_session_id
from .revert import hides, visible_messages

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
    copier = persistence if isinstance(persistence, CopyStore) else None
    kept: list[IndexedMessage] = []
    copied: list[MessageWithParts] = []
    if copier is not None:
        try:
            index = await copier.session_index(session_id, at)  # (the messages after ``at`` are not read)
        except PersistenceError as e:
            raise await _named(persistence, session_id, e) from e
        source_session = index.session if index is not None else None
        if index is not None:
            rev = index.session.revert
            visible = [m for m in index.messages if not hides(rev, m.id, m.created)]
            kept = visible[:_count([m.id for m in visible], [m.id for m in index.messages], session_id, at)]
    else:
        source = await persistence.load_transcript(session_id)
        source_session = source.session
        if source_session is not None:
            visible_objects = visible_messages(source_session, source.messages)
            copied = visible_objects[:_count([m.info.id for m in visible_objects],
                                             [m.info.id for m in source.messages], session_id, at)]
    if source_session is None:
        raise ValueError(f"fork(): session {session_id!r} does not exist in this store.")
    lease, existing = await persistence.lease_and_session(target, new_id("run"))
    try:
        if existing is not None:
            raise ValueError(f"fork(new_session_id=...): session {target!r} exists already; pass a new id.")
        t = now()
        session = Session(id=target, title=source_session.title, time=SessionTime(created=t, updated=t),
                          forked_from=session_id, forked_at=at)
        if copier is not None:
            try:
                await _copy_in_store(copier, session_id, kept, session, lease, persistence.keeps_views)
            except PersistenceError as e:
                raise await _named(persistence, session_id, e) from e
        else:
            await persistence.commit(_copy(copied, target, persistence.keeps_views), lease=lease, session=session)
        await persistence.flush()
    finally:
        await lease.release()
    return target


async def _named(persistence: Persistence, session_id: str, error: PersistenceError) -> PersistenceError:
    """A store error of the copy in the store, said as a corrupt record of the source when it is one:
    the database cannot read a row's JSON and says only that; loading the session names the row."""
    if isinstance(error, CorruptRecordError):
        return error
    try:
        await persistence.load_transcript(session_id)
    except CorruptRecordError as corrupt:
        return corrupt
    except Exception:  # (the store is failing otherwise: the copy's own error says it)
        return error
    return error


def _count(visible: list[str], every: list[str], session_id: str, at: Optional[str]) -> int:
    """How many of the ``visible`` messages (ids, in order) the copy takes: up to and including ``at``."""
    if at is None:
        return len(visible)
    for i, mid in enumerate(visible):
        if mid == at:
            return i + 1
    if at in every:
        raise ValueError(f"fork(at=...): message {at!r} of session {session_id!r} is hidden by a revert; "
                         "fork at a visible message (or unrevert the session first).")
    raise ValueError(f"fork(at=...): message {at!r} is not in session {session_id!r}; pass the id of one of "
                     "its messages (see agent.transcript(session_id)).")


def _as_object(m: IndexedMessage) -> bool:
    """Whether the copy changes message ``m`` beyond its ids, so it is loaded and written as an
    object: it is unfinished (:func:`~we0nb.messages.is_unfinished`'s two signals: a fork closes
    it), a call of it has no key written (:func:`_keyed`), or the store cannot copy a row of it."""
    if not m.copyable:
        return True
    assistant = m.role == "assistant"
    if assistant and not m.completed:
        return True
    return any(not p.copyable or not p.keyed or (assistant and p.status in ("pending", "running"))
               for p in m.parts)


async def _copy_in_store(store: CopyStore, source: str, kept: list[IndexedMessage], session: Session,
                         lease: Lease, views: bool) -> None:
    """The copy through :class:`~we0nb.persistence.copies.CopyStore`: the messages that change only
    their ids copied in the store; the others (:func:`_as_object`) loaded, closed and written as
    :func:`_copy` writes them; new ids in the same order; one transaction."""
    as_object = [_as_object(m) for m in kept]
    objects = [m.id for m, o in zip(kept, as_object) if o]
    loaded = {m.info.id: m for m in await store.load_messages(source, objects)} if objects else {}
    # (a message loaded as an object that is gone meanwhile is not copied)
    order = [(m, loaded.get(m.id)) for m, o in zip(kept, as_object) if not o or m.id in loaded]
    names = iter(new_ids([k for m, obj in order
                          for k in ("msg", *("prt",) * len(obj.parts if obj is not None else m.parts))]))
    renamed: dict[str, str] = {}
    messages: list[Rename] = []
    parts: list[Rename] = []
    writes: list[Write] = []
    for m, obj in order:
        mid = renamed[m.id] = next(names)
        if obj is None:
            messages.append((m.id, mid, None if m.parent_id is None else renamed.get(m.parent_id, m.parent_id)))
            parts.extend((p.id, next(names), mid) for p in m.parts)
        else:
            writes.append(_copy_message(obj, mid, names, session.id, renamed, views))
    await store.copy_rows(source, session.id, messages, parts, writes, session=session, lease=lease)


def _copy(messages: list[MessageWithParts], target: str, views: bool) -> list[Write]:
    """The copy's writes: new ids in the same order, the last message closed as a fork closes it.

    Every part first (one write), then the messages with their model views: a store writes each
    kind in one go, and a part written after its message would drop the message's view."""
    names = iter(new_ids([k for m in messages for k in ("msg", *("prt",) * len(m.parts))]))
    renamed: dict[str, str] = {}
    infos: list[Write] = []
    parts: list[Part] = []
    for m in messages:
        info, own, view = _copy_message(m, next(names), names, target, renamed, views)
        parts.extend(own)
        infos.append((info, (), view))
    return [(None, parts, None), *infos] if parts else infos


def _copy_message(m: MessageWithParts, mid: str, names: Iterator[str], target: str, renamed: dict[str, str],
                  views: bool) -> tuple[MessageInfo, list[Part], Optional[str]]:
    """Message ``m`` as the copy writes it: id ``mid``, its parts' ids from ``names``, its parent
    renamed (``renamed``: the ids given so far, to which ``m``'s is added), closed as a fork closes
    it; with its model view when the store keeps ``views``."""
    closed = _closed(m) if m.info.role == "assistant" else m
    renamed[m.info.id] = mid
    update: dict[str, Any] = {"id": mid, "session_id": target}
    parent = getattr(closed.info, "parent_id", None)
    if parent is not None:
        update["parent_id"] = renamed.get(parent, parent)
    info = _with(closed.info, update)
    own: list[Part] = [_with(_keyed(p), {"id": next(names), "session_id": target, "message_id": mid})
                       for p in closed.parts]
    view = dump_view(convert(assembled(MessageWithParts, info=info, parts=own))) if views else None
    return info, own, view


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
    return assembled(MessageWithParts, info=info, parts=parts)


def _keyed(p: Part) -> Part:
    """A copied call with its source key written in (a call stored before keys were written
    would otherwise derive its key from the fork's ids)."""
    if not isinstance(p, ToolPart) or "idempotency_key" in p.state.metadata:
        return p
    state = p.state.model_copy(update={"metadata": {**p.state.metadata, "idempotency_key": key_of(p)}})
    return p.model_copy(update={"state": state})

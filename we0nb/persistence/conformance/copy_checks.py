"""Checks of :class:`~we0nb.persistence.copies.CopyStore`: a session's index, and rows copied renamed."""

from __future__ import annotations

from typing import Any

from ..._ids import new_id
from ...models.base import AssistantTurn, UserTurn
from ...models.view import dump_view, load_views
from .harness import Check, Harness, check, equal, expect, raises
from .history import assistant, session, user

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
copies = check(CHECKS, "sessions", "leases", "copies")


def _renamed(m: Any, **ids: Any) -> Any:
    return m.model_copy(update=ids)


@copies
async def a_session_index_lists_messages_and_parts_in_order(h: Harness) -> None:
    """``session_index`` gives the session and its messages in order with their parts in order (ids,
    roles, times, parents, statuses), every one copyable; ``upto`` stops at that message; an unknown
    session gives None."""
    p, sid = h.store, new_id("ses")
    u, ut = user(sid, 'a "quoted" ünïcode ✓ \\')
    a, parts = assistant(sid, u.id)
    await p.commit([(u, [ut], dump_view([UserTurn(ut.text)])), (a, parts, dump_view([AssistantTurn("ok", "", [])]))],
                   session=session(sid))
    q = h.fresh()
    index = await q.session_index(sid)
    expect(index is not None and index.session == session(sid), "session_index of a written session: its session")
    assert index is not None
    equal([(m.id, m.role, m.created, m.parent_id) for m in index.messages],
          [(u.id, "user", u.time.created, None), (a.id, "assistant", a.time.created, u.id)], "the indexed messages")
    equal([[(x.id, x.type, x.status) for x in m.parts] for m in index.messages],
          [[(ut.id, "text", None)], [(x.id, x.type, None) for x in parts]], "the indexed parts")
    expect(index.messages[1].completed and all(m.copyable and all(x.copyable and x.keyed for x in m.parts)
                                               for m in index.messages),
           "finished messages with their views, written by the store: completed, copyable, keyed")
    upto = await q.session_index(sid, u.id)
    equal([m.id for m in upto.messages] if upto else None, [u.id], "session_index(upto=the first message)")
    equal(await q.session_index(new_id("ses")), None, "session_index of a session never written")


@copies
async def copied_rows_are_the_source_renamed_with_their_views(h: Harness) -> None:
    """``copy_rows`` writes the session, then the source's rows under their new ids in the target
    (each part's message and each message's parent renamed, everything else kept, model views
    included: a later run starts from them), in one transaction; a rename of a row not in the
    source copies nothing; a new id that exists already fails the whole copy."""
    p, src, dst = h.store, new_id("ses"), new_id("ses")
    u, ut = user(src, 'a "quoted" ünïcode ✓ \\', created=3.0)
    a, parts = assistant(src, u.id, created=4.0)
    u2, ut2 = user(src, "next", created=6.0)
    views = [dump_view([UserTurn(ut.text)]), dump_view([AssistantTurn("ok", "", [])]), dump_view([UserTurn("next")])]
    await p.commit([(u, [ut], views[0]), (a, parts, views[1]), (u2, [ut2], views[2])], session=session(src))
    nu, na, nu2 = new_id("msg"), new_id("msg"), new_id("msg")
    new_parts = {x.id: new_id("prt") for x in [ut, *parts, ut2]}
    lease = await p.acquire_lease(dst, new_id("run"))
    try:
        await p.copy_rows(src, dst, [(u.id, nu, None), (a.id, na, nu), (u2.id, nu2, None), (new_id("msg"), new_id("msg"), None)],
                          [(ut.id, new_parts[ut.id], nu), *[(x.id, new_parts[x.id], na) for x in parts],
                           (ut2.id, new_parts[ut2.id], nu2)], [], session=session(dst), lease=lease)
    finally:
        await lease.release()
    q = h.fresh()
    tr = await q.load_transcript(dst)
    want = [(_renamed(u, id=nu, session_id=dst), [_renamed(ut, id=new_parts[ut.id], session_id=dst, message_id=nu)]),
            (_renamed(a, id=na, session_id=dst, parent_id=nu),
             [_renamed(x, id=new_parts[x.id], session_id=dst, message_id=na) for x in parts]),
            (_renamed(u2, id=nu2, session_id=dst), [_renamed(ut2, id=new_parts[ut2.id], session_id=dst, message_id=nu2)])]
    equal((tr.session, [(m.info, m.parts) for m in tr.messages]), (session(dst), want), "the copy, read back")
    recent = await q.load_recent(dst)
    equal(recent.earlier, load_views(views[:1]), "the copy's stored model views (what a run starts from)")
    equal((await q.load_transcript(src)).messages[0].info, u, "the source after the copy")
    other = new_id("ses")
    lease = await p.acquire_lease(other, new_id("run"))
    try:
        async with raises(Exception, "a copy whose new id exists already"):
            await p.copy_rows(src, other, [(u.id, new_id("msg"), None), (a.id, na, None)], [], [],
                              session=session(other), lease=lease)
    finally:
        await lease.release()
    equal(await q.get_session(other), None, "the session of a copy that failed")

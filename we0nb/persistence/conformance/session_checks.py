"""Checks of :class:`~we0nb.persistence.base.SessionStore`: sessions, commits, transcripts, recent history."""

from __future__ import annotations

import asyncio
from typing import Any

from ..._ids import new_id
from ...messages import SessionRevert, ToolStateCompleted, ToolStateRunning, ToolTime
from ...models.base import AssistantTurn, UserTurn
from ...models.view import dump_view, load_views
from ..base import recent_start
from .harness import Check, Harness, check, equal, expect, raises
from .history import NUL, assistant, nul_history, session, user, write

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
sessions = check(CHECKS, "sessions")


def _dump(tr: Any) -> Any:
    return tr.model_dump(mode="json")


@sessions
async def sessions_round_trip(h: Harness) -> None:
    """A session reads back as written; upserting replaces it; list_sessions gives every session by id."""
    p = h.store
    equal(await p.get_session(new_id("ses")), None, "get_session of a session never written")
    s1, s2 = session(new_id("ses"), "first"), session(new_id("ses"), "second")
    await p.upsert_session(s2)
    await p.upsert_session(s1)
    s1b = s1.model_copy(update={"title": "renamed", "revert": SessionRevert(message_id="msg_x", time=3.0)})
    await p.upsert_session(s1b)
    q = h.fresh()
    equal(await q.get_session(s1.id), s1b, "the session after an upsert replaced it")
    listed = [s for s in await q.list_sessions() if s.id in (s1.id, s2.id)]
    equal([s.id for s in listed], sorted([s1.id, s2.id]), "list_sessions, by id")
    equal(listed[[s.id for s in listed].index(s1.id)], s1b, "a listed session")


@sessions
async def a_forks_lineage_round_trips(h: Harness) -> None:
    """A fork's session (``agent.fork``) reads back with its ``forked_from`` and ``forked_at``, in
    ``get_session``, ``list_sessions`` and a transcript; a session written in one commit with its
    copied messages is whole."""
    sid = new_id("ses")
    forked = session(sid, "a fork").model_copy(update={"forked_from": "ses_source", "forked_at": "msg_source"})
    u = user(sid, "copied")
    await h.store.commit([(u[0], [u[1]], None)], session=forked)
    q = h.fresh()
    equal(await q.get_session(sid), forked, "a fork's session")
    equal([s for s in await q.list_sessions() if s.id == sid], [forked], "a fork's session, listed")
    tr = await q.load_transcript(sid)
    equal((tr.session, [m.info for m in tr.messages]), (forked, [u[0]]), "a fork's transcript")


@sessions
async def transcript_round_trips_exactly_in_creation_order(h: Harness) -> None:
    """Every kind of part and tool state reads back equal, messages and parts in creation order."""
    sid = new_id("ses")
    msgs, parts = await write(h.store, sid)
    tr = await h.fresh().load_transcript(sid)
    equal(tr.session, session(sid), "the transcript's session")
    equal([m.info for m in tr.messages], msgs, "the messages")
    equal(tr.messages[0].parts, parts[:1], "the user message's parts")
    equal(tr.messages[1].parts, parts[1:], "the assistant message's parts")


@sessions
async def a_missing_session_loads_empty(h: Harness) -> None:
    tr = await h.store.load_transcript(new_id("ses"))
    expect(tr.session is None and tr.messages == [], f"a missing session's transcript: {tr!r}")
    recent = await h.store.load_recent(new_id("ses"))
    expect(recent.session is None and recent.messages == [] and recent.earlier == [], "a missing session's recent history")


@sessions
async def upserts_replace_rows(h: Harness) -> None:
    """A part written again (pending → running → completed) and a message written again replace theirs."""
    p, sid = h.store, new_id("ses")
    msgs, parts = await write(p, sid)
    tp = parts[4]
    for state in (ToolStateRunning(input={"p": "x"}, time=ToolTime(start=20.0)),
                  ToolStateCompleted(input={"p": "x"}, output="done", time=ToolTime(start=20.0, end=21.0))):
        tp = tp.model_copy(update={"state": state})
        await p.commit([(None, [tp], None)])
    a = msgs[1].model_copy(update={"finish_reason": "stop"})
    await p.commit([(a, [], None)])
    tr = await h.fresh().load_transcript(sid)
    equal(tr.messages[1].info, a, "the message written again")
    equal([x for x in tr.messages[1].parts if x.id == tp.id], [tp], "the part written again")
    equal(len(tr.messages[1].parts), len(parts) - 1, "the number of parts")


@sessions
async def a_commit_writes_in_order_with_its_session_first(h: Harness) -> None:
    """Within one commit a later write of a row wins; ``session=`` is written in the same commit."""
    p, sid = h.store, new_id("ses")
    u, t = user(sid, "first")
    later = t.model_copy(update={"text": "second"})
    await p.commit([(u, [t], None), (None, [later], None)], session=session(sid, "s"))
    tr = await h.fresh().load_transcript(sid)
    equal(tr.session, session(sid, "s"), "the session written with the commit")
    equal(tr.messages[0].parts, [later], "a part written twice in one commit")


@sessions
async def messages_and_parts_load_in_id_order_whatever_order_they_were_written(h: Harness) -> None:
    """Ids sort in creation order (``we0nb._ids``), and that is the order a transcript gives —
    not the order rows were first written: the engine writes a call's parts as they are due
    (a later call's ``running`` before an earlier call's end), and a resume, the model's history
    and the frames read the calls in the order the model made them. Many messages, some written
    newest first, in several commits."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    made: list[tuple[Any, list[Any]]] = []
    parent = None
    for i in range(6):
        if i % 2 == 0:
            u, t = user(sid, f"q{i}", created=10.0 + i)
            made.append((u, [t]))
            parent = u.id
        else:
            made.append(assistant(sid, parent or "", f"a{i}", created=10.0 + i))
    for m, _ in reversed(made):  # (the newest message first)
        await p.commit([(m, [], None)])
    for m, parts in made:  # (each message's parts newest first, one commit each)
        for part in reversed(parts):
            await p.commit([(None, [part], None)])
    tr = await h.fresh().load_transcript(sid)
    equal([m.info.id for m in tr.messages], [m.id for m, _ in made], "the messages' order (their ids' order)")
    equal([[x.id for x in m.parts] for m in tr.messages], [[x.id for x in ps] for _, ps in made],
          "each message's parts' order (their ids' order)")
    recent = await h.fresh().load_recent(sid)
    equal([m.info.id for m in recent.messages], [m.id for m, _ in made][-len(recent.messages):],
          "load_recent's messages' order")


@sessions
async def a_commit_may_write_parts_before_their_message(h: Harness) -> None:
    """One commit is one transaction: its parts may come before their message in it (a fork writes
    every part first, then the messages with their model views, so that no part write resets a
    view). A store that checks references checks them at the commit's end."""
    p, sid = h.store, new_id("ses")
    u, t = user(sid, "q")
    a, parts = assistant(sid, u.id)
    await p.commit([(None, [t, *parts], None), (u, [], None), (a, [], None)], session=session(sid))
    tr = await h.fresh().load_transcript(sid)
    equal([(m.info.id, [x.id for x in m.parts]) for m in tr.messages], [(u.id, [t.id]), (a.id, [x.id for x in parts])],
          "a commit's parts written before their messages")


@sessions
async def a_cancelled_commit_writes_all_of_it_or_nothing(h: Harness) -> None:
    """A commit cancelled at any of its awaits (an abort, a task cancelled) leaves all of it or
    none of it — never a message without the parts it came with."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    # cancelled after 1, 2, 3 passes of the loop, then after a few milliseconds: at its awaits
    for after in (1, 2, 3, 0.003, 0.01, 0.03, 0.1):
        u, t = user(sid, f"q{after}")
        a, parts = assistant(sid, u.id, f"a{after}")
        task = asyncio.ensure_future(p.commit([(u, [t], None), (a, parts, None)]))
        if isinstance(after, int):
            for _ in range(after):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(after)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        tr = await h.fresh().load_transcript(sid)
        got = {m.info.id: [x.id for x in m.parts] for m in tr.messages}
        whole = got.get(u.id) == [t.id] and got.get(a.id) == [x.id for x in parts]
        expect(whole or (u.id not in got and a.id not in got),
               f"a commit cancelled after {after if isinstance(after, int) else f'{after} s'} "
               f"{'pass(es) of the loop ' if isinstance(after, int) else ''}left part of it: {got!r}")
        await p.delete_messages(sid, [u.id, a.id])


@sessions
async def a_commit_that_fails_writes_nothing(h: Harness) -> None:
    """A commit is one transaction: when one of its rows cannot be stored, none of it is."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    u, t = user(sid, "kept")
    await p.commit([(u, [t], None)])
    u2, t2 = user(sid, "never")
    bad = t2.model_construct(**{**dict(t2), "text": object()})  # (a value no store can serialize)
    async with raises(Exception, "a commit with a row that cannot be stored"):
        await p.commit([(u2, [t2.model_copy(update={"text": "partial"})], None), (None, [bad], None)])
    tr = await h.fresh().load_transcript(sid)
    equal([m.info.id for m in tr.messages], [u.id], "the messages after the failed commit")
    equal(tr.messages[0].parts, [t], "the parts after the failed commit")


@sessions
async def delete_messages_removes_them_and_their_parts(h: Harness) -> None:
    """Deleting messages (a revert cleared) removes them with their parts, in their session only."""
    p, s1, s2 = h.store, new_id("ses"), new_id("ses")
    m1, _ = await write(p, s1)
    m2, parts2 = await write(p, s2)
    await p.delete_messages(s1, [m1[1].id])
    await p.delete_messages(s1, [])
    q = h.fresh()
    equal([m.info.id for m in (await q.load_transcript(s1)).messages], [m1[0].id], "the messages left")
    tr2 = await q.load_transcript(s2)
    equal([m.info.id for m in tr2.messages], [m.id for m in m2], "another session's messages")
    equal(sum(len(m.parts) for m in tr2.messages), len(parts2), "another session's parts")
    await p.commit([(m1[1], [], None)])  # the message again, under its id: its old parts are gone for good
    equal([(m.info.id, m.parts) for m in (await q.load_transcript(s1)).messages][1:], [(m1[1].id, [])],
          "a deleted message written again")


@sessions
async def a_revert_point_round_trips_and_cleared_messages_go(h: Harness) -> None:
    """What revert reads: the session's revert point, then (cleared) the messages after it deleted."""
    p, sid = h.store, new_id("ses")
    msgs, _ = await write(p, sid)
    a, parts = assistant(sid, msgs[0].id, "later", created=30.0)
    await p.commit([(a, parts, None)])
    reverted = session(sid).model_copy(update={"revert": SessionRevert(message_id=msgs[1].id, time=40.0)})
    await p.upsert_session(reverted)
    q = h.fresh()
    equal((await q.load_transcript(sid)).session, reverted, "the session with its revert point")
    equal(len((await q.load_transcript(sid)).messages), 3, "messages after the revert point are still stored")
    await p.delete_messages(sid, [msgs[1].id, a.id])
    await p.upsert_session(session(sid))
    tr = await q.load_transcript(sid)
    equal((tr.session.revert if tr.session else "missing", [m.info.id for m in tr.messages]), (None, [msgs[0].id]),
          "the session once the revert was cleared")


@sessions
async def recent_history_is_the_transcripts_tail_and_the_views_before_it(h: Harness) -> None:
    """load_recent: the recent messages as objects, equal to the transcript's tail, and before them
    the stored model views (stores that keep views), from the latest summary on; a part written
    again drops its message's view."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    views: list[Any] = []
    t = 10.0
    for turn in range(3):
        u, ut = user(sid, f"q{turn}", created=t)
        a, parts = assistant(sid, u.id, f"a{turn}", created=t + 1, summary=turn == 1)
        await p.commit([(u, [ut], None)])
        final = [(u, [ut]), (a, parts)]
        for m, ps in final:
            view = dump_view(_model_view(m, ps)) if p.keeps_views else None
            await p.commit([(m, ps, view)])
            views.append(view)
        t += 10
    u, ut = user(sid, "now", created=t)
    await p.commit([(u, [ut], None)])
    views.append(None)
    await _check_recent(h, sid, views)
    tr = await p.load_transcript(sid)
    await p.commit([(None, [tr.messages[3].parts[-1]], None)])  # a part of a viewed message, again
    views[3] = None
    await _check_recent(h, sid, views)


def _model_view(message: Any, parts: Any) -> list[Any]:
    """The message as a model sees it (what a run stores as its view): its text, as one turn."""
    text = "".join(str(getattr(x, "text", None) or getattr(x, "summary", "")) for x in parts)
    return [UserTurn(text) if message.role == "user" else AssistantTurn(text=text)]


async def _check_recent(h: Harness, sid: str, views: list[Any]) -> None:
    tr = await h.fresh().load_transcript(sid)
    recent = await h.fresh().load_recent(sid)
    equal(recent.session, tr.session, "load_recent's session")
    msgs = tr.messages
    if not h.store.keeps_views:
        equal((recent.earlier, _dump_all(recent.messages)), ([], _dump_all(msgs)), "a store without views")
        return
    roles = [m.info.role for m in msgs]
    summary = [bool(getattr(m.info, "summary", False)) for m in msgs]
    s, k = recent_start(roles, summary, [v is not None for v in views])
    equal(_dump_all(recent.messages), _dump_all(msgs[k:]), "the recent messages")
    equal(recent.earlier, load_views(views[s:k]) if k else [], "the model views before them")


def _dump_all(msgs: Any) -> Any:
    return [m.model_dump(mode="json") for m in msgs]


@sessions
async def nul_characters_round_trip(h: Harness) -> None:
    """A NUL in any text (a title, a model id, an error, a part's text, a tool's input and output)."""
    p, sid = h.store, new_id("ses")
    s, (u, a), parts = nul_history(sid)
    await p.upsert_session(s)
    await p.commit([(u, parts[:1], None), (a, parts[1:], None)])
    q = h.fresh()
    tr = await q.load_transcript(sid)
    equal(tr.session, s, "a session with NUL")
    equal([m.info for m in tr.messages], [u, a], "messages with NUL")
    equal([x for m in tr.messages for x in m.parts], parts, "parts with NUL")
    equal([x for x in await q.list_sessions() if x.id == sid], [s], "list_sessions with NUL")
    equal((await q.load_recent(sid)).session, s, "load_recent with NUL")
    expect("\x00" in NUL, "(NUL)")


@sessions
async def session_ids_of_255_characters_work(h: Harness) -> None:
    """The longest session id a run accepts: sessions, commits, transcripts, recent history."""
    p = h.store
    sid = ("ses_" + new_id("x") + "y" * 255)[:255]
    msgs, parts = await write(p, sid)
    q = h.fresh()
    equal((await q.get_session(sid)), session(sid), "a session with a 255-character id")
    equal(len((await q.load_transcript(sid)).messages), 2, "its transcript")
    expect(len((await q.load_recent(sid)).messages) >= 1, "its recent history")
    await p.delete_messages(sid, [msgs[1].id])
    equal(len((await q.load_transcript(sid)).messages), 1, "after deleting a message")
    expect(len(parts) > 1, "(parts)")

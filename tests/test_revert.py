"""Revert (SPEC §8): hide, unhide, prompt deletes the hidden messages, resume leaves the revert alone."""

from __future__ import annotations

import pytest

from we0nb import ScriptedModel, SessionBusyError, We0Agent, text, tool, tool_call, user_message
from we0nb.engine.revert import MarkedMessage
from we0nb.messages import ToolPart
from we0nb.models.base import AssistantTurn, UserTurn

from enginekit import Log, make_tools, seed, state

SID = "ses_r"




async def two_turns(store, extra_steps=()):
    """u1 → a1 ('one'), u2 → a2 ('two'), then whatever ``extra_steps`` script."""
    model = ScriptedModel([[text("one")], [text("two")], *extra_steps])
    agent = We0Agent(model, persistence=store)
    await agent.invoke(session_id=SID, messages=[user_message("first")])
    await agent.invoke(session_id=SID, messages=[user_message("second")])
    t = await agent.transcript(SID)
    u1, a1, u2, a2 = (m.info.id for m in t.messages)
    return agent, model, (u1, a1, u2, a2)


def texts(t):
    return [m.text for m in t.messages]


async def test_revert_hides_from_transcript_and_marks_with_include_reverted(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store)
    session = await agent.revert(SID, u2)
    assert session.revert is not None and session.revert.message_id == u2
    t = await agent.transcript(SID)
    assert texts(t) == ["first", "one"]
    assert t.session.revert.message_id == u2
    full = await agent.transcript(SID, include_reverted=True)
    assert texts(full) == ["first", "one", "second", "two"]
    assert all(isinstance(m, MarkedMessage) for m in full.messages)
    assert [m.reverted for m in full.messages] == [False, False, True, True]
    # nothing was deleted
    assert len((await agent.persistence.load_transcript(SID)).messages) == 4


async def test_revert_then_prompt_deletes_hidden_messages_for_good(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store, [[text("three")]])
    await agent.revert(SID, u2)
    result = await agent.invoke(session_id=SID, messages=[user_message("third")])
    assert result.text == "three"
    assert model.requests[2].messages == [UserTurn("first"), AssistantTurn("one"), UserTurn("third")]
    full = await agent.transcript(SID, include_reverted=True)
    assert texts(full) == ["first", "one", "third", "three"]
    assert not any(m.reverted for m in full.messages)
    assert full.session.revert is None
    stored = await agent.persistence.load_transcript(SID)
    assert u2 not in {m.info.id for m in stored.messages} and a2 not in {m.info.id for m in stored.messages}


async def test_revert_then_resume_keeps_revert_and_never_sends_hidden_messages(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store, [[text("two, again")], [text("four")]])
    await agent.revert(SID, a2)  # hide the answer: u2 is the last visible message
    events = [e async for e in agent.stream(mode="resume", session_id=SID)]
    assert events[-1]["result"].text == "two, again"
    assert model.requests[2].messages == [UserTurn("first"), AssistantTurn("one"), UserTurn("second")]
    t = await agent.transcript(SID)
    assert t.session.revert is not None and t.session.revert.message_id == a2  # left alone
    assert texts(t) == ["first", "one", "second", "two, again"]  # the new answer is visible
    full = await agent.transcript(SID, include_reverted=True)
    assert [(m.text, m.reverted) for m in full.messages] == [
        ("first", False), ("one", False), ("second", False), ("two", True), ("two, again", False)]
    new_answer = full.messages[-1].info
    assert new_answer.parent_id == u2
    # a prompt now deletes only what the revert hid, not what resume wrote
    await agent.invoke(session_id=SID, messages=[user_message("next")])
    assert model.requests[3].messages == [UserTurn("first"), AssistantTurn("one"), UserTurn("second"),
                                          AssistantTurn("two, again"), UserTurn("next")]
    assert texts(await agent.transcript(SID)) == ["first", "one", "second", "two, again", "next", "four"]


async def test_resume_after_revert_to_a_user_message_has_nothing_to_do(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store)
    await agent.revert(SID, u2)
    result = await agent.invoke(mode="resume", session_id=SID)
    assert result.result == "stop" and result.steps == 0 and model.calls == 2
    assert result.text == "one"
    assert (await agent.transcript(SID)).session.revert.message_id == u2


async def test_hidden_unfinished_message_is_neither_recovered_nor_sent(store):
    log = Log()
    p = store
    model = ScriptedModel([[text("redone")]])
    agent = We0Agent(model, tools=make_tools(log), persistence=p)
    await seed(p, SID, [("write", state("running")), ("read", state("pending"))])
    t = await agent.transcript(SID)
    assistant_id = t.messages[1].info.id
    await agent.revert(SID, assistant_id)
    events = [e async for e in agent.stream(mode="resume", session_id=SID)]
    assert not any(e["type"] == "recovery" for e in events)
    assert log.calls == []  # the hidden pending read-only call was not recalled
    assert model.requests[0].messages == [UserTurn("do it")]
    stored = await p.load_transcript(SID)
    hidden = next(m for m in stored.messages if m.info.id == assistant_id)
    assert hidden.info.time.completed is None  # untouched
    assert [pt.state.status for pt in hidden.parts if isinstance(pt, ToolPart)] == ["running", "pending"]
    assert events[-1]["result"].text == "redone"


async def test_unrevert_brings_messages_back_and_prompt_then_deletes_nothing(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store, [[text("three")]])
    await agent.revert(SID, u2)
    session = await agent.unrevert(SID)
    assert session.revert is None
    assert texts(await agent.transcript(SID)) == ["first", "one", "second", "two"]
    await agent.invoke(session_id=SID, messages=[user_message("third")])
    assert texts(await agent.transcript(SID)) == ["first", "one", "second", "two", "third", "three"]
    assert await agent.unrevert(SID) == await agent.persistence.get_session(SID)  # no revert: a no-op


async def test_a_new_revert_replaces_the_old_one(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store)
    await agent.revert(SID, a1)
    assert texts(await agent.transcript(SID)) == ["first"]
    await agent.revert(SID, a2)  # move the point forward: a1 and u2 are visible again
    assert texts(await agent.transcript(SID)) == ["first", "one", "second"]


async def test_revert_errors(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store)
    with pytest.raises(ValueError, match="not in session"):
        await agent.revert(SID, "msg_nope")
    with pytest.raises(ValueError, match="does not exist"):
        await agent.revert("ses_missing", u1)
    with pytest.raises(ValueError, match="does not exist"):
        await agent.unrevert("ses_missing")
    with pytest.raises(TypeError):
        await agent.revert(SID, 3)  # type: ignore[arg-type]
    lease = await agent.persistence.acquire_lease(SID, "run_other")
    try:
        with pytest.raises(SessionBusyError):
            await agent.revert(SID, u2)
        with pytest.raises(SessionBusyError):
            await agent.unrevert(SID)
    finally:
        await lease.release()
    assert (await agent.transcript(SID)).session.revert is None


async def test_revert_a_tool_turn_then_prompt(store):
    log = Log()
    calls = []

    @tool
    def act(what: str) -> str:
        calls.append(what)
        return f"did {what}"

    model = ScriptedModel([[tool_call("act", {"what": "x"})], [text("did x")], [text("ok, nothing done")]])
    agent = We0Agent(model, tools=[act], persistence=store)
    await agent.invoke(session_id=SID, messages=[user_message("do x")])
    t = await agent.transcript(SID)
    await agent.revert(SID, t.messages[0].info.id)  # undo the whole turn
    assert (await agent.transcript(SID)).messages == []
    r = await agent.invoke(session_id=SID, messages=[user_message("never mind")])
    assert r.text == "ok, nothing done"
    assert model.requests[2].messages == [UserTurn("never mind")]
    assert calls == ["x"] and log.calls == []


async def test_unrevert_after_a_resume_under_the_revert_is_refused_and_changes_nothing(store):
    agent, model, (u1, a1, u2, a2) = await two_turns(store, [[text("two again")]])
    await agent.revert(SID, a2)  # (the answer hidden: resume answers "second" afresh)
    await agent.invoke(session_id=SID, mode="resume")
    before = await agent.transcript(SID, include_reverted=True)
    with pytest.raises(ValueError, match="was resumed after its revert .1 message.s. written since"):
        await agent.unrevert(SID)
    after = await agent.transcript(SID, include_reverted=True)
    assert after == before and after.session.revert is not None
    assert texts(await agent.transcript(SID)) == ["first", "one", "second", "two again"]

"""Resume and prompt start-up end to end, one test per row of the seed's tables."""

import asyncio

import pytest

from we0nb import MemoryPersistence, ScriptedModel, SqlPersistence, ToolStateCompleted, ToolStateError, We0Agent, text, user_message

from enginekit import Log, assert_paired, make_tools, seed, state, tool_parts

SID = "ses_demo"


def build(steps, *, fail=(), **kw):
    log = Log()
    p = MemoryPersistence()
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=make_tools(log, fail=fail), persistence=p, **kw)
    return agent, model, log, p


async def resume(agent):
    events = [ev async for ev in agent.stream(abort=asyncio.Event(), mode="resume", session_id=SID)]
    return events


def recovery(events):
    return [(e["part"].tool, e["action"]) for e in events if e["type"] == "recovery" and e["action"] != "close"]


async def test_keep_completed():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("write", state("completed"))])
    events = await resume(agent)
    assert recovery(events) == [("write", "keep")]
    parts = await tool_parts(agent, SID)
    assert isinstance(parts[0].state, ToolStateCompleted) and parts[0].state.output == "done before"
    assert log.calls == []
    assert events[-1]["result"].result == "stop" and events[-1]["result"].text == "ok"


async def test_keep_error():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("write", state("error"))])
    events = await resume(agent)
    assert recovery(events) == [("write", "keep")]
    assert (await tool_parts(agent, SID))[0].state.error == "failed before"
    assert log.calls == []


@pytest.mark.parametrize("st", ["pending", "running"])
async def test_recall_side_effect_free(st):
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("read", state(st, path="a.txt"))])
    events = await resume(agent)
    assert recovery(events) == [("read", "recall")]
    assert log.calls == [("read", "a.txt")]
    part = (await tool_parts(agent, SID))[0]
    assert part.state.status == "completed" and part.state.output == "content of a.txt"
    assert part.state.metadata.items() >= {"recalled": True}.items()
    # the result was written to the same part, and the model saw it
    assert model.requests[0].messages[-1].content == "content of a.txt"
    assert_paired(model.requests)


@pytest.mark.parametrize("st", ["pending", "running"])
async def test_interrupt_side_effect(st):
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("write", state(st))])
    events = await resume(agent)
    assert recovery(events) == [("write", "interrupt")]
    assert log.calls == []  # never executed again
    part = (await tool_parts(agent, SID))[0]
    assert isinstance(part.state, ToolStateError)
    assert part.state.metadata["interrupted"] is True and part.state.metadata["reason"] == "resume"
    assert part.state.input == {"path": "f"}
    assert_paired(model.requests)


async def test_interrupt_after_interrupt():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("write", state("running")), ("read", state("pending")), ("stat", state("pending"))])
    events = await resume(agent)
    assert recovery(events) == [("write", "interrupt"), ("read", "interrupt"), ("stat", "interrupt")]
    assert log.calls == []
    assert all(pt.state.metadata["interrupted"] is True for pt in await tool_parts(agent, SID))


async def test_blocking_error_interrupts_later_calls():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("strict", state("error")), ("read", state("pending"))])
    events = await resume(agent)
    assert recovery(events) == [("strict", "keep"), ("read", "interrupt")]
    assert log.calls == []


async def test_recalled_call_ending_in_blocking_error_blocks_later_calls():
    agent, model, log, p = build([[text("ok")]], fail=("strict",))
    await seed(p, SID, [("strict", state("pending")), ("read", state("pending"))])
    events = await resume(agent)
    assert recovery(events) == [("strict", "recall"), ("read", "interrupt")]
    assert log.calls == [("strict", "f")]
    parts = await tool_parts(agent, SID)
    assert parts[0].state.status == "error" and "strict failed" in parts[0].state.error
    assert parts[1].state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()


async def test_unregistered_tool_is_interrupted():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("vanished", state("running"))])
    events = await resume(agent)
    assert recovery(events) == [("vanished", "interrupt")]


async def test_unfinished_message_is_closed_with_the_exact_error():
    agent, model, log, p = build([[text("continued")]])
    await seed(p, SID, [("read", state("completed"))])
    await resume(agent)
    t = await agent.transcript(SID)
    recovered = t.messages[1].info
    assert recovered.time.completed is not None
    assert recovered.error.reason == "UnfinishedAssistantMessage"
    assert recovered.error.message == "Assistant message was not completed before recovery."
    assert recovered.error.metadata == {"recovered": True, "mode": "resume"}
    assert t.messages[-1].text == "continued" and t.messages[-1].info.time.completed is not None


async def test_existing_error_is_not_overwritten():
    from we0nb.messages import MessageError

    agent, model, log, p = build([[text("again")]])
    await seed(p, SID, [], error=MessageError(reason="APIError", message="stream cut"))
    await resume(agent)
    t = await agent.transcript(SID)
    assert t.messages[1].info.error.reason == "APIError" and t.messages[1].info.time.completed is not None


async def test_resume_writes_no_user_message_and_keeps_revert_state():

    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("read", state("completed"))])
    s = await p.get_session(SID)
    before_users = sum(m.info.role == "user" for m in (await agent.transcript(SID)).messages)
    await resume(agent)
    t = await agent.transcript(SID)
    assert sum(m.info.role == "user" for m in t.messages) == before_users
    assert s.revert is None and t.session.revert is None


async def test_prompt_mode_interrupts_everything_and_recalls_nothing():
    agent, model, log, p = build([[text("fresh answer")]])
    await seed(p, SID, [("read", state("pending")), ("write", state("running")), ("stat", state("completed"))])
    events = [e async for e in agent.stream(abort=asyncio.Event(), mode="prompt", session_id=SID,
                                            messages=[user_message("new question")])]
    assert recovery(events) == [("read", "interrupt"), ("write", "interrupt"), ("stat", "keep")]
    assert log.calls == []
    parts = await tool_parts(agent, SID)
    assert [pt.state.metadata.get("reason") for pt in parts] == ["prompt", "prompt", None]
    t = await agent.transcript(SID)
    closed = t.messages[1].info
    assert closed.error.metadata == {"recovered": True, "mode": "prompt"}
    assert closed.error.reason == "UnfinishedAssistantMessage"
    assert [m.info.role for m in t.messages] == ["user", "assistant", "user", "assistant"]
    assert t.messages[2].text == "new question"
    assert_paired(model.requests)


async def test_resume_on_empty_persistence_does_nothing():
    agent, model, log, p = build([])
    result = await agent.invoke(abort=asyncio.Event(), mode="resume", session_id="ses_nothing")
    assert result.result == "stop" and result.text == ""
    assert model.requests == []
    t = await agent.transcript("ses_nothing")
    assert t.messages == [] and t.session is None  # (not even the session's row: it writes nothing)


async def test_resume_on_a_finished_session_calls_no_model_and_writes_nothing():
    agent, model, log, p = build([[text("the answer")]])
    await agent.invoke(session_id=SID, messages=[user_message("q")])
    before = (await agent.transcript(SID)).model_dump_json()
    result = await agent.invoke(mode="resume", session_id=SID)
    assert result.result == "stop" and result.text == "the answer"
    assert len(model.requests) == 1
    assert (await agent.transcript(SID)).model_dump_json() == before  # (the session's times too)


async def test_resume_that_writes_nothing_leaves_a_sqlite_database_as_it_was(tmp_path):
    db = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    agent = We0Agent(ScriptedModel([[text("the answer")]]), persistence=db)
    await agent.invoke(session_id=SID, messages=[user_message("q")])
    before = (await agent.transcript(SID)).model_dump_json()
    assert (await agent.invoke(mode="resume", session_id=SID)).result == "stop"
    assert (await agent.invoke(mode="resume", session_id="ses_elsewhere")).result == "stop"
    assert (await agent.transcript(SID)).model_dump_json() == before
    assert [s.id for s in await db.list_sessions()] == [SID]


async def test_resume_after_a_step_whose_results_the_model_has_not_seen():
    # killed between steps: the assistant message is complete, its tool results unseen
    agent, model, log, p = build([[text("saw it")]])
    await seed(p, SID, [("read", state("completed"))], completed=True)
    events = await resume(agent)
    assert [e for e in events if e["type"] == "recovery"] == []
    assert len(model.requests) == 1 and model.requests[0].messages[-1].role == "tool"
    assert events[-1]["result"].text == "saw it"


async def test_resume_twice_in_a_row():
    agent, model, log, p = build([[text("ok")]])
    await seed(p, SID, [("write", state("running"))])
    await resume(agent)
    snapshot = (await agent.transcript(SID)).model_dump_json(exclude={"session"})
    await resume(agent)
    assert len(model.requests) == 1 and log.calls == []
    assert (await agent.transcript(SID)).model_dump_json(exclude={"session"}) == snapshot



class _Crash(Exception):
    """What a process killed at that instant leaves: nothing after it is written."""


class _DieAfterClosing(MemoryPersistence):
    """A store whose run dies right after the commit in which a resume closed a cut message."""

    armed = False

    async def commit(self, writes, **kw):
        await super().commit(writes, **kw)
        closed = [m for m, _parts, _view in writes if m is not None and m.error is not None
                  and m.error.metadata.get("mode") == "resume"]
        if self.armed and closed:
            self.armed = False
            raise _Crash("killed right after the close was committed")


async def test_a_resume_killed_right_after_closing_the_cut_message_still_continues_the_turn():
    """Found by tests/test_crash_exactly_once.py (SIGKILL during a resume): a resume closes the
    message the stop cut (no tool call in it yet) and dies before its own step writes anything.
    The turn is not over — the model never finished it — so the next resume continues it."""
    from we0nb import FunctionModel

    store = _DieAfterClosing()
    agent = We0Agent(FunctionModel(lambda request: [text("Paying now, then done.")]), persistence=store,
                     flush_interval=0.0)
    abort = asyncio.Event()
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id=SID, messages=[user_message("Pay.")]):
            if ev["type"] == "text-delta":
                abort.set()  # the stream is cut after its first words
    cut = (await agent.transcript(SID)).messages[-1]
    assert cut.info.time.completed is None and cut.tool_parts == []

    store.armed = True
    with pytest.raises(_Crash):
        await agent.invoke(mode="resume", session_id=SID)
    last = (await agent.transcript(SID)).messages[-1]
    assert last.info.id == cut.info.id and last.info.error.metadata == {"recovered": True, "mode": "resume"}

    result = await agent.invoke(mode="resume", session_id=SID)
    assert result.text == "Paying now, then done."
    assert (await agent.transcript(SID)).messages[-1].info.error is None

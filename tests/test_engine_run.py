"""A run end to end: events, tools in order, errors the model sees, structured output, leases."""

import asyncio
import gc
import threading
import weakref

import pytest
from pydantic import BaseModel

from we0nb import (
    FunctionModel, MaxStepsExceeded, MemoryPersistence, ModelError, OutputValidationError, ScriptedModel,
    SessionBusyError, We0Agent, output, text, tool, tool_call, user_message,
)
from we0nb.engine.events import EVENT_TYPES
from we0nb.testing import fail, reasoning, usage

from enginekit import Log, assert_paired, make_tools

SID = "ses_run"


async def collect(stream):
    return [ev async for ev in stream]


async def test_a_plain_run_and_its_events():
    log = Log()
    model = ScriptedModel([
        [reasoning("let me think"), text("Reading "), tool_call("read", {"path": "a"}),
         tool_call("write", {"path": "b"}), usage(input_tokens=10, output_tokens=5)],
        [text("All done.")],
    ])
    agent = We0Agent(model, tools=make_tools(log))
    events = await collect(agent.stream(abort=asyncio.Event(), mode="prompt", session_id=SID,
                                        messages=[user_message("please")]))
    types = [e["type"] for e in events]
    assert set(types) <= set(EVENT_TYPES)
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("step-start") == 2 and types.count("step-finish") == 2
    assert "reasoning-delta" in types and "text-delta" in types
    statuses = [(e["part"].tool, e["part"].state.status) for e in events if e["type"] == "tool"]
    assert statuses == [("read", "pending"), ("write", "pending"), ("read", "running"), ("read", "completed"),
                        ("write", "running"), ("write", "completed")]
    assert log.calls == [("read", "a"), ("write", "b")]  # one at a time, in order
    result = events[-1]["result"]
    assert result.result == "stop" and result.text == "All done." and result.session_id == SID
    assert result.steps == 2 and result.usage.input_tokens == 10
    t = await agent.transcript(SID)
    assert [m.info.role for m in t.messages] == ["user", "assistant", "assistant"]
    assert all(m.info.time.completed for m in t.messages if m.info.role == "assistant")
    first = t.messages[1]
    assert [p.type for p in first.parts] == ["step-start", "reasoning", "text", "tool", "tool", "step-finish"]
    assert first.info.finish_reason == "tool-calls" and first.info.usage.output_tokens == 5
    assert first.parts[1].text == "let me think"
    assert_paired(model.requests)
    # the second request carries the tool results
    assert [m.role for m in model.requests[1].messages] == ["user", "assistant", "tool", "tool"]


async def test_event_parts_are_snapshots():
    log = Log()
    agent = We0Agent(ScriptedModel([[tool_call("read", {"path": "a"})], [text("x")]]), tools=make_tools(log))
    events = await collect(agent.stream(messages=[user_message("q")]))
    tool_events = [e["part"].state.status for e in events if e["type"] == "tool"]
    assert tool_events == ["pending", "running", "completed"]


async def test_a_run_without_copies_carries_the_live_parts_and_writes_the_same():
    """``RunOptions(live_parts=True)`` (a batch item's run: it reads each event once) skips the copies;
    the events' kinds and what is stored stay the same as with them."""
    from we0nb.engine.run import Run, RunOptions

    async def run(copies: bool):
        p = MemoryPersistence()
        agent = We0Agent(ScriptedModel([[tool_call("read", {"path": "a"})], [text("x")]]), tools=make_tools(Log()),
                         persistence=p)
        r = Run(agent, agent.build_request(session_id=SID, messages=[user_message("q")]), structured=False,
                options=RunOptions(live_parts=not copies))
        events = [e async for e in r.events()]
        stored = [(m.info.role, [(q.type, getattr(q, "text", None), getattr(getattr(q, "state", None), "status", None))
                                 for q in m.parts]) for m in (await p.load_transcript(SID)).messages]
        return events, stored

    copied, stored_a = await run(True)
    live, stored_b = await run(False)
    assert [e["type"] for e in copied] == [e["type"] for e in live] and stored_a == stored_b
    parts = [e["part"] for e in live if e["type"] == "tool"]
    assert len(parts) == 3 and len({id(q) for q in parts}) == 1 and parts[0].state.status == "completed"


async def test_write_ahead_running_is_persisted_before_the_tool_body():
    p = MemoryPersistence()
    seen = []

    @tool
    async def charge(amount: int) -> str:
        t = await p.load_transcript(SID)
        seen.append(t.messages[-1].tool_parts[0].state.status)
        return "charged"

    agent = We0Agent(ScriptedModel([[tool_call("charge", {"amount": 5})], [text("ok")]]), tools=[charge],
                     persistence=p)
    await agent.invoke(session_id=SID, messages=[user_message("pay")])
    assert seen == ["running"]


async def test_unknown_tool_and_bad_arguments_are_errors_the_model_sees():
    log = Log()
    model = ScriptedModel([
        [tool_call("nope", {}), tool_call("read", {"path": 3, "x": 1}), tool_call("read", '{"path": ')],
        [text("recovered")],
    ])
    agent = We0Agent(model, tools=make_tools(log))
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.text == "recovered" and log.calls == []
    parts = (await agent.transcript(SID)).messages[1].tool_parts
    assert [p.state.status for p in parts] == ["error"] * 3
    assert "Unknown tool 'nope'" in parts[0].state.error and "read" in parts[0].state.error
    assert "Invalid arguments for tool 'read'" in parts[1].state.error
    assert "not valid JSON" in parts[2].state.error
    results = [m for m in model.requests[1].messages if m.role == "tool"]
    assert all(m.is_error for m in results) and len(results) == 3


async def test_a_tool_that_raises_ends_in_error_with_its_text():
    log = Log()
    agent = We0Agent(ScriptedModel([[tool_call("read", {"path": "secret"})], [text("sorry")]]),
                     tools=make_tools(log, fail=("read",)))
    await agent.invoke(session_id=SID, messages=[user_message("q")])
    part = (await agent.transcript(SID)).messages[1].tool_parts[0]
    assert part.state.status == "error" and "cannot read secret" in part.state.error
    assert part.state.time.start is not None and part.state.time.end is not None


async def test_blocking_error_interrupts_the_rest_of_the_step_and_the_loop_goes_on():
    log = Log()
    model = ScriptedModel([[tool_call("strict", {"path": "a"}), tool_call("write", {"path": "b"}),
                            tool_call("read", {"path": "c"})], [text("handled")]])
    agent = We0Agent(model, tools=make_tools(log, fail=("strict",)))
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.text == "handled" and log.calls == [("strict", "a")]
    parts = (await agent.transcript(SID)).messages[1].tool_parts
    assert parts[0].state.status == "error" and "interrupted" not in parts[0].state.metadata
    for p in parts[1:]:
        assert p.state.status == "error"
        assert p.state.metadata.items() >= {"interrupted": True, "reason": "blocked"}.items()
    assert_paired(model.requests)


async def test_model_failure_mid_stream_is_recorded_and_resumable():
    model = ScriptedModel([[text(["par", "tial"]), fail(ConnectionError("socket closed"))], [text("again")]])
    agent = We0Agent(model)
    with pytest.raises(ModelError, match="ConnectionError: socket closed") as e:
        await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert isinstance(e.value.cause, ConnectionError)
    a = (await agent.transcript(SID)).messages[-1]
    assert a.info.error.reason == "ConnectionError" and a.info.error.message == "socket closed"
    assert a.info.time.completed is None and a.text == "partial"
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "again"
    closed = (await agent.transcript(SID)).messages[1].info
    assert closed.error.reason == "ConnectionError" and closed.time.completed is not None


async def test_scripted_model_called_too_often_is_a_clear_error():
    agent = We0Agent(ScriptedModel([[tool_call("x", {})]]))
    with pytest.raises(ModelError, match="scripted step"):
        await agent.invoke(session_id=SID, messages=[user_message("q")])


async def test_max_steps_guard():
    log = Log()
    model = ScriptedModel([[tool_call("read", {"path": str(i)})] for i in range(5)])
    agent = We0Agent(model, tools=make_tools(log), max_steps=3)
    with pytest.raises(MaxStepsExceeded, match="max_steps=3"):
        await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert len(model.requests) == 3
    t = await agent.transcript(SID)
    assert all(m.info.time.completed for m in t.messages if m.info.role == "assistant")


async def test_second_concurrent_run_on_a_session_is_busy():
    model = ScriptedModel([[text(["x"] * 50)], [text("y")]], delay=0.01)
    agent = We0Agent(model)
    first = asyncio.ensure_future(agent.invoke(session_id=SID, messages=[user_message("a")]))
    await asyncio.sleep(0.05)
    with pytest.raises(SessionBusyError, match="ses_run"):
        await agent.invoke(session_id=SID, messages=[user_message("b")])
    with pytest.raises(SessionBusyError):
        await agent.invoke(mode="resume", session_id=SID)
    await first
    r = await agent.invoke(session_id=SID, messages=[user_message("b")])  # released
    assert r.text == "y"


def test_one_agent_across_several_event_loops():
    agent = We0Agent(ScriptedModel([[text("one")], [text("two")]]))
    r1 = asyncio.run(agent.invoke(session_id=SID, messages=[user_message("a")]))
    r2 = asyncio.run(agent.invoke(session_id=SID, messages=[user_message("b")]))
    assert (r1.text, r2.text) == ("one", "two")
    assert len(asyncio.run(agent.transcript(SID)).messages) == 4


async def test_sync_tools_do_not_block_the_loop():
    @tool(side_effects=False)
    def which() -> str:
        return threading.current_thread().name

    agent = We0Agent(ScriptedModel([[tool_call("which", {})], [text("k")]]), tools=[which])
    await agent.invoke(session_id=SID, messages=[user_message("q")])
    out = (await agent.transcript(SID)).messages[1].tool_parts[0].state.output
    assert out != threading.current_thread().name


async def test_function_model_decides_from_the_history():
    def reply(request):
        if request.messages[-1].role == "tool":
            return [text(f"tool said {request.messages[-1].content}")]
        return [tool_call("stat", {"path": "x"})]

    log = Log()
    agent = We0Agent(FunctionModel(reply), tools=make_tools(log))
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.text == "tool said size of x"


async def test_function_model_keeps_its_requests_unless_told_not_to():
    seen = []

    def reply(request):
        seen.append(weakref.ref(request))
        return [text("ok")]

    kept, dropped = FunctionModel(reply), FunctionModel(reply, keep_requests=False)
    for model in (kept, dropped):
        await We0Agent(model).invoke(messages=[user_message("q")])
    gc.collect()
    assert [m.messages[-1].text for m in kept.requests] == ["q"] and seen[0]() is kept.requests[0]
    assert dropped.requests == [] and seen[1]() is None  # nothing else holds a request after its run


class City(BaseModel):
    name: str
    population: int


async def test_structured_output_via_invoke():
    model = ScriptedModel([[output(City(name="Paris", population=2_100_000))]])
    agent = We0Agent(model, output_type=City)
    r = await agent.invoke(session_id=SID, messages=[user_message("biggest city?")])
    assert r.output == City(name="Paris", population=2_100_000)
    assert model.requests[0].output_tool == "final_result"
    assert any(t.name == "final_result" for t in model.requests[0].tools)


async def test_invalid_output_goes_back_to_the_model_then_validates():
    model = ScriptedModel([[output({"name": "Paris"})], [output({"name": "Paris", "population": 3})]])
    agent = We0Agent(model, output_type=City)
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.output.population == 3
    err = [m for m in model.requests[1].messages if m.role == "tool"][0]
    assert err.is_error and "population" in err.content


async def test_invalid_output_retries_are_bounded():
    model = ScriptedModel([[output({"name": "x"})]] * 3)
    agent = We0Agent(model, output_type=City, output_retries=1)
    with pytest.raises(OutputValidationError, match="2 times"):
        await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert len(model.requests) == 2


async def test_structured_output_survives_resume_of_a_finished_turn():
    agent = We0Agent(ScriptedModel([[output({"name": "Rome", "population": 1})]]), output_type=City)
    await agent.invoke(session_id=SID, messages=[user_message("q")])
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.output == City(name="Rome", population=1)

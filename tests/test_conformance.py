"""One conformance suite for every model adapter: an adapter is done when it passes it.

Each test runs against every driver of :mod:`conformance_support` — ScriptedModel,
OpenAIChatModel through a local chat-completions server, AnthropicModel through a local
Messages API server — and checks the engine's guarantees hold for it: streaming, several
tool calls per step, reasoning, usage, structured output, abort at every phase then
resume, every error class reaching the caller as itself, a cut connection, malformed
events. What a driver cannot do (ScriptedModel has no HTTP: no retries) is skipped with
the reason.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import BaseModel

from conformance_support import DRIVERS, Driver, Sent, call, reasoning, text
from we0nb import We0Agent, tool, user_message
from we0nb.engine.history import SUMMARY_PREFIX
from we0nb.errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError
from we0nb.messages import ReasoningPart, ToolPart, Usage


@pytest.fixture(params=list(DRIVERS))
async def driver(request):
    d = DRIVERS[request.param]()
    yield d
    await d.aclose()


def toolbox(log: list):
    @tool(side_effects=False)
    def lookup(key: str) -> str:
        """Look a key up."""
        log.append(("lookup", key))
        return f"value of {key}"

    @tool
    def write(path: str) -> str:
        """Write a file."""
        log.append(("write", path))
        return f"wrote {path}"

    @tool(side_effects=False)
    def broken(x: int) -> str:
        """Always fails."""
        raise RuntimeError("broken tool")

    @tool
    async def slow(path: str) -> str:
        """Takes its time (an abort stops it)."""
        log.append(("slow", path))
        await asyncio.sleep(30)
        return "done"

    return [lookup, write, broken, slow]


async def last_assistant(agent: We0Agent, sid: str = "s"):
    return (await agent.transcript(sid)).last_assistant


def tool_results(sent: Sent) -> list[tuple]:
    return [m for m in sent.messages if m[0] == "tool"]


def assistant_turns(sent: Sent) -> list[tuple]:
    return [m for m in sent.messages if m[0] == "assistant"]


# --------------------------------------------------------------------------- streaming


async def test_text_streams_in_order(driver: Driver):
    driver.play(driver.reply(text("Hel", "lo", " world.")))
    agent = We0Agent(driver.model(), system_prompt="Be brief.")
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("hi")])]
    assert [e["text"] for e in events if e["type"] == "text-delta"] == ["Hel", "lo", " world."]
    assert events[-1]["result"].text == "Hello world."
    msg = await last_assistant(agent)
    assert msg.text == "Hello world." and msg.info.finish_reason == "stop" and msg.info.error is None
    sent = driver.sent(0)
    assert sent.system == "Be brief." and sent.messages == [("user", "hi")]
    assert sent.tools == [] and not sent.forced


async def test_several_tool_calls_in_one_step(driver: Driver):
    log: list = []
    driver.play(
        driver.reply(text("Checking."), call("call_1", "lookup", {"key": "a"}), call("call_2", "write", {"path": "p"}),
                     call("call_3", "broken", {"x": 1})),
        driver.reply(text("Done.")),
    )
    agent = We0Agent(driver.model(), tools=toolbox(log))
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("go")])]
    pending = [e["part"] for e in events if e["type"] == "tool" and e["part"].state.status == "pending"]
    assert [(p.call_id, p.tool) for p in pending] == [("call_1", "lookup"), ("call_2", "write"), ("call_3", "broken")]
    assert log == [("lookup", "a"), ("write", "p")]
    assert events[-1]["result"].text == "Done." and events[-1]["result"].steps == 2
    step1 = (await agent.transcript("s")).messages[1]
    assert step1.info.finish_reason == "tool-calls" and step1.text == "Checking."
    sent = driver.sent(1)
    assert set(sent.tools) == {"lookup", "write", "broken", "slow"}
    assert assistant_turns(sent) == [("assistant", "Checking.", (("call_1", "lookup", {"key": "a"}),
                                                                 ("call_2", "write", {"path": "p"}),
                                                                 ("call_3", "broken", {"x": 1})))]
    results = tool_results(sent)
    assert [(r[1], r[2]) for r in results[:2]] == [("call_1", "value of a"), ("call_2", "wrote p")]
    assert results[2][1] == "call_3" and "broken tool" in results[2][2]
    if results[0][3] is not None:  # the wire says which results are errors
        assert [r[3] for r in results] == [False, False, True]


async def test_reasoning_is_kept_and_goes_back_as_the_provider_requires(driver: Driver, tmp_path):
    from we0nb.persistence.sql import SqlPersistence

    log: list = []
    url = f"sqlite:///{tmp_path / 'we0.db'}"
    driver.play(driver.reply(reasoning("Let me ", "think.", signature="sig-A"), text("Answer:"),
                             call("call_1", "lookup", {"key": "a"})),
                driver.reply(text("Final.")), driver.reply(text("Second.")), driver.reply(text("Third.")))
    p = SqlPersistence(url)
    agent = We0Agent(driver.model(), tools=toolbox(log), persistence=p)
    try:
        events = [e async for e in agent.stream(session_id="s", messages=[user_message("q")])]
        await agent.invoke(session_id="s", messages=[user_message("next")])
    finally:
        await p.close()
    assert [e["text"] for e in events if e["type"] == "reasoning-delta"] == ["Let me ", "think."]
    # "another process": a new store and agent on the same database; the first turn is now
    # read from its stored model views
    p2 = SqlPersistence(url)
    agent2 = We0Agent(driver.model(), tools=toolbox(log), persistence=p2)
    try:
        t = await agent2.transcript("s")
        (part,) = [x for x in t.messages[1].parts if isinstance(x, ReasoningPart)]
        assert part.text == "Let me think." and part.time.end is not None
        assert part.signature == ("sig-A" if driver.signs_reasoning else None)
        assert len((await p2.load_recent("s")).earlier) >= 3
        await agent2.invoke(session_id="s", messages=[user_message("again")])
    finally:
        await p2.close()
    expected = [("Let me think.", "sig-A", None)] if driver.signs_reasoning else []
    assert driver.sent(1).signed == expected  # the next step of the same turn
    assert driver.sent(3).signed == expected  # a later run, from the stored model views


async def test_usage_is_reported_in_one_convention(driver: Driver):
    u = Usage(input_tokens=120, output_tokens=9, reasoning_tokens=3, cached_tokens=40, cache_write_tokens=20)
    driver.play(driver.reply(text("ok"), usage=u))
    agent = We0Agent(driver.model())
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    msg = await last_assistant(agent)
    assert msg.info.usage == driver.expected_usage(u) == result.usage
    assert msg.info.usage.input_tokens == 120  # the whole prompt, cache reads (and writes) included


# --------------------------------------------------------------------------- structured output


class Answer(BaseModel):
    value: int


async def test_structured_output_through_a_forced_tool(driver: Driver):
    driver.play(driver.reply(call("c1", "final_result", {"value": "not a number"})),
                driver.reply(call("c2", "final_result", {"value": 42})))
    agent = We0Agent(driver.model(), output_type=Answer)
    result = await agent.invoke(session_id="s", messages=[user_message("answer")])
    assert result.output == Answer(value=42)
    first, second = driver.sent(0), driver.sent(1)
    assert first.tools == ["final_result"] and first.forced
    (bad,) = tool_results(second)
    assert bad[1] == "c1" and "Invalid structured output" in bad[2] and bad[3] in (True, None)


# --------------------------------------------------------------------------- abort at every phase

PHASES = {
    # phase: (the reply that is interrupted, the event that triggers the abort, and when the
    # abort is set: "now" — seen at the engine's next check, between two events — or "soon" —
    # once the engine waits on the stream again, so the pending read is cancelled)
    "waiting": ((), None, "soon"),  # (no trigger: aborted by a task once the stream is open …
    "reasoning": ((reasoning("Thinking about", " it"),), "reasoning-delta", "now"),
    "text": ((text("Hel", "lo"),), "text-delta", "now"),
    "text-while-reading": ((text("Hel", "lo"),), "text-delta", "soon"),
    "tool-input": ((text("Let me look."), call("call_1", "lookup", {"key": "a"}, partial=True)), "text-delta",
                   "soon"),
    "calls-done": ((call("call_1", "lookup", {"key": "a"}), call("call_2", "lookup", {"key": "b"})), "pending",
                   "now"),
    "tool-running": ((call("call_1", "slow", {"path": "p"}),), None, "soon"),  # … or the tool runs)
}


def _triggers(e: dict, trigger: str) -> bool:
    if e["type"] == "tool":
        return e["part"].state.status == trigger
    return e["type"] == trigger


def _check_interrupted(phase: str, msg, log: list) -> None:
    """What the abort left in the store: the output so far, the message unfinished."""
    assert msg.unfinished and msg.info.time.completed is None
    thought = "".join(p.text for p in msg.parts if isinstance(p, ReasoningPart))
    calls = msg.tool_parts
    if phase == "waiting":
        assert msg.text == "" and thought == "" and not calls
    elif phase == "reasoning":
        assert thought.startswith("Thinking about") and msg.text == ""
        assert all(p.signature is None for p in msg.parts if isinstance(p, ReasoningPart))  # never finished
    elif phase.startswith("text"):
        assert msg.text in ("Hel", "Hello")
    elif phase == "tool-input":
        assert msg.text == "Let me look." and not calls  # half a call is no call
    elif phase == "calls-done":
        assert calls and calls[0].call_id == "call_1" and all(p.state.status == "pending" for p in calls)
        assert log == []
    else:
        assert [p.state.status for p in calls] == ["running"] and log == [("slow", "p")]


@pytest.mark.parametrize("phase", list(PHASES))
async def test_abort_at_every_phase_then_resume(driver: Driver, phase: str):
    items, trigger, when = PHASES[phase]
    log: list = []
    driver.play(driver.reply(*items, end=None if phase == "tool-running" else "hold"),
                driver.reply(text("Resumed", " answer.")))
    agent = We0Agent(driver.model(slow=True), tools=toolbox(log))
    abort = asyncio.Event()
    loop = asyncio.get_running_loop()
    watcher = None
    if trigger is None:  # the engine waits on a stream that sent nothing yet, or on the tool
        async def abort_when_blocked() -> None:
            if phase == "waiting":
                await driver.held()
            while phase == "tool-running" and not log:
                await asyncio.sleep(0.005)
            abort.set()
        watcher = asyncio.create_task(abort_when_blocked())
    with pytest.raises(asyncio.CancelledError):
        async for e in agent.stream(abort=abort, session_id="s", messages=[user_message("go")]):
            if trigger is not None and _triggers(e, trigger) and not abort.is_set():
                if when == "now":
                    abort.set()
                else:
                    loop.call_soon(abort.set)
    if watcher is not None:
        await watcher
    if phase != "tool-running":
        assert await asyncio.to_thread(driver.wait_disconnect, 10), "the HTTP stream was not closed"
    msg = await last_assistant(agent)
    _check_interrupted(phase, msg, log)
    partial = msg.text
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.text == "Resumed answer."
    t = await agent.transcript("s")
    assert not t.needs_resume and all(p.finished for m in t.messages for p in m.tool_parts)
    sent = driver.sent(driver.n_requests - 1)
    if partial:  # the model sees what it said before the abort
        assert ("assistant", partial, ()) in sent.messages
    if phase == "calls-done":  # read-only calls that never ran are recalled, once each
        keys = [p.state.input["key"] for p in msg.tool_parts]
        assert log == [("lookup", k) for k in keys]
        assert [r[2] for r in tool_results(sent)] == [f"value of {k}" for k in keys]
    if phase == "tool-running":  # a side effect is never repeated: the call is interrupted
        assert log == [("slow", "p")]
        (res,) = tool_results(sent)
        assert res[1] == "call_1" and "Interrupted" in res[2]


# --------------------------------------------------------------------------- errors


async def _fails(agent: We0Agent, cls: type) -> BaseException:
    with pytest.raises(cls) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    msg = await last_assistant(agent)
    err = info.value
    assert (err.session_id, err.message_id) == ("s", msg.info.id)
    assert msg.info.time.completed is None and msg.info.error.reason == type(err).__name__
    return err


@pytest.mark.parametrize("kind,status", [("auth", 401), ("permission", 403)])
async def test_refused_credentials_are_not_retried(driver: Driver, kind: str, status: int):
    driver.play(driver.error(kind))
    agent = We0Agent(driver.model())
    err = await _fails(agent, ModelAuthenticationError)
    assert err.status_code == status and not err.retryable and driver.n_requests == 1
    if kind == "auth" and driver.key_env:
        assert driver.key_env in str(err)  # says how to fix it


@pytest.mark.parametrize("kind,status", [("not-found", 404), ("bad-request", 400)])
async def test_client_errors_are_not_retried_and_resume_continues(driver: Driver, kind: str, status: int):
    driver.play(driver.error(kind), driver.reply(text("fine now")))
    agent = We0Agent(driver.model())
    err = await _fails(agent, ModelProviderError)
    assert type(err) is ModelProviderError and err.status_code == status and not err.retryable
    assert driver.n_requests == 1
    if kind == "not-found" and driver.transport:
        assert "check the model name" in str(err) and "base_url" in str(err)  # says how to fix it
    assert (await agent.invoke(mode="resume", session_id="s")).text == "fine now"


@pytest.mark.parametrize("kind", ["rate-limit", "overloaded", "server"])
async def test_transient_errors_are_retried(driver: Driver, kind: str):
    driver.require_transport()
    driver.play(driver.error(kind), driver.error(kind), driver.reply(text("recovered")))
    agent = We0Agent(driver.model())
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "recovered" and driver.n_requests == 3
    t = await agent.transcript("s")
    assert len(t.messages) == 2 and t.messages[1].info.error is None  # one clean step


@pytest.mark.parametrize("kind,status", [("rate-limit", 429), ("overloaded", None), ("server", 500)])
async def test_transient_errors_in_the_end_reach_the_caller_and_resume_continues(driver: Driver, kind, status):
    retries = 1 if driver.transport else 0
    driver.play(*[driver.error(kind) for _ in range(retries + 1)], driver.reply(text("later")))
    agent = We0Agent(driver.model(max_retries=retries) if driver.transport else driver.model())
    err = await _fails(agent, ModelProviderError)
    assert err.retryable and err.status_code is not None and err.status_code >= 429
    if status is not None:
        assert err.status_code == status
    if driver.transport:
        assert "gave up after 1 retry" in str(err) and driver.n_requests == 2
    assert (await agent.invoke(mode="resume", session_id="s")).text == "later"


async def test_rate_limit_honours_retry_after(driver: Driver):
    driver.require_transport()
    driver.play(driver.error("rate-limit", retry_after="1"), driver.reply(text("after the wait")),
                driver.error("rate-limit", retry_after="3600"))
    agent = We0Agent(driver.model(max_retry_after=60))
    assert (await agent.invoke(session_id="s", messages=[user_message("x")])).text == "after the wait"
    first, second = driver.request_times()
    assert second - first >= 0.9  # the server asked for one second
    # a retry-after beyond max_retry_after is not waited for
    agent = We0Agent(driver.model(max_retry_after=5))
    t0 = time.monotonic()
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s2", messages=[user_message("x")])
    assert info.value.status_code == 429 and driver.n_requests == 3 and time.monotonic() - t0 < 5


async def test_context_overflow_compacts_then_resume_continues(driver: Driver):
    driver.play(driver.error("context"),
                driver.reply(text("The user asked for x."), usage=Usage(input_tokens=3000, output_tokens=8)),
                driver.reply(text("Done with x."), usage=Usage(input_tokens=40, output_tokens=4)))
    agent = We0Agent(driver.model(context_window=4096))
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("do x")])]
    assert events[-1]["result"].result == "compact"
    (comp,) = [e for e in events if e["type"] == "compaction"]
    assert comp["part"].summary == "The user asked for x."
    t = await agent.transcript("s")
    assert t.messages[1].info.error.reason == ContextWindowExceeded.__name__
    summary_request = driver.sent(1)
    assert summary_request.tools == [] and "summary" in summary_request.messages[-1][1]
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.result == "stop" and result.text == "Done with x."
    sent = driver.sent(2).messages
    assert sent[0][0] == "user" and sent[0][1].startswith(SUMMARY_PREFIX + "The user asked for x.")
    assert sent[1][0] == "user" and sent[1][1].startswith("do x") and len(sent) == 2


# --------------------------------------------------------------------------- broken streams


@pytest.mark.parametrize("end", ["cut", "error", "bad"])
async def test_broken_stream_keeps_the_partial_output_and_resume_continues(driver: Driver, end: str):
    driver.play(driver.reply(text("Hel", "lo"), end=end), driver.reply(text("Hello again.")))
    agent = We0Agent(driver.model())
    events: list = []
    with pytest.raises(ModelProviderError) as info:
        async for e in agent.stream(session_id="s", messages=[user_message("x")]):
            events.append(e)
    err = info.value
    assert err.retryable and err.message_id is not None
    if end == "bad":
        assert "malformed" in str(err)
    assert [e["text"] for e in events if e["type"] == "text-delta"] == ["Hel", "lo"]
    msg = await last_assistant(agent)
    assert msg.text == "Hello" and msg.info.time.completed is None and msg.info.error is not None
    assert driver.n_requests == 1  # text had streamed: no silent retry
    events = [e async for e in agent.stream(mode="resume", session_id="s")]
    assert any(e["type"] == "recovery" and e["action"] == "close" for e in events)
    assert events[-1]["result"].text == "Hello again."
    assert ("assistant", "Hello", ()) in driver.sent(1).messages


async def test_malformed_tool_arguments_become_a_tool_error_the_model_sees(driver: Driver):
    log: list = []
    driver.play(driver.reply(call("call_1", "lookup", "{not json")), driver.reply(text("fixed")))
    agent = We0Agent(driver.model(), tools=toolbox(log))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "fixed" and log == []
    t = await agent.transcript("s")
    (tp,) = [p for m in t.messages for p in m.parts if isinstance(p, ToolPart)]
    assert tp.call_id == "call_1" and tp.state.status == "error" and "JSON" in tp.state.error
    (res,) = tool_results(driver.sent(1))
    assert res[1] == "call_1" and "JSON" in res[2] and res[3] in (True, None)

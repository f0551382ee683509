"""Compaction (SPEC §8): threshold and overflow triggers, the summary, resume/prompt after it, no loop."""

from __future__ import annotations

import asyncio

import pytest

from we0nb import (
    CompactionPart, FunctionModel, MemoryPersistence, ModelError, ScriptedModel, We0Agent, text, tool, tool_call,
    user_message,
)
from we0nb.engine.compaction import DEFAULT_COMPACTION_PROMPT, TAIL_NOTE, shrink
from we0nb.engine.history import SUMMARY_PREFIX
from we0nb.errors import CompactionError, ContextWindowExceeded
from we0nb.models.base import AssistantTurn, ToolCall, ToolResult, UserTurn
from we0nb.testing import fail, usage

SID = "ses_c"


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []


def tools(log: Log):
    @tool
    def fetch(url: str) -> str:
        log.calls.append(("fetch", {"url": url}))
        return f"page of {url}"

    return [fetch]




def build(steps, *, window=1000, persistence=None, **kw):
    log = Log()
    model = ScriptedModel(steps, context_window=window)
    agent = We0Agent(model, tools=tools(log), persistence=persistence or MemoryPersistence(), **kw)
    return agent, model, log


async def run(agent, **kw):
    kw.setdefault("session_id", SID)
    return [e async for e in agent.stream(**kw)]


def kinds(t):
    out = []
    for m in t.messages:
        if m.info.role == "user":
            synthetic = any(getattr(p, "synthetic", False) for p in m.parts)
            out.append("user*" if synthetic else "user")
        elif m.info.summary:
            out.append("summary")
        else:
            out.append("assistant")
    return out


# --------------------------------------------------------------------------- threshold


async def test_threshold_mid_turn_compacts_then_resume_continues_from_summary_and_tail(store):
    agent, model, log = build(persistence=store, steps=[
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900, output_tokens=10)],
        [text("User wants a summary of page a; fetch(a) is DONE: 'page of a'."),
         usage(input_tokens=950, output_tokens=20)],
        [text("Page a says: page of a."), usage(input_tokens=60, output_tokens=9)],
    ])
    events = await run(agent, messages=[user_message("summarise page a")])
    types = [e["type"] for e in events]
    assert types[-3:] == ["step-finish", "compaction", "finish"]
    result = events[-1]["result"]
    assert result.result == "compact"
    assert result.usage.input_tokens == 900 + 950 and result.usage.output_tokens == 30
    comp = next(e for e in events if e["type"] == "compaction")
    assert isinstance(comp["part"], CompactionPart)
    assert comp["part"].summary.startswith("User wants a summary of page a")
    assert comp["message"].summary is True
    assert log.calls == [("fetch", {"url": "a"})]

    # the summary request: the history plus the instruction, no tools
    req = model.requests[1]
    assert req.purpose == "summary" and req.tools == [] and req.output_tool is None
    assert isinstance(req.messages[-1], UserTurn) and req.messages[-1].text == DEFAULT_COMPACTION_PROMPT
    assert req.messages[:-1] == model.requests[0].messages + [
        AssistantTurn("", "", [ToolCall(req.messages[1].tool_calls[0].call_id, "fetch", {"url": "a"})]),
        ToolResult(req.messages[1].tool_calls[0].call_id, "fetch", "page of a"),
    ]

    # persisted: the history is kept, then the summary, then the re-sent user message
    t = await agent.transcript(SID)
    assert kinds(t) == ["user", "assistant", "summary", "user*"]
    summary = t.messages[2]
    assert summary.info.time.completed is not None and summary.info.usage.output_tokens == 20
    assert [p.type for p in summary.parts] == ["compaction"]
    assert t.messages[3].text == "summarise page a" + TAIL_NOTE

    # resume: the model sees the summary and the recent tail, nothing before
    result = await agent.invoke(mode="resume", session_id=SID)
    assert result.result == "stop" and result.text == "Page a says: page of a."
    assert model.requests[2].messages == [
        UserTurn(SUMMARY_PREFIX + comp["part"].summary),
        UserTurn("summarise page a" + TAIL_NOTE),
    ]
    assert model.requests[2].purpose == "step" and [s.name for s in model.requests[2].tools] == ["fetch"]
    assert log.calls == [("fetch", {"url": "a"})]  # nothing ran twice
    t = await agent.transcript(SID)
    assert kinds(t) == ["user", "assistant", "summary", "user*", "assistant"]


async def test_finished_turn_compacts_without_tail_then_resume_is_a_no_op_and_prompt_continues(store):
    agent, model, log = build(persistence=store, steps=[
        [text("The answer is 42."), usage(input_tokens=850)],
        [text("Asked the question; answered 42."), usage(input_tokens=870, output_tokens=12)],
        [text("Yes, 42."), usage(input_tokens=40)],
    ])
    events = await run(agent, messages=[user_message("question?")])
    result = events[-1]["result"]
    assert result.result == "compact"
    assert result.text == "The answer is 42."  # the turn's answer, not the summary
    t = await agent.transcript(SID)
    assert kinds(t) == ["user", "assistant", "summary"]
    assert result.message_id == t.messages[1].info.id

    resumed = await agent.invoke(mode="resume", session_id=SID)
    assert resumed.result == "stop" and resumed.steps == 0 and model.calls == 2
    assert kinds(await agent.transcript(SID)) == ["user", "assistant", "summary"]

    again = await agent.invoke(session_id=SID, messages=[user_message("sure?")])
    assert again.result == "stop" and again.text == "Yes, 42."
    assert model.requests[2].messages == [UserTurn(SUMMARY_PREFIX + "Asked the question; answered 42."),
                                          UserTurn("sure?")]


async def test_prompt_after_mid_turn_compaction_sends_summary_tail_and_new_message():
    agent, model, log = build([
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [text("fetched a"), usage(input_tokens=920, output_tokens=5)],
        [text("ok, b instead"), usage(input_tokens=50)],
    ])
    await run(agent, messages=[user_message("get a")])
    result = await agent.invoke(session_id=SID, messages=[user_message("actually, b")])
    assert result.text == "ok, b instead"
    assert model.requests[2].messages == [UserTurn(SUMMARY_PREFIX + "fetched a"), UserTurn("get a" + TAIL_NOTE),
                                          UserTurn("actually, b")]
    assert kinds(await agent.transcript(SID)) == ["user", "assistant", "summary", "user*", "user", "assistant"]


@pytest.mark.parametrize("kw, window, tokens", [
    ({}, 1000, 800),                              # at the threshold is not past it
    ({"compaction_threshold": None}, 1000, 999),  # turned off
    ({}, None, 10**6),                            # context window unknown
    ({"compaction_threshold": 0.95}, 1000, 900),
])
async def test_no_compaction_below_threshold_or_when_off(kw, window, tokens):
    agent, model, log = build([[text("fine"), usage(input_tokens=tokens)]], window=window, **kw)
    events = await run(agent, messages=[user_message("q")])
    assert events[-1]["result"].result == "stop"
    assert not any(e["type"] == "compaction" for e in events) and model.calls == 1


async def test_custom_prompt_and_threshold():
    agent, model, log = build([[text("a"), usage(input_tokens=501)], [text("s"), usage(output_tokens=1)]],
                              compaction_threshold=0.5, compaction_prompt="Summarise tersely.")
    events = await run(agent, messages=[user_message("q")])
    assert events[-1]["result"].result == "compact"
    assert model.requests[1].messages[-1] == UserTurn("Summarise tersely.")


@pytest.mark.parametrize("bad", [0, 1.5, -0.1, True, "0.8"])
def test_threshold_validation(bad):
    with pytest.raises(ValueError, match="compaction_threshold"):
        We0Agent(ScriptedModel([]), compaction_threshold=bad)


# --------------------------------------------------------------------------- no loop


async def test_first_step_after_summary_over_threshold_is_an_error_not_a_loop(store):
    agent, model, log = build(persistence=store, steps=[
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [text("summary"), usage(input_tokens=950, output_tokens=10)],
        [tool_call("fetch", {"url": "b"}), usage(input_tokens=880)],
    ])
    await run(agent, messages=[user_message("go")])
    with pytest.raises(CompactionError, match="first step after a compaction summary already used 880"):
        await agent.invoke(mode="resume", session_id=SID)
    assert model.calls == 3  # no second summary was requested
    assert kinds(await agent.transcript(SID)) == ["user", "assistant", "summary", "user*", "assistant"]


async def test_summary_not_below_threshold_is_an_error_and_writes_nothing():
    agent, model, log = build([
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [text("a very long summary"), usage(input_tokens=950, output_tokens=820)],
    ])
    with pytest.raises(CompactionError, match="820 tokens, no smaller than the compaction threshold"):
        await run(agent, messages=[user_message("go")])
    assert kinds(await agent.transcript(SID)) == ["user", "assistant"]


async def test_summary_not_smaller_than_history_is_an_error_without_a_window():
    # window unknown: only an overflow triggers; the summary must still shrink the history
    agent, model, log = build([
        [fail(ContextWindowExceeded("too long"))],
        [text("x" * 400), usage(input_tokens=90, output_tokens=100)],
    ], window=None)
    with pytest.raises(CompactionError, match="no smaller than the history it replaces"):
        await run(agent, messages=[user_message("go")])


async def test_a_second_compaction_after_progress_is_allowed():
    agent, model, log = build([
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [text("s1"), usage(input_tokens=950, output_tokens=5)],
        [tool_call("fetch", {"url": "b"}), usage(input_tokens=300)],
        [tool_call("fetch", {"url": "c"}), usage(input_tokens=850)],
        [text("s2"), usage(input_tokens=900, output_tokens=5)],
        [text("done"), usage(input_tokens=30)],
    ])
    await run(agent, messages=[user_message("go")])
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.result == "compact"
    # the second summary summarised the first one plus what followed it
    assert model.requests[4].messages[0] == UserTurn(SUMMARY_PREFIX + "s1")
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "done"
    assert model.requests[5].messages == [UserTurn(SUMMARY_PREFIX + "s2"), UserTurn("go" + TAIL_NOTE)]
    assert [c[1]["url"] for c in log.calls] == ["a", "b", "c"]


# --------------------------------------------------------------------------- overflow


async def test_context_overflow_compacts_and_resume_continues(store):
    agent, model, log = build(persistence=store, steps=[
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=300)],
        [fail(ContextWindowExceeded("request of 1200 tokens exceeds 1000"))],
        [text("fetched a; must report it"), usage(input_tokens=700, output_tokens=8)],
        [text("report: page of a")],
    ])
    events = await run(agent, messages=[user_message("report a")])
    assert events[-1]["result"].result == "compact"
    t = await agent.transcript(SID)
    assert kinds(t) == ["user", "assistant", "assistant", "summary", "user*"]
    failed = t.messages[2].info
    assert failed.error.reason == "ContextWindowExceeded" and failed.error.metadata.get("compacted") is True
    assert failed.time.completed is not None  # closed: the summary took over
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "report: page of a"
    assert model.requests[3].messages == [UserTurn(SUMMARY_PREFIX + "fetched a; must report it"),
                                          UserTurn("report a" + TAIL_NOTE)]
    assert log.calls == [("fetch", {"url": "a"})]


async def test_overflowing_summary_request_is_shrunk_and_retried():
    big = "x" * 50_000
    seen = []

    def reply(request):
        seen.append(request)
        size = sum(len(getattr(m, "text", "") or getattr(m, "content", "")) for m in request.messages)
        if request.purpose == "step" and len(seen) == 1:
            # (usage reported: without it the 50,000-character result is estimated over the
            # threshold and compaction starts before step 2 overflows)
            return [tool_call("fetch", {"url": "big"}), usage(input_tokens=10)]
        if size > 10_000:
            return [fail(ContextWindowExceeded(f"{size} chars is too much"))]
        return [text("shrunk summary"), usage(input_tokens=500, output_tokens=3)]

    @tool(side_effects=False)
    def fetch(url: str) -> str:
        return big

    agent = We0Agent(FunctionModel(reply, context_window=4000), tools=[fetch])
    events = [e async for e in agent.stream(session_id=SID, messages=[user_message("read big")])]
    assert events[-1]["result"].result == "compact"
    purposes = [r.purpose for r in seen]
    assert purposes == ["step", "step", "summary", "summary"]
    cut = seen[3].messages[2]
    assert isinstance(cut, ToolResult) and len(cut.content) < 3000 and "characters cut" in cut.content
    assert seen[3].messages[-1] == UserTurn(DEFAULT_COMPACTION_PROMPT)


async def test_overflow_right_after_a_summary_is_an_error():
    agent, model, log = build([
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [text("summary"), usage(input_tokens=950, output_tokens=10)],
        [fail(ContextWindowExceeded("still too long"))],
    ])
    await run(agent, messages=[user_message("go")])
    with pytest.raises(CompactionError, match="still does not fit"):
        await agent.invoke(mode="resume", session_id=SID)
    assert model.calls == 3


async def test_overflow_with_compaction_off_is_a_model_error():
    agent, model, log = build([[fail(ContextWindowExceeded("too long"))]], compaction_threshold=None)
    with pytest.raises(ContextWindowExceeded) as info:  # the provider's own error reaches the caller
        await run(agent, messages=[user_message("go")])
    assert isinstance(info.value, ModelError) and info.value.session_id is not None


async def test_summary_failure_writes_nothing_and_says_so():
    agent, model, log = build([
        [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)],
        [fail(RuntimeError("provider down"))],
    ])
    with pytest.raises(CompactionError, match="failed while writing the compaction summary.*provider down"):
        await run(agent, messages=[user_message("go")])
    assert kinds(await agent.transcript(SID)) == ["user", "assistant"]


async def test_empty_summary_is_an_error():
    agent, model, log = build([[text("a"), usage(input_tokens=900)], [text("   ")]])
    with pytest.raises(CompactionError, match="empty compaction summary"):
        await run(agent, messages=[user_message("go")])


# --------------------------------------------------------------------------- abort


async def test_abort_while_summarising_writes_no_summary_and_resume_compacts_again():
    started = asyncio.Event()
    never = asyncio.Event()
    calls = []

    async def reply(request):
        calls.append(request.purpose)
        if len(calls) == 1:
            return [tool_call("fetch", {"url": "a"}), usage(input_tokens=900)]
        if len(calls) == 2:
            started.set()
            await never.wait()  # a summary that never arrives: only abort ends it
        if len(calls) == 3:  # resume: the step is complete, so the next step runs and compacts again
            return [text("more"), usage(input_tokens=910)]
        if len(calls) == 4:
            return [text("the summary"), usage(input_tokens=920, output_tokens=4)]
        return [text("unexpected")]

    log = Log()
    agent = We0Agent(FunctionModel(reply, context_window=1000), tools=tools(log))
    abort = asyncio.Event()

    async def consume():
        return [e async for e in agent.stream(abort=abort, session_id=SID, messages=[user_message("go")])]

    task = asyncio.ensure_future(consume())
    await started.wait()
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    t = await agent.transcript(SID)
    assert kinds(t) == ["user", "assistant"]  # nothing of the summary
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.result == "compact" and calls == ["step", "summary", "step", "summary"]
    assert log.calls == [("fetch", {"url": "a"})]


# --------------------------------------------------------------------------- helpers


def test_shrink_keeps_an_earlier_summary_and_never_starts_with_a_result():
    history = [UserTurn(SUMMARY_PREFIX + "old")]
    for i in range(6):
        history += [UserTurn(f"q{i}"), AssistantTurn("", "", [ToolCall(f"c{i}", "t", {})]),
                    ToolResult(f"c{i}", "t", "r" * 5000)]
    level1 = shrink(history, 1)
    assert len(level1) == len(history) and all(len(getattr(m, "content", "")) < 2100 for m in level1)
    level3 = shrink(history, 3)
    assert level3[0] == UserTurn(SUMMARY_PREFIX + "old") and len(level3) < len(history) / 2
    assert not isinstance(level3[1], ToolResult)


@pytest.mark.parametrize("provider, advice", [
    (None, "Give its steps usage(...) to drive compaction by tokens."),
    ("openai", "If its server can send usage in streams, turn it on."),
])
async def test_the_no_usage_warning_gives_advice_that_fits_the_model(caplog, provider, advice):
    # a test double has no server to turn usage on in: its script is what says what a call used
    model = ScriptedModel([[text("x" * 400)], [text("ok")]], context_window=150, provider=provider)
    agent = We0Agent(model, compaction_threshold=0.5)
    with caplog.at_level("WARNING", logger="we0nb"):
        await agent.invoke(session_id=SID, messages=[user_message("hi")])
    warned = [r.getMessage() for r in caplog.records if "reports no token usage" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith(advice)


async def test_a_model_that_says_why_it_reports_no_usage_is_not_warned_about(caplog):
    """local_model's server (llama-cpp-python) sends no usage in streams: nothing can be turned on,
    so tutorial 05 printed a warning with advice its reader could not follow."""
    model = ScriptedModel([[text("x" * 400)], [text("ok")]], context_window=150, provider="openai")
    model.usage_unreported = "its server sends none in streams"
    agent = We0Agent(model, compaction_threshold=0.5)
    with caplog.at_level("INFO", logger="we0nb"):
        await agent.invoke(session_id=SID, messages=[user_message("hi")])
    said = [r for r in caplog.records if "reports no token usage" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]
    assert "(its server sends none in streams)" in said[0].getMessage()

"""The reliability defects of the Core v2 issue, engine side: each test failed on the old core."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any, AsyncIterator

import pytest

import we0nb._ids as ids_module
from we0nb import (
    FunctionModel, LeaseLostError, MemoryPersistence, ModelError, ModelProviderError, PersistenceError,
    ScriptedModel, SessionBusyError, We0Agent, text, tool, tool_call, user_message,
)
from we0nb._ids import IdSequence, new_id
from we0nb.models.base import Model, ModelRequest, TextDelta
from we0nb.testing import fail, usage


def agent_with(steps, tools=(), persistence=None, **kw) -> We0Agent:
    return We0Agent(ScriptedModel(steps), tools=list(tools), persistence=persistence or MemoryPersistence(), **kw)


# --------------------------------------------------------------------------- 1. a run that loses its lease


async def test_a_run_that_loses_its_lease_stops_and_writes_nothing_more() -> None:
    p = MemoryPersistence()
    ran: list[str] = []

    @tool
    def first() -> str:
        ran.append("first")
        # another host takes the session over while this call runs (the lease expired, say);
        # the store's lease table is private: set on purpose to simulate the takeover
        p._leases["s"] = "otherhost:1:run_other"
        return "one"

    @tool
    def second() -> str:
        ran.append("second")
        return "two"

    agent = agent_with([[tool_call("first", {}), tool_call("second", {})], [text("never")]],
                       tools=[first, second], persistence=p)
    with pytest.raises(LeaseLostError) as info:
        await agent.invoke(session_id="s", messages=[user_message("go")])
    assert isinstance(info.value, SessionBusyError) and "otherhost:1:run_other" in str(info.value)
    assert ran == ["first"]  # the next write-ahead was refused: the second tool never ran
    t = await p.load_transcript("s")
    calls = t.messages[-1].tool_parts
    # nothing after the takeover was written: "first" stays running, "second" pending
    assert [c.state.status for c in calls] == ["running", "pending"]
    assert p._leases["s"] == "otherhost:1:run_other"  # and the other run's lease is left alone


# --------------------------------------------------------------------------- 2. ids and clocks


async def test_a_turn_from_a_process_whose_clock_is_behind_sorts_after_the_old_turns(monkeypatch) -> None:
    p = MemoryPersistence()
    agent = agent_with([[text("first answer")], [text("second answer")]], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("one")])
    real = time.time_ns
    monkeypatch.setattr(ids_module.time, "time_ns", lambda: real() - 3600 * 10**9)  # an hour behind
    monkeypatch.setattr(ids_module, "_last", 0)  # a fresh process: nothing generated yet
    await agent.invoke(session_id="s", messages=[user_message("two")])
    t = await agent.transcript("s")
    assert [m.text for m in t.messages] == ["one", "first answer", "two", "second answer"]


def test_ids_are_unique_and_increasing_across_threads() -> None:
    out: dict[int, list[str]] = {}

    def work(k: int) -> None:
        out[k] = [new_id("prt") for _ in range(2000)]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    every = [i for ids in out.values() for i in ids]
    assert len(set(every)) == len(every)
    assert all(ids == sorted(ids) for ids in out.values())


def test_an_id_sequence_starts_after_the_stored_ids() -> None:
    future = f"msg_{(time.time_ns() // 1000 + 10**9):014x}0000000000"
    seq = IdSequence([future, "not-ours", "prt_zz"])
    assert seq("prt") > "prt_" + future[4:] and seq("msg") > future


# --------------------------------------------------------------------------- 3. compaction is one commit


class CrashOnSummary(MemoryPersistence):
    """A store whose process dies (KeyboardInterrupt) at the commit that holds a summary."""

    def __init__(self) -> None:
        super().__init__()
        self.crash = True
        self.commits: list[list[str]] = []

    async def commit(self, writes: Any, **kw: Any) -> None:
        kinds = ["summary" if m is not None and getattr(m, "summary", False) else
                 (m.role if m is not None else "parts") for m, _, _ in writes]
        if "summary" in kinds and self.crash:
            raise KeyboardInterrupt
        self.commits.append(kinds)
        await super().commit(writes, **kw)


def compaction_script(log: list[str]):
    @tool
    def fetch(url: str) -> str:
        log.append(url)
        return f"page of {url}"

    def reply(request: ModelRequest):
        if request.purpose == "summary":
            return [text("fetch(a) is DONE."), usage(input_tokens=950, output_tokens=10)]
        last = request.messages[-1]
        summarised = any(getattr(m, "text", "").startswith("Summary of") for m in request.messages)
        if getattr(last, "role", "") == "tool" or summarised:
            return [text("Page a says hi."), usage(input_tokens=60, output_tokens=5)]
        return [tool_call("fetch", {"url": "a"}), usage(input_tokens=900, output_tokens=10)]

    return fetch, FunctionModel(reply, context_window=1000)


async def test_compaction_writes_summary_and_tail_in_one_commit() -> None:
    log: list[str] = []
    fetch, model = compaction_script(log)
    p = CrashOnSummary()
    p.crash = False
    agent = We0Agent(model, tools=[fetch], persistence=p)
    first = await agent.invoke(session_id="s", messages=[user_message("summarise page a")])
    assert first.result == "compact"
    assert ["summary", "user"] in p.commits  # the summary and the re-sent user message: one commit
    second = await agent.invoke(mode="resume", session_id="s")
    assert second.result == "stop" and second.text == "Page a says hi." and log == ["a"]


async def test_a_crash_at_compactions_commit_leaves_a_turn_that_resume_finishes() -> None:
    log: list[str] = []
    fetch, model = compaction_script(log)
    p = CrashOnSummary()
    agent = We0Agent(model, tools=[fetch], persistence=p)
    with pytest.raises(KeyboardInterrupt):  # the process dies at compaction's commit: nothing of it is stored
        await agent.invoke(session_id="s", messages=[user_message("summarise page a")])
    t = await agent.transcript("s")
    assert [m.info.role for m in t.messages] == ["user", "assistant"] and not any(m.is_summary for m in t.messages)
    assert t.needs_resume  # the turn is not over
    p.crash = False
    r = await agent.invoke(mode="resume", session_id="s")
    assert r.result == "stop" and r.text == "Page a says hi." and log == ["a"]


async def test_an_overflowing_step_is_closed_in_the_same_commit_as_the_summary() -> None:
    from we0nb.errors import ContextWindowExceeded

    def reply(request: ModelRequest):
        if request.purpose == "summary":
            return [text("short summary"), usage(input_tokens=500, output_tokens=5)]
        if any(getattr(m, "text", "").startswith("Summary of") for m in request.messages):
            return [text("answered after the summary")]
        return [text("partial"), fail(ContextWindowExceeded("too long"))]

    p = CrashOnSummary()
    p.crash = False
    agent = We0Agent(FunctionModel(reply, context_window=1000), persistence=p)
    r = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert r.result == "compact"
    assert ["assistant", "summary", "user"] in p.commits
    assert (await agent.invoke(mode="resume", session_id="s")).text == "answered after the summary"


# --------------------------------------------------------------------------- 4. KeyboardInterrupt


class InterruptedModel(Model):
    model_id = "interrupted"

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:  # type: ignore[override]
        yield TextDelta("Half of ")
        yield TextDelta("an answer")
        raise KeyboardInterrupt


async def test_keyboard_interrupt_from_the_model_keeps_the_streamed_text() -> None:
    p = MemoryPersistence()
    agent = We0Agent(InterruptedModel(), persistence=p, flush_interval=60)
    with pytest.raises(KeyboardInterrupt):
        await agent.invoke(session_id="s", messages=[user_message("go")])
    last = (await p.load_transcript("s")).messages[-1]
    assert last.text == "Half of an answer" and last.info.time.completed is None and last.info.error is None


# --------------------------------------------------------------------------- 5. JSON-string arguments


async def test_tool_arguments_given_as_json_text_are_persisted_as_what_ran() -> None:
    got: list[dict] = []

    @tool(side_effects=False)
    def lookup(city: str, days: int) -> str:
        got.append({"city": city, "days": days})
        return "sunny"

    p = MemoryPersistence()
    model = ScriptedModel([[tool_call("lookup", '{"city": "Lisbon", "days": 2}')], [text("ok")]])
    agent = We0Agent(model, tools=[lookup], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("weather?")])
    call = (await p.load_transcript("s")).messages[1].tool_parts[0]
    assert got == [{"city": "Lisbon", "days": 2}]
    assert call.state.input == {"city": "Lisbon", "days": 2} and call.state.status == "completed"
    sent = model.requests[1].messages[-2].tool_calls[0]  # what the model is shown of its call
    assert sent.input == {"city": "Lisbon", "days": 2}


async def test_a_recall_of_a_json_text_call_runs_with_its_arguments() -> None:
    got: list[str] = []

    @tool(side_effects=False)
    async def slow(city: str) -> str:
        got.append(city)
        if len(got) == 1:
            await asyncio.Event().wait()  # hangs until aborted
        return city

    p = MemoryPersistence()
    model = ScriptedModel([[tool_call("slow", '{"city": "Porto"}')], [text("done")]])
    agent = We0Agent(model, tools=[slow], persistence=p)
    abort = asyncio.Event()
    task = asyncio.ensure_future(agent.invoke(abort=abort, session_id="s", messages=[user_message("x")]))
    while not got:
        await asyncio.sleep(0.01)
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await agent.invoke(mode="resume", session_id="s")
    assert got == ["Porto", "Porto"] and r.text == "done"


# --------------------------------------------------------------------------- 6. surrogates


async def test_split_and_lone_surrogates_are_repaired_and_no_text_is_lost() -> None:
    p = MemoryPersistence()
    model = ScriptedModel([[text(["Smile ", "\ud83d", "\ude00", " and a lone \udc00 half, ", "end"])]])
    agent = We0Agent(model, persistence=p)
    deltas = [e["text"] async for e in agent.stream(session_id="s", messages=[user_message("go")])
              if e["type"] == "text-delta"]
    expected = "Smile \U0001F600 and a lone \ufffd half, end"
    assert "".join(deltas) == expected
    assert (await p.load_transcript("s")).messages[-1].text == expected


async def test_a_lone_high_surrogate_before_an_ascii_delta_stays_in_its_place() -> None:
    p = MemoryPersistence()
    model = ScriptedModel([[text(["lone ", "\ud800", " surrogate ", "\udfff", " end"])]])
    agent = We0Agent(model, persistence=p)
    deltas = [e["text"] async for e in agent.stream(session_id="s", messages=[user_message("go")])
              if e["type"] == "text-delta"]
    expected = "lone \ufffd surrogate \ufffd end"  # (the first half came out after " surrogate ")
    assert "".join(deltas) == expected
    assert (await p.load_transcript("s")).messages[-1].text == expected


async def test_a_lone_surrogate_in_a_tool_output_or_a_user_message_is_stored() -> None:
    @tool(side_effects=False)
    def echo() -> str:
        return "bad \ud800 half"

    p = MemoryPersistence()
    agent = agent_with([[tool_call("echo", {})], [text("ok")]], tools=[echo], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("hi \udfff")])
    t = await p.load_transcript("s")
    assert t.messages[0].text == "hi \ufffd" and t.messages[1].tool_parts[0].state.output == "bad \ufffd half"


async def test_lone_surrogates_in_tool_arguments_are_stored() -> None:
    got: list[str] = []

    @tool(side_effects=False)
    def say(words: str) -> str:
        got.append(words)
        return "said"

    p = MemoryPersistence()
    agent = agent_with([[tool_call("say", '{"words": "hi \\ud83d"}')], [text("ok")]], tools=[say], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    call = (await p.load_transcript("s")).messages[1].tool_parts[0]
    assert call.state.input == {"words": "hi \ufffd"} and got == ["hi \ufffd"]


# --------------------------------------------------------------------------- 13. nothing swallowed


async def test_a_tool_raising_cancelled_error_without_an_abort_is_a_tool_error() -> None:
    @tool(side_effects=False)
    async def quits() -> str:
        raise asyncio.CancelledError()

    p = MemoryPersistence()
    agent = agent_with([[tool_call("quits", {})], [text("carried on")]], tools=[quits], persistence=p)
    r = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert r.text == "carried on"
    call = (await p.load_transcript("s")).messages[1].tool_parts[0]
    assert call.state.status == "error" and "CancelledError" in call.state.error


async def test_a_stored_output_that_no_longer_validates_is_an_error_not_silence() -> None:
    from pydantic import BaseModel

    from we0nb import OutputValidationError, output

    class Old(BaseModel):
        city: str

    class New(BaseModel):
        zip_code: int

    p = MemoryPersistence()
    await We0Agent(ScriptedModel([[output(Old(city="Lisbon"))]]), persistence=p, output_type=Old).invoke(
        session_id="s", messages=[user_message("where?")])
    with pytest.raises(OutputValidationError, match="does not validate"):
        await We0Agent(ScriptedModel([]), persistence=p, output_type=New).invoke(mode="resume", session_id="s")


class ClosingFails(Model):
    model_id = "closing-fails"

    def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            try:
                yield TextDelta("partial")
                raise ConnectionError("socket closed")
            finally:
                pass

        class Stream:
            def __init__(self) -> None:
                self.it = gen()

            def __aiter__(self) -> "Stream":
                return self

            async def __anext__(self) -> Any:
                return await self.it.__anext__()

            async def aclose(self) -> None:
                raise RuntimeError("close failed too")

        return Stream()


async def test_a_failure_to_close_the_stream_never_hides_the_model_error(caplog) -> None:
    agent = We0Agent(ClosingFails())
    with pytest.raises(ModelError, match="socket closed"):
        await agent.invoke(session_id="s", messages=[user_message("go")])
    assert "close failed too" in caplog.text


class StoreFailsDuringStream(MemoryPersistence):
    def __init__(self) -> None:
        super().__init__()
        self.fail_parts = False

    async def commit(self, writes: Any, **kw: Any) -> None:
        if self.fail_parts and any(m is None for m, _, _ in writes):
            raise PersistenceError("disk full")
        await super().commit(writes, **kw)


async def test_a_storage_failure_during_a_stream_is_a_persistence_error_not_a_model_failure() -> None:
    p = StoreFailsDuringStream()

    def reply(request: ModelRequest):
        p.fail_parts = True
        return [text(["a", "b", "c"])]

    agent = We0Agent(FunctionModel(reply), persistence=p, flush_interval=0)
    with pytest.raises(PersistenceError, match="disk full"):
        await agent.invoke(session_id="s", messages=[user_message("go")])
    p.fail_parts = False
    last = (await p.load_transcript("s")).messages[-1]
    assert last.info.error is None  # never recorded as "the model failed"


# --------------------------------------------------------------------------- 14. outputs and call ids


async def test_nan_output_is_strict_json_and_an_unserialisable_result_says_the_tool_ran() -> None:
    ledger: list[str] = []

    @tool(side_effects=False)
    def ratio() -> dict:
        return {"value": math.nan, "max": math.inf}

    @tool
    def book() -> object:
        ledger.append("booked")
        return object()  # the booking happened; its return value cannot be stored

    p = MemoryPersistence()
    agent = agent_with([[tool_call("ratio", {}), tool_call("book", {})], [text("ok")]], tools=[ratio, book],
                       persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    r, b = (await p.load_transcript("s")).messages[1].tool_parts
    import json

    assert json.loads(r.state.output) == {"value": "NaN", "max": "Infinity"}
    assert ledger == ["booked"] and b.state.status == "completed"
    assert "The tool ran" in b.state.output and b.state.metadata["output_error"]


async def test_metadata_a_tool_returns_that_is_not_json_is_left_out_saying_so(store) -> None:
    from we0nb import ToolReturn

    ledger: list[str] = []

    @tool
    def book() -> ToolReturn:
        ledger.append("booked")
        return ToolReturn("booked", metadata={"receipt": object(), "ok": 1})

    p = store
    agent = agent_with([[tool_call("book", {})], [text("ok")]], tools=[book], persistence=p)
    result = await agent.invoke(session_id="s", messages=[user_message("go")])  # (it ended in a raw serialization error)
    (b,) = (await p.load_transcript("s")).messages[1].tool_parts
    assert result.result == "stop" and ledger == ["booked"]
    assert (b.state.status, b.state.output) == ("completed", "booked") and "ok" not in b.state.metadata
    assert b.state.metadata["output_error"].startswith("the metadata the tool returned was left out")


async def test_duplicate_call_ids_in_a_step_do_not_collide() -> None:
    @tool(side_effects=False)
    def echo(x: int) -> str:
        return f"echo {x}"

    p = MemoryPersistence()
    model = ScriptedModel([[tool_call("echo", {"x": 1}, call_id="call_1"), tool_call("echo", {"x": 2}, call_id="call_1")],
                           [text("ok")]])
    agent = We0Agent(model, tools=[echo], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    calls = (await p.load_transcript("s")).messages[1].tool_parts
    assert len({c.call_id for c in calls}) == 2
    sent = model.requests[1].messages
    results = {m.call_id: m.content for m in sent if getattr(m, "role", "") == "tool"}
    assert sorted(results.values()) == ["echo 1", "echo 2"] and set(results) == {c.call_id for c in calls}


# --------------------------------------------------------------------------- errors reach the caller as themselves


async def test_a_provider_error_reaches_the_caller_as_itself_with_ids() -> None:
    from we0nb import ModelAuthenticationError

    p = MemoryPersistence()
    agent = agent_with([[text("par"), fail(ModelAuthenticationError("bad key", status_code=401))]], persistence=p)
    with pytest.raises(ModelAuthenticationError) as info:
        await agent.invoke(session_id="s", messages=[user_message("go")])
    last = (await p.load_transcript("s")).messages[-1]
    assert isinstance(info.value, ModelProviderError) and isinstance(info.value, ModelError)
    assert (info.value.session_id, info.value.message_id) == ("s", last.info.id)
    assert last.info.error.reason == "ModelAuthenticationError" and last.text == "par"

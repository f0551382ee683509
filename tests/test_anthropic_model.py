"""AnthropicModel beyond the conformance suite: the request it builds, caching, thinking,
redacted thinking, the stream's corner cases, errors particular to the Messages API, and
construction. End-to-end tests go through the local server of :mod:`fake_anthropic`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from pydantic import BaseModel

pytest.importorskip("anthropic")

import fake_anthropic as fa  # noqa: E402
from we0nb import We0Agent, tool, user_message  # noqa: E402
from we0nb.errors import ContextWindowExceeded, ModelProviderError  # noqa: E402
from we0nb.messages import ReasoningPart  # noqa: E402
from we0nb.models._anthropic_wire import CONTINUE_PROMPT, StreamAccumulator, to_anthropic_messages  # noqa: E402
from we0nb.models.anthropic import DEFAULT_MAX_TOKENS, AnthropicModel  # noqa: E402
from we0nb.models.base import (  # noqa: E402
    AssistantTurn, ModelRequest, ReasoningBlock, ReasoningDelta, ReasoningEnd, TextDelta, ToolCall, ToolCallEvent,
    ToolResult, ToolSchema, UserTurn,
)


@pytest.fixture
async def server():
    s = fa.FakeAnthropic()
    yield s
    s.stop()


@pytest.fixture
async def models():
    made: list[AnthropicModel] = []
    yield made
    for m in made:
        await m.aclose()


def make(server, models, **kw) -> AnthropicModel:
    kw.setdefault("api_key", "sk-ant-test")
    kw.setdefault("retry_base_delay", 0.01)
    models.append(AnthropicModel("claude-test", base_url=server.url, **kw))
    return models[-1]


@tool(side_effects=False)
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


# --------------------------------------------------------------------------- the request


def test_history_mapping():
    req = ModelRequest(messages=[
        UserTurn("q"),
        AssistantTurn("let me", "ab", [ToolCall("c1", "lookup", {"key": "é"}), ToolCall("c2", "lookup", {})],
                      reasoning_blocks=[ReasoningBlock("a", "sig-a"), ReasoningBlock("", None, "REDACTED"),
                                        ReasoningBlock("b", "sig-b")]),
        ToolResult("c1", "lookup", "boom", True), ToolResult("c2", "lookup", ""),
        UserTurn(""), UserTurn("and then?"),
        AssistantTurn("partial answer", "unsigned thoughts"),
    ], tools=[ToolSchema("lookup", "", {"type": "object"})], system="sys")
    out = to_anthropic_messages(req)
    assert [m["role"] for m in out] == ["user", "assistant", "user", "assistant", "user"]
    assert out[1]["content"] == [
        {"type": "thinking", "thinking": "a", "signature": "sig-a"},
        {"type": "redacted_thinking", "data": "REDACTED"},
        {"type": "thinking", "thinking": "b", "signature": "sig-b"},
        {"type": "text", "text": "let me"},
        {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"key": "é"}},
        {"type": "tool_use", "id": "c2", "name": "lookup", "input": {}},
    ]
    # tool results first, then the next user text, in one user message; empty text is not sent
    assert out[2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "boom", "is_error": True},
                                 {"type": "tool_result", "tool_use_id": "c2"},
                                 {"type": "text", "text": "and then?"}]
    # unsigned reasoning is not sent; an interrupted answer is followed by a user turn
    assert out[3]["content"] == [{"type": "text", "text": "partial answer"}]
    assert out[4]["content"] == [{"type": "text", "text": CONTINUE_PROMPT}]


async def test_request_defaults_and_options(server, models):
    server.play(fa.stream(fa.reply(fa.text_block(0, "hi"))), fa.stream(fa.reply(fa.text_block(0, "hi"))))
    agent = We0Agent(make(server, models, stop_sequences=["END"], metadata={"user_id": "u1"}), system_prompt="sys")
    await agent.invoke(session_id="s", messages=[user_message("x")])
    body = server.bodies()[0]
    assert body["model"] == "claude-test" and body["stream"] is True and body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert body["system"] == "sys" and body["stop_sequences"] == ["END"] and body["metadata"] == {"user_id": "u1"}
    assert "tools" not in body and "tool_choice" not in body and "thinking" not in body
    headers = server.requests[0]["headers"]
    assert "sk-ant-test" in (headers.get("x-api-key") or headers.get("authorization") or "")
    assert headers.get("anthropic-version")
    agent = We0Agent(make(server, models, max_tokens=512))
    await agent.invoke(session_id="s2", messages=[user_message("x")])
    assert server.bodies()[1]["max_tokens"] == 512


async def test_prompt_cache_places_three_breakpoints(server, models, tmp_path):
    from we0nb.persistence.sql import SqlPersistence

    server.play(fa.stream(fa.reply(fa.tool_block(0, "t1", "lookup", '{"key": "a"}'),
                                   input_tokens=10, cache_write=2000)),
                fa.stream(fa.reply(fa.text_block(0, "done"), input_tokens=15, cache_read=2000)))
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    agent = We0Agent(make(server, models, prompt_cache=True), tools=[lookup], system_prompt="sys",
                     persistence=store)
    try:
        result = await agent.invoke(session_id="s", messages=[user_message("x")])
    finally:
        await store.close()
    body = server.bodies()[1]
    eph = {"type": "ephemeral"}
    assert body["system"] == [{"type": "text", "text": "sys", "cache_control": eph}]
    assert body["tools"][-1]["cache_control"] == eph
    last = body["messages"][-1]["content"]
    assert last[-1]["cache_control"] == eph and last[-1]["type"] == "tool_result"
    marks = [b for m in body["messages"] for b in m["content"] if "cache_control" in b]
    assert len(marks) == 1  # the latest turn only: four breakpoints at most are allowed
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")  # cache writes are stored (in the JSON)
    try:
        t = await store.load_transcript("s")
    finally:
        await store.close()
    first, second = t.messages[1].info.usage, t.messages[2].info.usage
    assert (first.input_tokens, first.cached_tokens, first.cache_write_tokens) == (2010, 0, 2000)
    assert (second.input_tokens, second.cached_tokens, second.cache_write_tokens) == (2015, 2000, 0)
    assert result.usage.cache_write_tokens == 2000 and result.usage.cached_tokens == 2000


# --------------------------------------------------------------------------- thinking


async def test_redacted_and_signed_thinking_go_back_in_order(server, models):
    server.play(
        fa.stream(fa.reply(fa.thinking_block(0, "First.", signature="S1"), fa.redacted_block(1, "ENCRYPTED"),
                           fa.thinking_block(2, signature="S3"),  # a block whose text was omitted
                           fa.tool_block(3, "t1", "lookup", '{"key": "a"}'))),
        fa.stream(fa.reply(fa.text_block(0, "done"))))
    thinking = {"type": "enabled", "budget_tokens": 1024}
    agent = We0Agent(make(server, models, thinking=thinking), tools=[lookup])
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("x")])]
    ends = [e["part"] for e in events if e["type"] == "reasoning-end"]
    assert [(p.text, p.signature, p.redacted) for p in ends] == [("First.", "S1", None), ("", None, "ENCRYPTED"),
                                                                ("", "S3", None)]
    t = await agent.transcript("s")
    parts = [p for p in t.messages[1].parts if isinstance(p, ReasoningPart)]
    assert [(p.text, p.signature, p.redacted) for p in parts] == [(p.text, p.signature, p.redacted) for p in ends]
    body = server.bodies()[1]
    assert body["thinking"] == thinking
    assert body["messages"][1]["content"][:3] == [
        {"type": "thinking", "thinking": "First.", "signature": "S1"},
        {"type": "redacted_thinking", "data": "ENCRYPTED"},
        {"type": "thinking", "thinking": "", "signature": "S3"}]


async def test_structured_output_with_thinking_is_not_forced(server, models):
    class Answer(BaseModel):
        value: int

    server.play(fa.stream(fa.reply(fa.thinking_block(0, "hmm"),
                                   fa.tool_block(1, "t1", "final_result", '{"value": 7}'))))
    agent = We0Agent(make(server, models, thinking={"type": "enabled", "budget_tokens": 1024}), output_type=Answer)
    assert (await agent.invoke(session_id="s", messages=[user_message("x")])).output == Answer(value=7)
    assert "tool_choice" not in server.bodies()[0]  # the API forbids a forced tool with thinking


# --------------------------------------------------------------------------- the stream


def test_accumulator_rules():
    acc = StreamAccumulator()
    feed = acc.feed
    assert feed(fa.message_start(5, cache_write=1, cache_read=2)) == []
    assert feed({"type": "some_future_event", "x": 1}) == [] and feed(fa.ping()) == []
    assert feed(fa.block_start(0, {"type": "thinking", "thinking": ""})) == []
    assert feed(fa.block_delta(0, {"type": "thinking_delta", "thinking": "a"})) == [ReasoningDelta("a")]
    assert feed(fa.block_delta(0, {"type": "signature_delta", "signature": "S"})) == []
    assert feed(fa.block_stop(0)) == [ReasoningEnd(signature="S")]
    assert feed(fa.block_start(1, {"type": "text", "text": "He"})) == [TextDelta("He")]
    assert feed(fa.block_delta(1, {"type": "citations_delta", "citation": {}})) == []
    assert feed(fa.block_stop(1)) == []
    feed(fa.block_start(2, {"type": "tool_use", "id": "t", "name": "f", "input": {}}))
    feed(fa.block_delta(2, {"type": "input_json_delta", "partial_json": '[1, 2]'}))
    assert feed(fa.block_stop(2)) == [ToolCallEvent("t", "f", "[1, 2]")]  # not an object: passed on raw
    feed(fa.message_delta("tool_use", 30, thinking_tokens=12))
    with pytest.raises(ModelProviderError, match="ended before"):
        acc.finish()
    feed(fa.message_stop())
    fin = acc.finish()
    assert fin.reason == "tool-calls"
    assert (fin.usage.input_tokens, fin.usage.output_tokens, fin.usage.reasoning_tokens) == (8, 30, 12)
    with pytest.raises(ModelProviderError, match="malformed.*never started"):
        StreamAccumulator().feed(fa.block_delta(3, {"type": "text_delta", "text": "x"}))


@pytest.mark.parametrize("stop,reason", [("max_tokens", "length"), ("refusal", "content-filter"),
                                         ("stop_sequence", "stop"), ("pause_turn", "pause-turn"),
                                         ("model_context_window_exceeded", "length")])
def test_stop_reasons(stop, reason):
    acc = StreamAccumulator()
    for ev in fa.reply(fa.text_block(0, "x"), stop=stop):
        acc.feed(ev)
    assert acc.finish().reason == reason


async def test_an_error_event_before_any_output_is_retried(server, models):
    server.play(fa.stream([fa.message_start(), fa.ping(), fa.error_event("overloaded_error", "Overloaded")]),
                fa.stream(fa.reply(fa.text_block(0, "ok"))))
    agent = We0Agent(make(server, models))
    assert (await agent.invoke(session_id="s", messages=[user_message("x")])).text == "ok"
    assert len(server.requests) == 2


async def test_a_stream_that_just_ends_is_an_error(server, models):
    server.play(fa.stream([fa.message_start(), *fa.text_block(0, "abc")]))  # no message_delta / message_stop
    agent = We0Agent(make(server, models))
    with pytest.raises(ModelProviderError, match="ended before"):
        await agent.invoke(session_id="s", messages=[user_message("x")])
    msg = (await agent.transcript("s")).last_assistant
    assert msg.text == "abc" and msg.info.time.completed is None


@pytest.mark.parametrize("status,etype,message", [
    (400, "invalid_request_error", "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000"),
    (413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
])
async def test_other_context_overflows(server, models, status, etype, message):
    server.play(fa.error(etype, message, status=status))
    agent = We0Agent(make(server, models), compaction_threshold=None)
    with pytest.raises(ContextWindowExceeded) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert info.value.status_code == status and len(server.requests) == 1


# --------------------------------------------------------------------------- construction


def test_construction_errors(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4-5")
    with pytest.raises(TypeError, match="stream"):
        AnthropicModel("m", api_key="k", stream=False)
    with pytest.raises(ValueError, match="budget_tokens=2048 must be below max_tokens=1024"):
        AnthropicModel("m", api_key="k", max_tokens=1024, thinking={"type": "enabled", "budget_tokens": 2048})
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicModel("m", api_key="k", max_tokens=0)
    with pytest.raises(TypeError, match="model name"):
        AnthropicModel("", api_key="k")
    m = AnthropicModel("m", base_url="http://127.0.0.1:1")  # a proxy may need no key
    assert m.model_id == "m" and m.context_window is None and m.max_tokens == DEFAULT_MAX_TOKENS
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    assert AnthropicModel("m")._api_key == "sk-env"


def test_importable_without_the_extra_and_one_clear_line_on_use():
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "anthropic":
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from we0nb.models import AnthropicModel
        try:
            AnthropicModel("claude-sonnet-4-5", api_key="k")
        except ImportError as e:
            print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        "ERROR AnthropicModel needs the 'anthropic' package, which is not installed: pip install \"we0nb[anthropic]\""]

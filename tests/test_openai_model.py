"""OpenAIChatModel against a local chat-completions server (127.0.0.1, started here), end to end.

The server (:mod:`openai_fake`) speaks the streaming protocol (SSE over chunked HTTP/1.1)
and plays a script: one response per request. It records every request and notices when a
client goes away; like llama-cpp-python's server it refuses ``"content": null``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from pydantic import BaseModel

pytest.importorskip("openai")

from openai_fake import (  # noqa: E402,F401  (other test files may import these from here too)
    FakeServer,
    Responder,
    ScriptedHandler,
    chunk,
    empty_stream,
    reject_json_schema,
    sse,
    status,
    words,
)

from we0nb import ModelError, We0Agent, tool, user_message  # noqa: E402
from we0nb.errors import ModelAuthenticationError, ModelProviderError  # noqa: E402
from we0nb.messages import ReasoningPart, ToolPart  # noqa: E402
from we0nb.models.base import AssistantTurn, ModelRequest, ToolCall, ToolResult, ToolSchema, UserTurn  # noqa: E402
from we0nb.models.openai import OpenAIChatModel, to_openai_messages  # noqa: E402

@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.stop()


def make_model(server: FakeServer, **kw: Any) -> OpenAIChatModel:
    kw.setdefault("api_key", "sk-test")
    kw.setdefault("retry_base_delay", 0.01)
    return OpenAIChatModel("test-model", base_url=server.url, **kw)


class Log:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []


def adder(log: Log):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        log.calls.append(("add", {"a": a, "b": b}))
        return a + b

    @tool(side_effects=False)
    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        log.calls.append(("mul", {"a": a, "b": b}))
        return a * b

    return [add, mul]


async def last_assistant(agent: We0Agent, sid: str):
    t = await agent.transcript(sid)
    return t.last_assistant


# --------------------------------------------------------------------------- streaming


async def test_plain_text_reasoning_and_usage(server):
    server.play(sse([
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": "Let me "}),
        chunk({"reasoning_content": "think."}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo!"}),
        chunk({}, "stop"),
        chunk(usage={"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                     "prompt_tokens_details": {"cached_tokens": 4},
                     "completion_tokens_details": {"reasoning_tokens": 2}}),
    ]))
    agent = We0Agent(make_model(server), system_prompt="Be brief.")
    events = [e async for e in agent.stream(session_id="s1", messages=[user_message("hi")])]
    result = events[-1]["result"]
    assert result.result == "stop" and result.text == "Hello!"
    assert [e["text"] for e in events if e["type"] == "text-delta"] == ["Hel", "lo!"]
    assert [e["text"] for e in events if e["type"] == "reasoning-delta"] == ["Let me ", "think."]
    msg = await last_assistant(agent, "s1")
    assert msg.info.finish_reason == "stop" and msg.info.time.completed is not None
    assert msg.info.model_id == "test-model"
    u = msg.info.usage
    assert (u.input_tokens, u.output_tokens, u.cached_tokens, u.reasoning_tokens) == (12, 5, 4, 2)
    assert [p.text for p in msg.parts if isinstance(p, ReasoningPart)] == ["Let me think."]
    # what the server received
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"].get("authorization") == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "test-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert "tools" not in body and "tool_choice" not in body


async def test_reasoning_field_of_other_servers_and_length_finish(server):
    # Ollama / newer vLLM name the field "reasoning"; a server sending both is not doubled
    server.play(sse([
        chunk({"reasoning": "a"}),
        chunk({"reasoning": "b", "reasoning_content": "b"}),
        chunk({"content": "cut sho"}),
        chunk({}, "length"),
    ]))
    agent = We0Agent(make_model(server, temperature=0.2, stream_usage=False))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "cut sho"
    msg = await last_assistant(agent, "s")
    assert msg.info.finish_reason == "length"
    assert [p.text for p in msg.parts if isinstance(p, ReasoningPart)] == ["ab"]
    body = server.bodies()[0]
    assert body["temperature"] == 0.2 and "stream_options" not in body


async def test_tool_call_arguments_split_across_chunks(server):
    server.play(
        sse([
            chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": "call_a", "type": "function", "function": {"name": "add", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': 1, "'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'b": 2}'}}]}),
            chunk({}, "tool_calls"),
            chunk(usage={"prompt_tokens": 30, "completion_tokens": 9}),
        ]),
        sse(words("It is ", "3.")),
    )
    log = Log()
    agent = We0Agent(make_model(server), tools=adder(log))
    result = await agent.invoke(session_id="s", messages=[user_message("1+2?")])
    assert result.text == "It is 3." and result.steps == 2
    assert log.calls == [("add", {"a": 1, "b": 2})]
    first, second = server.bodies()
    tools = {t["function"]["name"]: t for t in first["tools"]}
    assert set(tools) == {"add", "mul"} and tools["add"]["type"] == "function"
    assert tools["add"]["function"]["description"] == "Add two integers."
    assert set(tools["add"]["function"]["parameters"]["properties"]) == {"a", "b"}
    assert "tool_choice" not in first
    assistant, result_msg = second["messages"][1], second["messages"][2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_a"
    assert assistant["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert result_msg == {"role": "tool", "tool_call_id": "call_a", "content": "3"}
    t = await agent.transcript("s")
    step1 = t.messages[1]
    assert step1.info.finish_reason == "tool-calls" and step1.info.usage.input_tokens == 30


async def test_parallel_tool_calls_interleaved(server):
    server.play(
        sse([
            chunk({"tool_calls": [
                {"index": 0, "id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2,'}},
                {"index": 1, "id": "call_1", "type": "function", "function": {"name": "mul", "arguments": '{"a"'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": ': 3, "b": 4}'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "b": 5}'}}]}),
            chunk({}, "tool_calls"),
        ]),
        sse(words("7 and 12")),
    )
    log = Log()
    agent = We0Agent(make_model(server), tools=adder(log))
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("go")])]
    assert log.calls == [("add", {"a": 2, "b": 5}), ("mul", {"a": 3, "b": 4})]
    pending = [e["part"] for e in events if e["type"] == "tool" and e["part"].state.status == "pending"]
    assert [(p.call_id, p.tool) for p in pending] == [("call_0", "add"), ("call_1", "mul")]
    second = server.bodies()[1]["messages"]
    assert [c["id"] for c in second[1]["tool_calls"]] == ["call_0", "call_1"]
    assert [(m["tool_call_id"], m["content"]) for m in second[2:4]] == [("call_0", "7"), ("call_1", "12")]
    assert events[-1]["result"].text == "7 and 12"


async def test_structured_output_forces_a_tool_call(server):
    class Answer(BaseModel):
        value: int

    server.play(sse([
        chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                               "function": {"name": "final_result", "arguments": '{"value": 42}'}}]}),
        chunk({}, "tool_calls"),
    ]))
    agent = We0Agent(make_model(server), output_type=Answer)
    result = await agent.invoke(session_id="s", messages=[user_message("answer")])
    assert result.output == Answer(value=42)
    body = server.bodies()[0]
    assert body["tool_choice"] == "required"
    assert [t["function"]["name"] for t in body["tools"]] == ["final_result"]


async def test_odd_but_valid_chunks_are_tolerated(server):
    server.play(sse([
        b": keep-alive comment\n\n",
        chunk(),                                              # no choices at all
        {"id": "x", "object": "chat.completion.chunk"},       # no "choices" key
        chunk({"role": "assistant"}),                         # role only
        chunk({"content": None}),                             # null content
        {"id": "x", "choices": [{"index": 0, "delta": None, "finish_reason": None}]},
        chunk({"content": "ok"}, some_vendor_field={"x": 1}),
        # a tool call without an index (some servers) and unparseable arguments
        chunk({"tool_calls": [{"id": "c9", "function": {"name": "add", "arguments": "{not json"}}]}),
        chunk({}, "tool_calls"),
    ]), sse(words("fixed")))
    log = Log()
    agent = We0Agent(make_model(server), tools=adder(log))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "fixed"
    t = await agent.transcript("s")
    (tp,) = [p for m in t.messages for p in m.parts if isinstance(p, ToolPart)]
    assert tp.call_id == "c9" and tp.state.status == "error"  # the raw text reached the engine
    assert "not json" in tp.state.error or "JSON" in tp.state.error
    assert log.calls == []
    assert t.messages[1].text == "ok"


async def test_malformed_chunk_fails_the_step_and_resume_continues(server):
    server.play(sse([chunk({"content": "Part"}), "{this is not json"]), sse(words("Whole answer.")))
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert isinstance(info.value, ModelProviderError) and "malformed" in str(info.value)
    msg = await last_assistant(agent, "s")
    assert msg.info.time.completed is None and msg.info.error.reason == "ModelProviderError"
    assert msg.text == "Part"
    assert len(server.requests) == 1  # text was already streamed: no silent retry
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.text == "Whole answer."


async def test_disconnect_mid_stream_leaves_the_message_resumable(server):
    server.play(sse([chunk({"content": "Hel"}), chunk({"content": "lo"})], cut=True),
                sse(words("Hello again.")))
    agent = We0Agent(make_model(server))
    events: list = []
    with pytest.raises(ModelProviderError) as info:
        async for e in agent.stream(session_id="s", messages=[user_message("x")]):
            events.append(e)
    assert isinstance(info.value, ModelProviderError)
    assert "broke off" in str(info.value) or "ended before" in str(info.value)
    assert [e["text"] for e in events if e["type"] == "text-delta"] == ["Hel", "lo"]
    msg = await last_assistant(agent, "s")
    assert msg.info.time.completed is None  # unfinished: resume repairs it
    assert msg.info.error is not None and msg.text == "Hello"
    assert len(server.requests) == 1
    events = [e async for e in agent.stream(mode="resume", session_id="s")]
    assert any(e["type"] == "recovery" and e["action"] == "close" for e in events)
    assert events[-1]["result"].text == "Hello again."
    t = await agent.transcript("s")
    assert t.messages[1].info.time.completed is not None and t.messages[1].text == "Hello"
    # the retried step sees the partial answer of the broken one
    assert server.bodies()[1]["messages"][-1] == {"role": "assistant", "content": "Hello"}


async def test_stream_ending_without_finish_reason_is_an_error(server):
    # a close-delimited body that just stops: no finish_reason ever arrived
    def respond(h: ScriptedHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(f"data: {json.dumps(chunk({'content': 'abc'}))}\n\n".encode())
        h.wfile.flush()
        h.close_connection = True

    server.play(respond)
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert isinstance(info.value, ModelProviderError)
    msg = await last_assistant(agent, "s")
    assert msg.text == "abc" and msg.info.time.completed is None


# --------------------------------------------------------------------------- HTTP errors


async def test_401_is_recorded_on_the_assistant_message_without_retry(server):
    server.play(status(401, {"error": {"message": "Incorrect API key provided: sk-test.",
                                       "type": "invalid_request_error", "code": "invalid_api_key"}}))
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelAuthenticationError) as info:  # the provider's own error, as itself
        await agent.invoke(session_id="s", messages=[user_message("x")])
    msg = await last_assistant(agent, "s")
    assert (info.value.session_id, info.value.message_id) == ("s", msg.info.id)
    assert msg.info.error.reason == "ModelAuthenticationError"
    assert "Incorrect API key provided" in msg.info.error.message
    assert "OPENAI_API_KEY" in msg.info.error.message and "401" in msg.info.error.message
    assert len(server.requests) == 1


async def test_429_honours_retry_after(server):
    server.play(status(429, {"error": {"message": "Rate limit reached", "type": "requests"}},
                       {"Retry-After": "1"}),
                sse(words("after the wait")))
    agent = We0Agent(make_model(server, retry_base_delay=0.0))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "after the wait"
    first, second = server.requests
    assert second["time"] - first["time"] >= 0.95  # the server asked for one second
    assert second["body"] == first["body"]
    t = await agent.transcript("s")
    assert len(t.messages) == 2 and t.messages[1].info.error is None  # one clean step


async def test_429_gives_up_after_max_retries(server):
    limited = status(429, {"error": {"message": "Slow down"}}, {"retry-after-ms": "10"})
    server.play(limited, limited, limited, sse(words("never reached")))
    agent = We0Agent(make_model(server, max_retries=2))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    cause = info.value
    assert isinstance(cause, ModelProviderError) and cause.status_code == 429
    assert "gave up after 2 retries" in str(cause) and "Slow down" in str(cause)
    assert len(server.requests) == 3


async def test_retry_after_longer_than_the_cap_is_not_waited_for(server):
    server.play(status(429, {"error": {"message": "come back tomorrow"}}, {"Retry-After": "86400"}))
    agent = We0Agent(make_model(server, max_retry_after=5))
    t0 = time.monotonic()
    with pytest.raises(ModelError):
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert time.monotonic() - t0 < 5 and len(server.requests) == 1


async def test_a_wait_longer_than_the_cap_is_named_in_the_error(server):
    server.play(status(429, {"error": {"message": "come back tomorrow"}}, {"Retry-After": "86400"}))
    agent = We0Agent(make_model(server, max_retry_after=5))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert "it asked to wait 86400 s, longer than max_retry_after=5 s" in str(info.value)
    assert "raise max_retry_after" in str(info.value)


async def test_a_server_quoting_the_api_key_never_puts_it_in_the_error_or_the_store(server):
    key = "sk-proj-VERYSECRET-0123456789"
    server.play(status(401, {"error": {"message": f"Incorrect API key provided: {key}.",
                                       "type": "invalid_request_error", "code": "invalid_api_key"}}))
    agent = We0Agent(make_model(server, api_key=key))
    with pytest.raises(ModelAuthenticationError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    msg = await last_assistant(agent, "s")
    assert key not in str(info.value) and key not in msg.info.error.message
    assert "Incorrect API key provided: sk-…(the API key)" in msg.info.error.message


@pytest.mark.parametrize("reply", [
    status(429, {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}),
    status(503, {"error": {"message": "not this one"}}, {"x-should-retry": "false"}),
    sse([{"error": {"message": "The server had an error", "type": "server_error"}}]),
], ids=["quota", "should-retry-false", "error-event"])
async def test_what_waiting_cannot_fix_is_not_retried(server, reply):
    # a spent quota is not a rate; the server may forbid the retry; an error event inside the
    # stream is reported at once (retryable later, by a resume)
    server.play(reply, sse(words("never reached")))
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert info.value.retryable and "gave up" not in str(info.value) and len(server.requests) == 1


async def test_5xx_is_retried_with_backoff(server):
    server.play(status(500, {"error": {"message": "boom"}}), status(503, {"error": {"message": "busy"}}),
                sse(words("recovered")))
    agent = We0Agent(make_model(server))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "recovered" and len(server.requests) == 3


async def test_5xx_after_retries_is_a_model_error(server):
    server.play(*[status(500, {"error": {"message": "still broken"}}) for _ in range(3)])
    agent = We0Agent(make_model(server, max_retries=2))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert info.value.status_code == 500 and "still broken" in str(info.value)
    msg = await last_assistant(agent, "s")
    assert msg.info.time.completed is None and "500" in msg.info.error.message


async def test_400_is_not_retried(server):
    server.play(status(400, {"error": {"message": "Unknown parameter: 'foo'"}}))
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert "Unknown parameter" in str(info.value) and len(server.requests) == 1


async def test_context_length_error_compacts_then_resume_continues(server):
    server.play(
        status(400, {"error": {"message": "This model's maximum context length is 4096 tokens. However, you "
                                          "requested 5000 tokens.", "type": "invalid_request_error",
                               "param": "messages", "code": "context_length_exceeded"}}),
        sse(words("The user asked for x.", usage={"prompt_tokens": 3000, "completion_tokens": 8})),
        sse(words("Done with x.", usage={"prompt_tokens": 40, "completion_tokens": 4})),
    )
    agent = We0Agent(make_model(server, context_window=4096))
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("do x")])]
    assert events[-1]["result"].result == "compact"
    (comp,) = [e for e in events if e["type"] == "compaction"]
    assert comp["part"].summary == "The user asked for x."
    summary_req = server.bodies()[1]
    assert "tools" not in summary_req and "summary" in summary_req["messages"][-1]["content"]
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.result == "stop" and result.text == "Done with x."
    sent = server.bodies()[2]["messages"]
    assert sent[0]["content"].startswith("Summary of the conversation so far:\nThe user asked for x.")
    assert sent[1]["role"] == "user" and sent[1]["content"].startswith("do x")
    assert len(sent) == 2


def test_is_context_length_error_recognises_servers():
    from we0nb.models._openai_errors import _CONTEXT_TEXT

    for text in ["This model's maximum context length is 8192 tokens.",
                 "the request exceeds the available context size, try increasing it",
                 "prompt is too long: 210000 tokens > 200000 maximum",
                 "Input is too long for requested model."]:
        assert _CONTEXT_TEXT.search(text), text
    assert not _CONTEXT_TEXT.search("Unknown parameter: 'foo'")


# --------------------------------------------------------------------------- abort


@pytest.mark.parametrize("when", ["between-events", "while-blocked-on-the-stream"])
async def test_abort_closes_the_http_stream_at_once(server, when):
    server.play(sse([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"})], hold=True),
                sse(words("resumed")))
    agent = We0Agent(make_model(server))
    abort = asyncio.Event()
    seen: list = []
    aborted_at = None
    with pytest.raises(asyncio.CancelledError):
        async for e in agent.stream(abort=abort, session_id="s", messages=[user_message("x")]):
            seen.append(e)
            if e["type"] == "text-delta":
                aborted_at = time.monotonic()
                if when == "between-events":
                    abort.set()  # seen at the loop's next check point
                else:
                    # set once the loop is parked on the next (never coming) chunk: the
                    # watcher cancels the pending read
                    asyncio.get_running_loop().call_soon(abort.set)
    assert aborted_at is not None
    closed = await asyncio.to_thread(server.client_closed.wait, 10)
    assert closed, "the server never saw the connection close"
    assert server.closed_at - aborted_at < 2.0  # in practice a few milliseconds
    msg = await last_assistant(agent, "s")
    assert msg.info.time.completed is None and msg.text == "Hel"
    result = await agent.invoke(mode="resume", session_id="s")
    assert result.text == "resumed"


# --------------------------------------------------------------------------- client plumbing


def test_model_works_across_event_loops(server):
    server.play(sse(words("one")), sse(words("two")))
    agent = We0Agent(make_model(server))
    r1 = asyncio.run(agent.invoke(session_id="a", messages=[user_message("x")]))
    r2 = asyncio.run(agent.invoke(session_id="b", messages=[user_message("y")]))
    assert (r1.text, r2.text) == ("one", "two")


def test_construction_errors(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")
    with pytest.raises(TypeError, match="stream"):
        OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1", stream=False)
    m = OpenAIChatModel("m", base_url="http://127.0.0.1:1/v1")  # a local server needs no key
    assert m.model_id == "m" and m.context_window is None


def test_history_mapping():
    req = ModelRequest(
        messages=[UserTurn("q"),
                  AssistantTurn("let me", "thought", [ToolCall("c1", "add", {"a": 1, "b": "é"})]),
                  ToolResult("c1", "add", "boom", True),
                  AssistantTurn("", "", [ToolCall("c2", "mul", {})]),
                  ToolResult("c2", "mul", "0"),
                  AssistantTurn("final")],
        tools=[ToolSchema("add", "d", {"type": "object"})], system="sys")
    out = to_openai_messages(req)
    assert out[0] == {"role": "system", "content": "sys"}
    assert out[1] == {"role": "user", "content": "q"}
    assert out[2]["content"] == "let me" and "reasoning_content" not in out[2]
    assert out[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": "é"}'
    assert out[3] == {"role": "tool", "tool_call_id": "c1", "content": "boom"}
    assert out[4]["content"] == "" and out[4]["tool_calls"][0]["function"]["arguments"] == "{}"  # never null
    assert out[6] == {"role": "assistant", "content": "final"}
    assert to_openai_messages(req, send_reasoning=True)[2]["reasoning_content"] == "thought"


# --------------------------------------------------------------------------- what real servers need (issue 17)


async def test_a_step_after_tool_calls_sends_empty_content_not_null(server):
    # llama-cpp-python answers HTTP 500 to "content": null (the fake server does too): every
    # step after a tool call, and every resume after an interrupted call, used to fail
    server.play(
        sse([chunk({"role": "assistant", "content": None, "tool_calls": [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "mul", "arguments": '{"a": 2, "b": 3}'}}]}),
            chunk({}, "tool_calls")]),
        sse(words("It is 6.")),
    )
    agent = We0Agent(make_model(server), tools=adder(Log()))
    result = await agent.invoke(session_id="s", messages=[user_message("2*3?")])
    assert result.text == "It is 6." and len(server.requests) == 2
    sent = server.bodies()[1]["messages"][1]
    assert sent["role"] == "assistant" and sent["content"] == "" and sent["tool_calls"][0]["id"] == "c1"


async def test_the_fake_server_refuses_null_content_like_llama_cpp_python(server):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
    try:
        with pytest.raises(Exception, match="validation error"):
            await client.chat.completions.create(model="m", messages=[
                {"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []}])
    finally:
        await client.close()


async def test_a_request_the_server_cannot_validate_is_not_retried(server):
    server.play(status(500, {"error": {"message": "1 validation error:\n  {'loc': ('body', 'messages', 1)}",
                                       "type": "internal_server_error"}}))
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError, match="validation error") as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    assert info.value.status_code == 500 and len(server.requests) == 1


class Answer(BaseModel):
    city: str
    celsius: int


async def test_native_output_sends_the_json_schema_and_reads_the_text(server):
    server.play(sse(words('{"city": "Lis', 'bon", "celsius": 24}')))
    agent = We0Agent(make_model(server), output_type=Answer, output_mode="native")
    result = await agent.invoke(session_id="s", messages=[user_message("warmest?")])
    assert result.output == Answer(city="Lisbon", celsius=24)
    body = server.bodies()[0]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Answer"
    assert fmt["json_schema"]["schema"]["properties"].keys() == {"city", "celsius"}
    assert "tools" not in body and "tool_choice" not in body  # no output tool in native mode
    # a finished native turn keeps its output on resume
    again = await agent.invoke(mode="resume", session_id="s")
    assert again.output == Answer(city="Lisbon", celsius=24) and len(server.requests) == 1


async def test_native_output_in_the_llama_cpp_python_dialect(server):
    server.checks.append(reject_json_schema)  # llama-cpp-python 0.3 answers 500 to "json_schema"
    server.play(sse(words('{"city": "Oslo", "celsius": 9}')))
    model = make_model(server, output_mode="native", native_format="json_object")
    agent = We0Agent(model, output_type=Answer)  # the model's own output mode
    result = await agent.invoke(session_id="s", messages=[user_message("q")])
    assert result.output == Answer(city="Oslo", celsius=9)
    assert server.bodies()[0]["response_format"] == {"type": "json_object", "schema": agent.output_schema}
    with pytest.raises(ModelProviderError, match="json_object"):  # the other dialect is refused there
        await We0Agent(make_model(server), output_type=Answer, output_mode="native").invoke(
            session_id="t", messages=[user_message("q")])


async def test_prompted_output_puts_the_schema_in_the_instructions(server):
    server.play(sse(words("```json\n", '{"city": "Paris", "celsius": 17}', "\n```")))
    agent = We0Agent(make_model(server), output_type=Answer, output_mode="prompted", system_prompt="Be brief.")
    result = await agent.invoke(session_id="s", messages=[user_message("q")])
    assert result.output == Answer(city="Paris", celsius=17)
    body = server.bodies()[0]
    system = body["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    assert '"celsius"' in system["content"] and "JSON" in system["content"]
    assert "response_format" not in body and "tools" not in body


async def test_a_plain_text_answer_to_an_output_tool_request_is_asked_again(server):
    server.play(
        sse(words("The warmest is Lisbon.")),
        sse([chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {
            "name": "final_result", "arguments": '{"city": "Lisbon", "celsius": 24}'}}]}), chunk({}, "tool_calls")]),
    )
    agent = We0Agent(make_model(server), output_type=Answer)
    result = await agent.invoke(session_id="s", messages=[user_message("q")])
    assert result.output == Answer(city="Lisbon", celsius=24) and result.steps == 2
    second = server.bodies()[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": "The warmest is Lisbon."}
    assert second[-1]["role"] == "user" and "final_result" in second[-1]["content"]
    t = await agent.transcript("s")
    assert t.messages[2].info.role == "user" and t.messages[2].parts[0].synthetic


async def test_truncation_is_visible_on_the_result(server):
    server.play(sse(words("The answer is", finish="length")), sse(words("Done.")))
    agent = We0Agent(make_model(server))
    result = await agent.invoke(session_id="s", messages=[user_message("x")])
    assert result.finish_reason == "length" and result.truncated
    assert result.text == "The answer is"
    result = await agent.invoke(session_id="s", messages=[user_message("y")])
    assert result.finish_reason == "stop" and not result.truncated


async def test_an_empty_stream_says_so(server):
    server.play(empty_stream())
    agent = We0Agent(make_model(server))
    with pytest.raises(ModelProviderError) as info:
        await agent.invoke(session_id="s", messages=[user_message("x")])
    text = str(info.value)
    assert "empty stream" in text and "log" in text and "cut" not in text
    assert len(server.requests) == 1  # the same request would fail the same way


async def test_compaction_fires_on_an_estimate_when_the_server_sends_no_usage(server, caplog):
    # llama-cpp-python ignores stream_options.include_usage: every step reported 0 tokens and
    # a context_window did nothing
    server.play(sse(words("Noted.")), sse(words("The user sent a long text.")))
    model = make_model(server, context_window=300)
    agent = We0Agent(model)
    with caplog.at_level("WARNING", logger="we0nb.engine"):
        result = await agent.invoke(session_id="s", messages=[user_message("word " * 400)])
    assert result.result == "compact"
    assert server.bodies()[1]["messages"][-1]["content"].startswith("The conversation above")
    warned = [r for r in caplog.records if "no token usage" in r.getMessage()]
    assert len(warned) == 1
    server.play(sse(words("ok")), sse(words("Summary again.")))
    with caplog.at_level("WARNING", logger="we0nb.engine"):
        await agent.invoke(session_id="s2", messages=[user_message("word " * 400)])
    assert len([r for r in caplog.records if "no token usage" in r.getMessage()]) == 1  # once per model


async def test_tool_choice_decided_per_step(server):
    server.play(
        sse([chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                    "function": {"name": "mul", "arguments": '{"a": 2, "b": 3}'}}]}),
             chunk({}, "tool_calls")]),
        sse(words("6")),
    )
    seen: list[int] = []

    def choose(request: ModelRequest):
        seen.append(request.turn_steps)
        return "mul" if request.turn_steps == 0 else None  # force the first step only

    agent = We0Agent(make_model(server, tool_choice=choose), tools=adder(Log()))
    result = await agent.invoke(session_id="s", messages=[user_message("2*3?")])
    assert result.text == "6" and seen == [0, 1]
    first, second = server.bodies()
    assert first["tool_choice"] == {"type": "function", "function": {"name": "mul"}}
    assert "tool_choice" not in second


def test_tool_choice_values(server):
    req = ModelRequest(messages=[UserTurn("q")], tools=[ToolSchema("add", "d", {"type": "object"})])
    assert "tool_choice" not in make_model(server).request_params(req)
    assert make_model(server, tool_choice="auto").request_params(req)["tool_choice"] == "auto"
    assert make_model(server, tool_choice="add").request_params(req)["tool_choice"] == {
        "type": "function", "function": {"name": "add"}}
    no_tools = ModelRequest(messages=[UserTurn("q")], tools=[])
    assert "tool_choice" not in make_model(server, tool_choice="required").request_params(no_tools)
    with pytest.raises(TypeError, match="tool_choice"):
        make_model(server, tool_choice=3)
    with pytest.raises(ValueError, match="output_mode"):
        make_model(server, output_mode="json")
    with pytest.raises(ValueError, match="native_format"):
        make_model(server, native_format="grammar")


async def test_an_empty_stream_for_an_oversized_prompt_is_a_context_overflow(server):
    # llama-cpp-python checks the prompt's length inside the stream: 200 and an empty body
    server.play(empty_stream(), sse(words("A summary.", usage={"prompt_tokens": 50, "completion_tokens": 3})))
    agent = We0Agent(make_model(server, context_window=256))
    result = await agent.invoke(session_id="s", messages=[user_message("word " * 400)])  # ~500 tokens
    assert result.result == "compact"  # the overflow was recognised, and compaction answered it
    t = await agent.transcript("s")
    assert t.messages[1].info.error.reason == "ContextWindowExceeded"
    assert "empty stream" in t.messages[1].info.error.message


async def test_tool_arguments_with_a_raw_newline_in_a_string_are_accepted(server):
    # SmolLM2 on llama-cpp-python wrote a literal newline inside a JSON string argument
    server.play(
        sse([chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {
            "name": "note", "arguments": '{"text": "line one\nline two"}'}}]}), chunk({}, "tool_calls")]),
        sse(words("noted")),
    )
    notes: list[str] = []

    @tool
    def note(text: str) -> str:
        """Write a note."""
        notes.append(text)
        return "ok"

    result = await We0Agent(make_model(server), tools=[note]).invoke(session_id="s", messages=[user_message("x")])
    assert result.text == "noted" and notes == ["line one\nline two"]

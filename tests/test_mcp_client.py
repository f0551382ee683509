"""What an MCP client owes a server beyond tools/call (issue 37), against the SDK test server
(tests/mcp_servers/app.py) as a real process: tools it cannot call are not offered, progress,
elicitation, roots, server logs, and results that keep their detail."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from mcpkit import await_until, entries, stdio_server
from we0nb import ScriptedModel, We0Agent, text, tool_call, user_message
from we0nb.tools import ToolError

pytestmark = pytest.mark.timeout(120)


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


async def test_a_task_required_tool_is_not_offered_and_the_reason_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger, prefix="t_")
    model = ScriptedModel([[tool_call("t_echo", {"text": "hi"})], [text("done")]])
    with caplog.at_level(logging.WARNING, logger="we0nb.mcp"):
        async with We0Agent(model, tools=[server]) as agent:
            await agent.invoke(messages=[user_message("go")])
    offered = {s.name for s in model.requests[0].tools}
    assert "t_echo" in offered and "t_report" not in offered
    assert "t_report" not in server.policies()
    assert set(server.hidden_tools) == {"report"} and "called as a task" in server.hidden_tools["report"]
    assert any("tool 'report' is not offered to the model" in r.getMessage() for r in caplog.records)
    assert "not offered: <code>report</code>" in server._repr_html_()
    assert entries(ledger, "report") == []


async def test_progress_reaches_on_progress_and_the_calls_metadata(tmp_path: Path) -> None:
    seen: list = []
    server = stdio_server(tmp_path / "ledger", on_progress=seen.append)
    model = ScriptedModel([[tool_call("countdown", {"steps": 3, "delay": 0.01})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("go")])
        (p,) = parts(await agent.transcript(r.session_id))
    assert p.state.status == "completed"
    assert [(e.tool, e.progress, e.total, e.message) for e in seen] == [
        ("countdown", 1.0, 3.0, "step 1"), ("countdown", 2.0, 3.0, "step 2"), ("countdown", 3.0, 3.0, "step 3")]
    assert seen[-1].fraction == 1.0 and seen[0].call_id == p.call_id
    assert p.state.metadata["progress"] == {"progress": 3.0, "total": 3.0, "message": "step 3"}


async def test_reset_timeout_on_progress_lets_a_long_call_that_reports_progress_finish(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    call = tool_call("countdown", {"steps": 6, "delay": 0.5})  # 3 s in all, progress every 0.5 s
    results = {}
    for reset in (False, True):
        server = stdio_server(ledger, timeout=1.5, reset_timeout_on_progress=reset)
        model = ScriptedModel([[call], [text("done")]])
        async with We0Agent(model, tools=[server]) as agent:
            r = await agent.invoke(messages=[user_message("go")])
            (results[reset],) = parts(await agent.transcript(r.session_id))
    assert results[True].state.status == "completed", results[True].state
    assert results[False].state.status == "error"
    assert results[False].state.metadata["mcp_error"] == "timeout"
    with pytest.raises(TypeError, match="reset_timeout_on_progress"):
        stdio_server(ledger, reset_timeout_on_progress="yes")


async def test_a_form_elicitation_is_answered_by_the_handler_with_defaults_applied(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    asked: list = []

    def answer(request):
        asked.append(request)
        return request.accept({"name": "tea"})  # count left out: its default (3) is filled in

    server = stdio_server(ledger, elicitation=answer)
    model = ScriptedModel([[tool_call("ask", {"question": "What shall I order?"})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("go")])
        (p,) = parts(await agent.transcript(r.session_id))
    (request,) = asked
    assert request.mode == "form" and request.message == "What shall I order?"
    assert request.schema["properties"]["count"]["default"] == 3 and request.defaults() == {"count": 3}
    assert entries(ledger, "ask") == [{"tool": "ask", "pid": entries(ledger, "ask")[0]["pid"], "action": "accept",
                                       "data": {"name": "tea", "count": 3}}]
    assert p.state.status == "completed"


async def test_decline_cancel_and_an_answer_that_does_not_match_the_schema(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    answers = iter([lambda r: r.decline(), lambda r: r.cancel(), lambda r: {"name": 5}])
    server = stdio_server(ledger, elicitation=lambda r: next(answers)(r))
    model = ScriptedModel([[tool_call("ask", {"question": "a?"})], [tool_call("ask", {"question": "b?"})],
                           [tool_call("ask", {"question": "c?"})], [text("done")]])
    with caplog.at_level(logging.WARNING, logger="we0nb.mcp"):
        async with We0Agent(model, tools=[server]) as agent:
            await agent.invoke(messages=[user_message("go")])
    assert [e["action"] for e in entries(ledger, "ask")] == ["decline", "cancel", "cancel"]
    assert any("elicitation answer refused, the answer does not match the requested schema at 'name'" in r.getMessage()
               for r in caplog.records)


async def test_url_elicitation_and_no_handler_means_no_capability(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    urls: list = []
    server = stdio_server(ledger, elicitation=lambda r: (urls.append((r.mode, r.url)), r.accept())[1])
    async with server:
        assert (await server.call_tool("visit", {})) == {"result": "accept"}
    assert urls == [("url", "https://example.org/login")]
    plain = stdio_server(ledger)
    async with plain:
        with pytest.raises(ToolError):  # the server asks anyway: refused at once, nothing waits
            await asyncio.wait_for(plain.call_tool("ask", {"question": "?"}), 20)
    assert entries(ledger, "ask") == []


async def test_roots_are_declared_and_changed(tmp_path: Path) -> None:
    data, more = tmp_path / "data", tmp_path / "more"
    data.mkdir(), more.mkdir()
    server = stdio_server(tmp_path / "ledger", roots=[data])
    async with server:
        assert await server.call_tool("folders", {}) == {"result": data.as_uri()}
        await server.set_roots([data, more.as_uri()])
        assert await server.call_tool("folders", {}) == {"result": f"{data.as_uri()}\n{more.as_uri()}"}
    with pytest.raises(RuntimeError, match="built without roots="):
        await stdio_server(tmp_path / "ledger").set_roots([data])
    with pytest.raises(TypeError, match="roots=..."):
        stdio_server(tmp_path / "ledger", roots="data")


async def test_server_log_messages_go_to_python_logging(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    server = stdio_server(tmp_path / "ledger")
    with caplog.at_level(logging.INFO, logger="we0nb.mcp.server"):
        async with server:
            await server.call_tool("chatty", {})
            await asyncio.sleep(0.2)
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "we0nb.mcp.server"]
    assert (logging.INFO, "MCP server 'test' [chatty]: starting") in got
    assert (logging.WARNING, "MCP server 'test' [chatty]: {'disk': 'almost full'}") in got


async def test_embedded_resources_keep_uri_mime_type_and_annotations(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger")
    async with server:
        value = await server.call_tool("embedded", {})
    assert value.output == ("[resource file:///notes/a.md, text/markdown]\n# Notes\n"
                            "[file file:///data/b.bin, application/octet-stream]")
    text_file, blob = value.attachments
    assert (text_file.type, text_file.uri, text_file.mime_type, text_file.data) == (
        "file", "file:///notes/a.md", "text/markdown", None)
    assert text_file.annotations == {"audience": ["user"], "priority": 0.5}
    assert (blob.uri, blob.mime_type, blob.data, blob.annotations) == (
        "file:///data/b.bin", "application/octet-stream", "AAEC", None)


async def test_a_flood_of_progress_and_logs_keeps_the_run_responsive_and_abortable(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    seen: list = []
    server = stdio_server(ledger, on_progress=seen.append)
    model = ScriptedModel([[tool_call("flood", {"count": 50_000})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        abort = asyncio.Event()
        task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id="f"))
        await await_until(lambda: len(seen) > 500, what="the flood to reach the client")
        assert not entries(ledger, "flood")[-1].get("event") == "sent"  # still flooding
        ticks = 0
        for _ in range(10):  # the loop still runs other tasks promptly
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            ticks += time.monotonic() - t0 < 0.5
        t0 = time.monotonic()
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - t0
    print(f"abort during the flood took {took * 1000:.0f} ms after {len(seen)} progress notifications")
    assert ticks == 10 and took < 1.0


async def test_resource_tool_lets_the_model_read_a_resource_and_is_off_by_default(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger", prefix="s_", resource_tool=True)
    model = ScriptedModel([[tool_call("s_read_resource", {"uri": "notes://today"}),
                            tool_call("s_read_resource", {"uri": "notes://nowhere"})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("read")])
        found, missing = parts(await agent.transcript(r.session_id))
    assert found.state.output == "[resource notes://today, text/plain]\nbuy tea"
    assert missing.state.status == "error" and "resources/read" in missing.state.error
    assert server.policies()["s_read_resource"].side_effects is False
    assert "s_read_resource" in {s.name for s in model.requests[0].tools}
    async with stdio_server(tmp_path / "ledger") as plain:
        assert "read_resource" not in plain.policies()


async def test_a_malformed_elicitation_schema_is_cancelled_at_once(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    asked: list = []
    server = stdio_server(ledger, elicitation=lambda r: (asked.append(r), r.accept({"x": 1}))[1])
    with caplog.at_level(logging.WARNING, logger="we0nb.mcp"):
        async with server:
            value = await asyncio.wait_for(server.call_tool("ask_badly", {}), 30)
    assert [e["action"] for e in entries(ledger, "ask_badly")] == ["cancel"] and value == {"result": "cancel"}
    assert any("the server's requested schema is not valid JSON Schema" in r.getMessage() for r in caplog.records)


async def test_abort_still_cancels_a_call_whose_timeout_resets_on_progress(tmp_path: Path) -> None:
    seen: list = []
    server = stdio_server(tmp_path / "ledger", timeout=30, reset_timeout_on_progress=True, on_progress=seen.append)
    model = ScriptedModel([[tool_call("countdown", {"steps": 100, "delay": 0.2})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        abort = asyncio.Event()
        task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id="r"))
        await await_until(lambda: seen, what="the first progress notification")
        t0 = time.monotonic()
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - t0
        (p,) = parts(await agent.transcript("r"))
    assert took < 1.0 and p.state.status == "running"  # abort leaves the part running, as for any call


@pytest.mark.parametrize("name", ["evil<script>alert(1)</script>", "two words", "x" * 129, "", "naïve", "a/b"])
def test_a_tool_whose_name_is_no_tool_name_is_not_offered(name: str) -> None:
    import mcp_types

    from we0nb.mcp.adapter import hidden_reason

    why = hidden_reason(mcp_types.Tool(name=name, inputSchema={"type": "object"}))
    assert why is not None and "not a tool name" in why


@pytest.mark.parametrize("name", ["echo", "get_weather", "files.read", "a-b", "x" * 128])
def test_tool_names_as_mcp_names_them_are_offered(name: str) -> None:
    import mcp_types

    from we0nb.mcp.adapter import hidden_reason

    assert hidden_reason(mcp_types.Tool(name=name, inputSchema={"type": "object"})) is None

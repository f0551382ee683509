"""MCP over streamable HTTP (issue 15): a real server process on 127.0.0.1, stopped by PID."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import pytest

httpx2 = pytest.importorskip("httpx2")

from mcpkit import HttpServer, await_until, entries, starts
from we0nb import ScriptedModel, We0Agent, text, tool_call, user_message
from we0nb.errors import MCPServerError
from we0nb.mcp import MCPServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(tmp_path / "ledger").start()
    try:
        yield server
    finally:
        server.kill()


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


async def test_calls_over_http_with_headers(http_server: HttpServer) -> None:
    server = MCPServer.http(http_server.url, headers={"X-Team": "blue"}, name="web", trust_annotations=True)
    model = ScriptedModel([[tool_call("place_order", {"item": "tea", "quantity": 2}),
                            tool_call("header", {"name": "X-Team"}), tool_call("picture", {})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("go")])
        order, header, picture = parts(await agent.transcript(r.session_id))
        assert server.policies()["header"].side_effects is False
    assert r.result == "stop"
    assert order.state.output == '{"result":"ordered 2 x tea"}'
    assert header.state.output == '{"result":"blue"}'
    assert picture.state.attachments[0].type == "image"
    assert [e["item"] for e in entries(http_server.ledger, "place_order")] == ["tea"]


async def test_abort_over_http_cancels_the_call_on_the_server(http_server: HttpServer) -> None:
    server = MCPServer.http(http_server.url, name="web")
    model = ScriptedModel([[tool_call("slow", {"seconds": 30})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        abort = asyncio.Event()
        task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id="s1"))
        await await_until(lambda: entries(http_server.ledger, "slow"), what="the call to start")
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await await_until(lambda: entries(http_server.ledger, "slow")[-1].get("event") == "cancelled",
                          what="the server to see the cancellation")
        r = await agent.invoke(mode="resume", session_id="s1")
        (p,) = parts(await agent.transcript("s1"))
    assert r.result == "stop" and p.state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()


async def test_an_http_server_killed_mid_call_is_an_error_and_a_restarted_one_is_reconnected(
        http_server: HttpServer) -> None:
    server = MCPServer.http(http_server.url, name="web", timeout=60)
    model = ScriptedModel([[tool_call("place_order", {"item": "block"})], [tool_call("whoami", {})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        task = asyncio.create_task(agent.invoke(messages=[user_message("go")], session_id="s2"))
        await await_until(lambda: entries(http_server.ledger, "place_order"), what="the call to start")
        http_server.kill()
        http_server.start()  # the same port, a new process (and a new MCP session)
        r = await asyncio.wait_for(task, 60)
        blocked, who = parts(await agent.transcript("s2"))
    assert r.result == "stop"
    assert blocked.state.status == "error" and blocked.state.error.startswith(
        "MCP server 'web': the connection ended during the call to 'place_order'"), blocked.state
    assert "its outcome is unknown. It is reconnected on the next call." in blocked.state.error
    assert who.state.status == "completed", who.state
    assert who.state.output == f'{{"result":{starts(http_server.ledger)[-1]}}}'


async def test_a_server_restarted_between_calls_gets_a_new_session_and_the_call_runs_once(
        http_server: HttpServer) -> None:
    server = MCPServer.http(http_server.url, name="web")
    model = ScriptedModel([[tool_call("whoami", {})], [text("one")],
                           [tool_call("place_order", {"item": "tea"})], [text("two")]])
    async with We0Agent(model, tools=[server]) as agent:
        await agent.invoke(messages=[user_message("who")], session_id="s3")
        http_server.kill()
        http_server.start()  # the new process knows no session: it answers 404 to the old one
        r = await agent.invoke(messages=[user_message("order")], session_id="s3")
        who, order = parts(await agent.transcript("s3"))
        assert server.connected
    first, second = starts(http_server.ledger)
    assert who.state.output == f'{{"result":{first}}}'
    assert r.result == "stop" and order.state.status == "completed", order.state
    assert [(e["item"], e["pid"]) for e in entries(http_server.ledger, "place_order")] == [("tea", second)]


class _Bearer(httpx2.Auth):
    def __init__(self, token: str) -> None:
        self.token = token

    def auth_flow(self, request):
        request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


async def test_auth_takes_an_httpx_auth_and_a_401_is_named_an_authorization_problem(tmp_path: Path) -> None:
    guarded = HttpServer(tmp_path / "ledger", token="s3cret").start()
    try:
        with pytest.raises(MCPServerError, match=r"refused the connection: HTTP 401 \(Bearer error=\"invalid_token\"\) "
                                                 r"— an authorization problem\. Pass credentials"):
            await MCPServer.http(guarded.url, name="guarded").connect()
        with pytest.raises(MCPServerError, match="HTTP 401"):
            await MCPServer.http(guarded.url, auth=_Bearer("wrong")).connect()
        server = MCPServer.http(guarded.url, name="guarded", auth=_Bearer("s3cret"))
        model = ScriptedModel([[tool_call("place_order", {"item": "tea"})], [text("done")]])
        async with We0Agent(model, tools=[server]) as agent:
            r = await agent.invoke(messages=[user_message("go")])
        assert r.result == "stop" and [e["item"] for e in entries(guarded.ledger, "place_order")] == ["tea"]
    finally:
        guarded.kill()
    with pytest.raises(TypeError, match=r"auth=\.\.\.\): expected an httpx2\.Auth"):
        MCPServer.http(guarded.url, auth="s3cret")


async def test_protocol_auto_speaks_2026_07_28_where_the_server_does(http_server: HttpServer) -> None:
    """protocol='auto' probes server/discover and, answered, sends each request on its own: the
    ``Mcp-Method`` header (2026-07-28) reaches the tool; 'legacy' keeps the initialize handshake."""
    answers = {}
    for protocol in ("auto", "legacy"):
        server = MCPServer.http(http_server.url, name="web", protocol=protocol)
        model = ScriptedModel([[tool_call("header", {"name": "Mcp-Method"})], [text("done")]])
        async with We0Agent(model, tools=[server]) as agent:
            r = await agent.invoke(messages=[user_message("go")])
            (p,) = parts(await agent.transcript(r.session_id))
            answers[protocol] = (p.state.output, server._live().session.protocol_version)
    assert answers == {"auto": ('{"result":"tools/call"}', "2026-07-28"), "legacy": ('{"result":"(none)"}', "2025-11-25")}
    with pytest.raises(ValueError, match="protocol="):
        MCPServer.http(http_server.url, protocol="2026")


async def test_protocol_auto_answers_an_elicitation_in_input_rounds(http_server: HttpServer) -> None:
    """On 2026-07-28 the server asks by answering tools/call with an InputRequiredResult; the
    call is made again with the answer (and the server's requestState), and the answer is the user's."""
    seen = []

    def answer(request):
        seen.append(request.message)
        return request.accept({"name": "Ada"})

    server = MCPServer.http(http_server.url, name="web", protocol="auto", elicitation=answer)
    model = ScriptedModel([[tool_call("ask_resolved", {"question": "Who?"})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("go")])
        (p,) = parts(await agent.transcript(r.session_id))
    assert seen == ["Who?"], p.state
    assert p.state.output == """{"result":"accept: {'name': 'Ada', 'count': 3}"}"""
    (note,) = entries(http_server.ledger, "ask_resolved")
    assert note["data"] == {"name": "Ada", "count": 3} and note["protocol"] == "2026-07-28"


async def _raw_server(answer: "bytes | None") -> "asyncio.AbstractServer":
    """A TCP server on 127.0.0.1 that reads a request and sends ``answer`` (None: never answers)."""
    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is None:
                await asyncio.sleep(3600)
            writer.write(answer)
            await writer.drain()
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(conn, "127.0.0.1", 0)


async def test_an_abort_while_a_server_answers_nothing_stops_at_once(recwarn: pytest.WarningsRecorder) -> None:
    silent = await _raw_server(None)
    port = silent.sockets[0].getsockname()[1]
    server = MCPServer.http(f"http://127.0.0.1:{port}/mcp", connect_timeout=60)
    agent = We0Agent(ScriptedModel([[text("never")]]), tools=[server])
    abort = asyncio.Event()
    task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id="s1"))
    await asyncio.sleep(0.3)
    abort.set()
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)  # (before: the run waited for connect_timeout, 60 s)
    finally:
        silent.close()
        await server.aclose()


async def test_a_server_answering_json_that_is_not_mcp_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    body = b'{"hello": "world"}'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    fake = await _raw_server(answer)
    port = fake.sockets[0].getsockname()[1]
    server = MCPServer.http(f"http://127.0.0.1:{port}/mcp", connect_timeout=10)
    try:
        with caplog.at_level("WARNING"), pytest.raises(MCPServerError) as info:
            await We0Agent(ScriptedModel([[text("never")]]), tools=[server]).invoke(messages=[user_message("go")])
    finally:
        fake.close()
        await server.aclose()
    message = str(info.value)
    assert "\n" not in message and "its answer is not an MCP message (JSON-RPC)" in message, message
    assert "validation error" not in message
    assert not [r for r in caplog.records if r.name.startswith("mcp.")], caplog.records  # (no SDK traceback too)

"""MCP servers as tools (issue 15, SPEC §10), against a real server process over stdio.

The server is tests/mcp_servers/app.py, written with the official SDK's high-level server;
its ledger file records every tool body that ran (and every server process that started).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from mcpkit import APP, alive, await_until, entries, starts, stdio_server
from we0nb import (
    MemoryPersistence, ScriptedModel, ToolPolicy, We0Agent, text, tool, tool_call, user_message,
)
from we0nb.errors import MCPServerError
from we0nb.mcp import MCPServer

pytestmark = pytest.mark.timeout(120)


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


async def run(agent: We0Agent, **kw):
    r = await agent.invoke(messages=[user_message("go")], **kw)
    return r, parts(await agent.transcript(r.session_id))


# --------------------------------------------------------------------------- tools and policies


async def test_tools_are_listed_for_the_model_and_have_side_effects_by_default(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger")
    model = ScriptedModel([[tool_call("echo", {"text": "hi"})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r, (p,) = await run(agent)
        assert r.result == "stop" and p.state.status == "completed"
        assert p.state.output == '{"result":"hi"}'  # structuredContent is the output, as JSON
        listed = {s.name: s for s in model.requests[0].tools}
        assert listed["echo"].description == "Return the text unchanged."
        assert listed["echo"].parameters["properties"]["text"]["type"] == "string"
        # MCP annotations are untrusted by default: even readOnlyHint tools have side effects
        assert all(pol.side_effects for pol in server.policies().values())
        row = next(r for r in server.policy_table() if r["tool"] == "echo")
        assert row["read_only_hint"] is True and row["why"] == "default (readOnlyHint not trusted)"


async def test_trusted_read_only_hint_makes_a_tool_read_only_and_policies_override(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger", trust_annotations=True, prefix="t_",
                          policies={"place_order": ToolPolicy(blocks_on_error=True),
                                    "lookup": ToolPolicy(side_effects=True)})
    async with server:
        pol = server.policies()
    assert pol["t_echo"].side_effects is False  # readOnlyHint, trusted
    assert pol["t_lookup"].side_effects is True  # policies= beats the annotation
    assert pol["t_place_order"] == ToolPolicy(side_effects=True, blocks_on_error=True)
    assert pol["t_fail"] == ToolPolicy()  # no annotation: side effects, never blocks
    why = {r["mcp_name"]: r["why"] for r in server.policy_table()}
    assert why["echo"] == "readOnlyHint (trusted)" and why["lookup"] == "policies=" and why["fail"] == "default"
    assert not server.connected and "not connected" in repr(server)


async def test_requires_approval_set_uses_the_servers_own_names(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger, prefix="shop_", requires_approval={"place_order"})
    model = ScriptedModel([[tool_call("shop_place_order", {"item": "tea"})], [text("ordered")]])
    async with We0Agent(model, tools=[server]) as agent:
        r = await agent.invoke(messages=[user_message("buy tea")])
        assert r.result == "approval" and [p.tool for p in r.approvals] == ["shop_place_order"]
        assert entries(ledger, "place_order") == []
        with pytest.raises(ValueError, match="Invalid arguments"):  # checked against the inputSchema
            await agent.approve(r.session_id, r.approvals[0].call_id, input={"item": 5})
        await agent.approve(r.session_id, r.approvals[0].call_id, input={"item": "green tea"})
        r2 = await agent.invoke(mode="resume", session_id=r.session_id)
    assert r2.result == "stop"
    assert [e["item"] for e in entries(ledger, "place_order")] == ["green tea"]


async def test_unknown_names_in_policies_fail_at_the_first_connection(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger", requires_approval={"place_ordr"})
    with pytest.raises(ValueError, match=r"has no tool named 'place_ordr'.*own names, without prefix="):
        await server.connect()
    await server.aclose()


async def test_name_clashes_are_clear_errors_suggesting_prefix(tmp_path: Path) -> None:
    @tool
    def echo(text: str) -> str:
        return text

    clash = We0Agent(ScriptedModel([[text("x")]]), tools=[echo, stdio_server(tmp_path / "l1")])
    with pytest.raises(ValueError, match=r"Two tools are named 'echo': a Python tool and MCP server 'test'.*prefix"):
        await clash.invoke(messages=[user_message("go")])
    assert (await clash.transcript("ses_none")).session is None
    await clash.aclose()

    a, b = stdio_server(tmp_path / "l2"), stdio_server(tmp_path / "l3", prefix="b_")
    async with We0Agent(ScriptedModel([[tool_call("b_echo", {"text": "x"})], [text("ok")]]),
                        tools=[echo, a, b]) as agent:
        with pytest.raises(ValueError, match="Two tools are named 'echo'"):
            await agent.tool_table()
    async with We0Agent(ScriptedModel([[tool_call("b_echo", {"text": "x"})], [text("ok")]]), tools=[a, b]) as agent:
        assert {"echo", "b_echo"} <= set((await agent.tool_table()).by_name)  # a prefix resolves it
    c = MCPServer.stdio(sys.executable, [str(APP), "--ledger", str(tmp_path / "l4")], name="other")
    async with We0Agent(ScriptedModel([[text("ok")]]), tools=[a, c]) as agent:
        with pytest.raises(ValueError, match=r"'echo': MCP server 'test' and MCP server 'other'.*prefix="):
            await agent.tool_table()
    with pytest.raises(ValueError, match="listed twice"):
        We0Agent(ScriptedModel([]), tools=[a, a])


async def test_a_server_that_cannot_start_fails_the_run_before_anything_is_written(tmp_path: Path) -> None:
    server = MCPServer.stdio(str(tmp_path / "no-such-server"), name="ghost")
    agent = We0Agent(ScriptedModel([[text("x")]]), tools=[server], persistence=MemoryPersistence())
    with pytest.raises(MCPServerError, match=r"MCP server 'ghost' could not be started: .*no-such-server"):
        await agent.invoke(messages=[user_message("go")], session_id="ses_a")
    assert (await agent.transcript("ses_a")).session is None

    silent = MCPServer.stdio(sys.executable, ["-c", "import time; time.sleep(60)"], name="mute",
                             connect_timeout=1)
    with pytest.raises(MCPServerError, match=r"no answer to initialize within connect_timeout=1 s"):
        await silent.connect()


# --------------------------------------------------------------------------- calls and results


async def test_results_text_json_errors_and_attachments(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("structured", {"n": 3}), tool_call("fail", {"message": "out of stock"}),
                            tool_call("picture", {}), tool_call("clip", {}), tool_call("links", {}),
                            tool_call("place_order", {"item": 7})], [text("done")]])
    async with We0Agent(model, tools=[stdio_server(ledger)]) as agent:
        r, (st, fail, pic, clip, links, bad) = await run(agent)
    assert r.result == "stop"
    assert st.state.output == '{"n":3,"square":9}'
    assert fail.state.status == "error" and "out of stock" in fail.state.error
    assert not fail.state.error.startswith("ToolError")
    assert pic.state.output == "a red dot\n[image image/png, 16 bytes]"  # the model is told of the image
    (img,) = pic.state.attachments
    assert img.type == "image" and img.mime_type == "image/png" and img.data.startswith("iVBORw0KGgo")
    assert clip.state.attachments[0].type == "audio" and clip.state.output.startswith("[audio audio/wav")
    assert links.state.output == ("two reports\n[link report.pdf: https://example.org/report.pdf]\n"
                                  "[link notes: file:///tmp/notes.txt]")
    assert [(a.type, a.name, a.uri) for a in links.state.attachments] == [
        ("link", "report.pdf", "https://example.org/report.pdf"), ("link", "notes", "file:///tmp/notes.txt")]
    # invalid arguments never reach the server
    assert bad.state.status == "error" and bad.state.time.start is None
    assert bad.state.error == ("Invalid arguments for tool 'place_order' at 'item': 7 is not of type 'string'. "
                               "The server was not called.")
    assert entries(ledger, "place_order") == []
    # attachments round-trip through the stored JSON (SQL persistence stores the document)
    from we0nb.messages import ToolPart

    assert ToolPart.model_validate_json(pic.model_dump_json()) == pic


async def test_a_timeout_is_a_tool_error_and_cancels_the_call_on_the_server(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("slow", {"seconds": 30}), tool_call("echo", {"text": "after"})],
                           [text("done")]])
    async with We0Agent(model, tools=[stdio_server(ledger, timeout=0.5)]) as agent:
        r, (slow, echo) = await run(agent)
        await await_until(lambda: entries(ledger, "slow")[-1:] == [{**entries(ledger, "slow")[-1],
                                                                    "event": "cancelled"}],
                          what="the server's handler to be cancelled")
    assert r.result == "stop"
    assert slow.state.status == "error" and slow.state.metadata.items() >= {"mcp_error": "timeout"}.items()
    assert "did not answer the call to 'slow' within 0.5 s" in slow.state.error
    assert echo.state.status == "completed"  # the connection is still good


async def test_abort_cancels_the_call_then_resume_applies_the_policy(tmp_path: Path) -> None:
    for trust, expect in ((False, "interrupt"), (True, "recall")):
        ledger = tmp_path / f"ledger-{trust}"
        server = stdio_server(ledger, trust_annotations=trust)
        model = ScriptedModel([[tool_call("slow", {"seconds": 0.2 if trust else 30})], [text("done")]])
        async with We0Agent(model, tools=[server]) as agent:
            abort = asyncio.Event()
            task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id=f"s{trust}"))
            await await_until(lambda: entries(ledger, "slow"), what="the call to start on the server")
            abort.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            (p,) = parts(await agent.transcript(f"s{trust}"))
            assert p.state.status == "running"  # abort leaves the part running
            await await_until(lambda: entries(ledger, "slow")[-1].get("event") == "cancelled",
                              what="notifications/cancelled to reach the server")
            r = await agent.invoke(mode="resume", session_id=f"s{trust}")
            (p,) = parts(await agent.transcript(f"s{trust}"))
        assert r.result == "stop"
        if expect == "interrupt":
            assert p.state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()
            assert len([e for e in entries(ledger, "slow") if e["event"] == "start"]) == 1
        else:
            assert p.state.status == "completed" and p.state.metadata.items() >= {"recalled": True}.items()
            assert len([e for e in entries(ledger, "slow") if e["event"] == "start"]) == 2


async def test_a_server_that_dies_mid_call_is_an_error_then_it_is_restarted(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("whoami", {}), tool_call("die", {}), tool_call("whoami", {})],
                           [tool_call("garbage", {}), tool_call("whoami", {})], [text("done")]])
    async with We0Agent(model, tools=[stdio_server(ledger)]) as agent:
        r, (who1, die, who2, garbage, who3) = await run(agent)
    assert r.result == "stop"
    assert die.state.status == "error" and die.state.metadata.items() >= {"mcp_error": "connection_closed"}.items()
    assert "the connection ended during the call to 'die'" in die.state.error
    assert "its outcome is unknown" in die.state.error
    assert garbage.state.status == "error"
    assert "not an MCP message: 'this is not JSON-RPC'" in garbage.state.error
    pids = starts(ledger)
    assert len(pids) == 3  # started, restarted after the death, restarted after the garbage
    assert [who1.state.output, who2.state.output, who3.state.output] == [
        f'{{"result":{pid}}}' for pid in pids]
    assert not any(alive(pid) for pid in pids)


async def test_tool_list_changes_reach_the_next_step(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger", trust_annotations=True)
    model = ScriptedModel([[tool_call("grow", {"name": "extra"})], [tool_call("extra", {})], [text("done")]])
    async with We0Agent(model, tools=[server]) as agent:
        r, (grow, extra) = await run(agent)
        assert r.result == "stop" and extra.state.output == '{"result":"extra here"}'
        assert "extra" not in [s.name for s in model.requests[0].tools]
        assert "extra" in [s.name for s in model.requests[1].tools]
        assert server.policies()["extra"].side_effects is False
        assert "extra" in agent.tools_by_name


async def test_a_tool_a_server_adds_while_running_that_clashes_is_hidden_and_the_run_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A clash at the first connection is the agent's setup (ValueError); one the server makes later,
    adding a tool named like a Python tool, hides the newcomer with a warning: the run, and the
    next ones, go on with the Python tool (before: the run failed mid-turn and every later run too)."""
    from we0nb import tool

    @tool(side_effects=False)
    def clash() -> str:
        """The Python tool."""
        return "the python one"

    server = stdio_server(tmp_path / "ledger", trust_annotations=True)
    model = ScriptedModel([[tool_call("grow", {"name": "clash"})], [tool_call("clash", {})], [text("done")],
                           [text("again")]])
    async with We0Agent(model, tools=[clash, server]) as agent:
        with caplog.at_level("WARNING", logger="we0nb.mcp"):
            r, (_, called) = await run(agent)
        assert r.result == "stop" and called.state.output == "the python one"
        assert [s.name for s in model.requests[1].tools].count("clash") == 1
        warned = [rec.getMessage() for rec in caplog.records if "now offers a tool named 'clash'" in rec.getMessage()]
        assert warned and warned[0].startswith("MCP server ") and "a Python tool" in warned[0]
        assert "prefix" in warned[0]
        assert (await agent.invoke(session_id=r.session_id, messages=[user_message("more")])).text == "again"


# --------------------------------------------------------------------------- lifetime


async def test_close_from_another_task_and_no_orphans(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger)
    await asyncio.create_task(server.connect())  # connected in one task (a notebook cell) …
    (pid,) = starts(ledger)
    assert alive(pid) and server.connected
    await asyncio.create_task(server.aclose())  # … closed in another: no cancel-scope error
    assert not alive(pid) and not server.connected

    model = ScriptedModel([[tool_call("whoami", {})], [text("one")], [tool_call("whoami", {})], [text("two")]])
    agent = We0Agent(model, tools=[server])
    await agent.invoke(messages=[user_message("go")])  # connects again on first use
    pid2 = starts(ledger)[-1]
    assert pid2 != pid and alive(pid2)
    await agent.aclose()
    assert not alive(pid2)
    async with agent:
        await agent.invoke(messages=[user_message("again")])
        pid3 = starts(ledger)[-1]
        assert alive(pid3)
    assert not alive(pid3)


def test_successive_event_loops_each_get_a_connection(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("whoami", {})], [text("one")], [tool_call("whoami", {})], [text("two")]])
    server = stdio_server(ledger)
    agent = We0Agent(model, tools=[server])
    assert asyncio.run(agent.invoke(messages=[user_message("1")])).text == "one"
    first = starts(ledger)[0]
    wait = 0
    while alive(first) and wait < 200:  # asyncio.run's end cancelled the connection's task: it stopped
        import time

        time.sleep(0.05)
        wait += 1
    assert not alive(first)
    assert asyncio.run(agent.invoke(messages=[user_message("2")])).text == "two"
    assert len(starts(ledger)) == 2 and not alive(starts(ledger)[1])
    assert len(server._conns) == 1  # (private, on purpose) the ended first loop's connection was dropped


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_process_that_ends_without_closing_leaves_no_server_behind(tmp_path: Path, how: str) -> None:
    import os
    import signal
    import subprocess

    from mcpkit import wait_until

    ledger = tmp_path / "ledger"
    code = f"""
import asyncio, os, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from mcpkit import stdio_server
async def main():
    server = stdio_server(__import__('pathlib').Path({str(ledger)!r}))
    await server.connect()
    print("CONNECTED", flush=True)
    if {how!r} == "sigkill":
        await asyncio.sleep(600)
    os._exit(0)  # no aclose, no loop shutdown: only the process's end closes the pipes
asyncio.run(main())
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "CONNECTED"
    (pid,) = starts(ledger)
    assert alive(pid)
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    wait_until(lambda: not alive(pid), 20, "the server to exit once its client is gone (stdin EOF)")


def test_mcp_server_is_importable_without_the_extra() -> None:
    import subprocess
    import textwrap

    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("mcp", "mcp_types"):
                    raise ImportError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from we0nb.mcp import MCPServer
        try:
            MCPServer.stdio("server")
        except ImportError as e:
            print("ERROR", e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines() == [
        "ERROR MCPServer needs the 'mcp' package, which is not installed: pip install \"we0nb[mcp]\""]


def test_option_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="timeout"):
        MCPServer.stdio("x", timeout=0)
    with pytest.raises(TypeError, match="requires_approval"):
        MCPServer.stdio("x", requires_approval="delete")
    with pytest.raises(TypeError, match="policies"):
        MCPServer.stdio("x", policies={"a": True})
    with pytest.raises(ValueError, match="http:// or https://"):
        MCPServer.http("localhost:8000")
    with pytest.raises(RuntimeError, match=r"connect first .*policies\(\)"):
        MCPServer.stdio("x").policies()


def test_the_sdks_tracebacks_we0nb_reports_in_one_line_show_only_where_debug_is_on() -> None:
    """A program that configured logging at WARNING (a handler with no level of its own, as
    ``logging.basicConfig`` installs) sees no SDK traceback for a fault we0nb reports itself; a
    logger set to DEBUG sees it as a DEBUG record; the SDK's other records are untouched."""
    import io
    import logging

    from we0nb.mcp.sdk_logs import quiet_sdk_tracebacks

    quiet_sdk_tracebacks()
    sdk = logging.getLogger("mcp.client.stdio")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    sdk.addHandler(handler)
    before = sdk.level
    try:
        sdk.setLevel(logging.WARNING)
        try:
            raise ValueError("not JSON-RPC")
        except ValueError:
            sdk.exception("Failed to parse JSONRPC message from server")
            sdk.error("something else went wrong")
        assert out.getvalue() == "ERROR something else went wrong\n"
        sdk.setLevel(logging.DEBUG)
        try:
            raise ValueError("not JSON-RPC")
        except ValueError:
            sdk.exception("Failed to parse JSONRPC message from server")
        assert out.getvalue().splitlines()[1] == "DEBUG Failed to parse JSONRPC message from server"
        assert "ValueError: not JSON-RPC" in out.getvalue()
    finally:
        sdk.removeHandler(handler)
        sdk.setLevel(before)

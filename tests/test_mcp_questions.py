"""An MCP server's question for a person (elicitation) made durable like an approval (issue 37):
stored with the running call, answered from code, from the CLI (another process) or refused
with the reason; progress shown as the call runs; a flood of progress stays cheap and abortable."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcpkit import await_until, entries, stdio_server
from we0nb import ScriptedModel, SqlPersistence, We0Agent, text, tool_call, user_message

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


def ask_model() -> ScriptedModel:
    return ScriptedModel([[tool_call("ask", {"question": "What shall I order?"})], [text("done")]])


async def _asked(agent: We0Agent, sid: str):
    async def waiting():
        return await agent.pending_questions(sid)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = await waiting()
        if found:
            return found
        await asyncio.sleep(0.02)
    pytest.fail("no question was stored")


async def test_a_question_is_stored_with_the_call_and_answered_from_code(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger, elicitation="ask")
    events: list = []
    async with We0Agent(ask_model(), tools=[server]) as agent:
        async def run():
            async for ev in agent.stream(messages=[user_message("go")], session_id="q"):
                events.append(ev)

        task = asyncio.create_task(run())
        (part,) = await _asked(agent, "q")
        q = part.state.metadata["questions"][-1]
        assert part.state.status == "running" and q["status"] == "awaiting"
        assert (q["mode"], q["message"], q["source"]) == ("form", "What shall I order?", "MCP server 'test'")
        assert q["schema"]["properties"]["count"]["default"] == 3 and q["schema"]["required"] == ["name"]
        # an answer that does not fit is refused with the reason: nothing sent, nothing recorded
        with pytest.raises(ValueError, match="does not match the requested schema at 'count'"):
            await agent.answer("q", part.call_id, {"name": "tea", "count": "many"})
        with pytest.raises(ValueError, match="'name' is a required property"):
            await agent.answer("q", part.call_id, {})
        with pytest.raises(ValueError, match="expected 'accept', 'decline' or 'cancel'"):
            await agent.answer("q", part.call_id, action="maybe")
        assert entries(ledger, "ask") == []
        (still,) = await agent.pending_questions("q")
        assert still.state.metadata["questions"][-1]["status"] == "awaiting"
        answered = await agent.answer("q", part.call_id, {"name": "tea"})
        assert answered["status"] == "accept" and answered["content"] == {"name": "tea", "count": 3}
        await asyncio.wait_for(task, 30)
        (done,) = parts(await agent.transcript("q"))
        assert await agent.pending_questions("q") == []
    assert entries(ledger, "ask") == [{"tool": "ask", "action": "accept", "data": {"name": "tea", "count": 3},
                                       **{k: v for k, v in entries(ledger, "ask")[0].items()
                                          if k not in ("tool", "action", "data")}}]
    assert done.state.status == "completed" and "accept" in done.state.output
    (kept,) = done.state.metadata["questions"]
    assert (kept["status"], kept["content"], kept["by"]) == ("accept", {"name": "tea", "count": 3}, "code")
    # the run showed the question as it waited (a tool event whose running part holds it)
    shown = [ev["part"].state.metadata["questions"][-1]["status"] for ev in events
             if ev["type"] == "tool" and ev["part"].state.status == "running" and "questions" in ev["part"].state.metadata]
    assert shown[:2] == ["awaiting", "accept"]


@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_decline_and_cancel_reach_the_server(tmp_path: Path, action: str) -> None:
    ledger = tmp_path / "ledger"
    async with We0Agent(ask_model(), tools=[stdio_server(ledger, elicitation="ask")]) as agent:
        task = asyncio.create_task(agent.invoke(messages=[user_message("go")], session_id="d"))
        (part,) = await _asked(agent, "d")
        with pytest.raises(ValueError, match="carries no content"):
            await agent.answer("d", part.call_id, {"name": "x"}, action=action)
        await agent.answer("d", part.call_id, action=action)
        await asyncio.wait_for(task, 30)
        (done,) = parts(await agent.transcript("d"))
    assert [e["action"] for e in entries(ledger, "ask")] == [action]
    assert done.state.metadata["questions"][0]["status"] == action


async def test_a_handler_that_returns_none_asks_a_person(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    seen: list = []
    server = stdio_server(ledger, elicitation=lambda r: seen.append(r.message))
    async with We0Agent(ask_model(), tools=[server]) as agent:
        task = asyncio.create_task(agent.invoke(messages=[user_message("go")], session_id="h"))
        (part,) = await _asked(agent, "h")
        await agent.answer("h", part.call_id, {"name": "coffee", "count": 2})
        await asyncio.wait_for(task, 30)
    assert seen == ["What shall I order?"]
    assert entries(ledger, "ask")[0]["data"] == {"name": "coffee", "count": 2}


async def test_abort_while_a_person_is_asked_and_an_answer_nobody_waits_for(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    store = SqlPersistence(f"sqlite:///{tmp_path / 'q.db'}")
    async with We0Agent(ask_model(), tools=[stdio_server(ledger, elicitation="ask")], persistence=store) as agent:
        abort = asyncio.Event()
        task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("go")], session_id="a"))
        (part,) = await _asked(agent, "a")
        t0 = time.monotonic()
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - t0
        # the stored question outlived its run: answering it is refused, nothing is written
        with pytest.raises(ValueError, match="no run is waiting for this answer"):
            await agent.answer("a", part.call_id, {"name": "tea"})
        (stored,) = await agent.pending_questions("a")
        assert stored.state.metadata["questions"][-1]["status"] == "awaiting"
        r = await agent.invoke(mode="resume", session_id="a")
        (cut,) = parts(await agent.transcript("a"))
    assert took < 0.2, took
    assert r.result == "stop" and cut.state.status == "error" and cut.state.metadata["interrupted"] is True
    assert cut.state.metadata["questions"][-1]["status"] == "unanswered"
    assert entries(ledger, "ask") == []


async def test_the_cli_lists_and_answers_a_question_from_another_process(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    db = tmp_path / "q.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    async def cli(*args: str) -> subprocess.CompletedProcess:
        return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "we0nb", *args, "--db", str(db)],
                                       capture_output=True, text=True, env=env, timeout=60)

    store = SqlPersistence(f"sqlite:///{db}")
    async with We0Agent(ask_model(), tools=[stdio_server(ledger, elicitation="ask")], persistence=store) as agent:
        task = asyncio.create_task(agent.invoke(messages=[user_message("go")], session_id="c"))
        (part,) = await _asked(agent, "c")
        listed = await cli("questions")
        assert listed.returncode == 0, listed.stderr
        assert part.call_id in listed.stdout and "What shall I order?" in listed.stdout
        bad = await cli("answer", "c", part.call_id, "--content", json.dumps({"name": 7}))
        assert bad.returncode == 1 and "does not match the requested schema at 'name'" in bad.stderr
        assert "nothing was sent or recorded" in bad.stderr.lower()
        assert not task.done() and entries(ledger, "ask") == []
        good = await cli("answer", "c", part.call_id, "--content", json.dumps({"name": "tea"}))
        assert good.returncode == 0, good.stderr
        await asyncio.wait_for(task, 30)
        (done,) = parts(await agent.transcript("c"))
        none = await cli("questions")
    assert entries(ledger, "ask")[0]["data"] == {"name": "tea", "count": 3}
    assert done.state.metadata["questions"][0]["by"] == "cli" and done.state.status == "completed"
    assert "no question awaits an answer" in none.stdout


async def test_a_malformed_schema_is_cancelled_at_once_and_nothing_is_stored(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("ask_badly", {})], [text("done")]])
    async with We0Agent(model, tools=[stdio_server(ledger, elicitation="ask")]) as agent:
        r = await asyncio.wait_for(agent.invoke(messages=[user_message("go")]), 30)
        (done,) = parts(await agent.transcript(r.session_id))
    assert [e["action"] for e in entries(ledger, "ask_badly")] == ["cancel"]
    assert "questions" not in done.state.metadata


async def test_progress_is_shown_while_the_call_runs_and_a_flood_is_coalesced(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    events: list = []
    model = ScriptedModel([[tool_call("countdown", {"steps": 3, "delay": 0.1})], [text("done")]])
    async with We0Agent(model, tools=[stdio_server(ledger)]) as agent:
        async for ev in agent.stream(messages=[user_message("go")]):
            events.append(ev)
    running = [ev["part"].state.metadata.get("progress") for ev in events
               if ev["type"] == "tool" and ev["part"].state.status == "running"]
    assert running[0] is None and {"progress": 1.0, "total": 3.0, "message": "step 1"} in running
    final = [ev["part"] for ev in events if ev["type"] == "tool" and ev["part"].state.status == "completed"]
    assert final[-1].state.metadata["progress"] == {"progress": 3.0, "total": 3.0, "message": "step 3"}

    # 10,000 progress notifications: a few events, a responsive loop, and abort within 0.2 s
    flood = ScriptedModel([[tool_call("flood", {"count": 10_000})], [text("done")]])
    shown: list = []
    async with We0Agent(flood, tools=[stdio_server(ledger)]) as agent:
        abort = asyncio.Event()

        async def run():
            async for ev in agent.stream(abort=abort, messages=[user_message("go")], session_id="f"):
                shown.append(ev)

        task = asyncio.create_task(run())
        await await_until(lambda: any(e.get("event") == "sent" for e in entries(ledger, "flood")), 60,
                          what="the flood to be sent")

        def last_shown():
            shown_progress = [ev["part"].state.metadata.get("progress") for ev in shown if ev["type"] == "tool"]
            return [p for p in shown_progress if p] and [p for p in shown_progress if p][-1]["progress"] == 9999

        await await_until(last_shown, 60, what="the last progress to be shown")  # (coalesced, the last one too)
        late = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            late = max(late, time.monotonic() - t0)
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        took = time.monotonic() - t0
    progress_events = [ev for ev in shown if ev["type"] == "tool" and "progress" in ev["part"].state.metadata]
    print(f"flood: {len(progress_events)} progress events shown; abort took {took * 1000:.0f} ms")
    assert took < 0.2 and late < 0.5
    assert 1 <= len(progress_events) < 400
    assert progress_events[-1]["part"].state.metadata["progress"]["progress"] == 9999


async def test_the_panel_shows_a_form_built_from_the_schema_and_answers_it(tmp_path: Path) -> None:
    from we0nb.notebook import RunPanel

    class Handle:
        def update(self, bundle):
            pass

    ledger = tmp_path / "ledger"
    async with We0Agent(ask_model(), tools=[stdio_server(ledger, elicitation="ask")]) as agent:
        panel = RunPanel(agent, session_id="p", display=lambda b: Handle())
        panel.start("go")
        t_end = time.monotonic() + 30
        while not panel.questions.rows:
            assert time.monotonic() < t_end, "no question row"
            await asyncio.sleep(0.02)
        (row,) = panel.questions.rows
        assert [(f.name, f.kind, f.required, f.default) for f in row.fields] == [
            ("name", "string", True, None), ("count", "integer", False, 3)]
        assert row.inputs["name"].value == "" and row.inputs["count"].value == "3"  # defaults applied
        assert "What shall I order?" in row.info.value
        # a click on Accept with a form that does not fit: the reason in the row, nothing sent
        row.buttons["accept"].click()
        await await_until(lambda: "required property" in row.message.value, what="the refusal")
        row.inputs["name"].value = "tea"
        row.inputs["count"].value = "many"
        row.buttons["accept"].click()
        await await_until(lambda: "not a whole number" in row.message.value, what="the refusal")
        assert entries(ledger, "ask") == [] and row.answered is None
        row.inputs["count"].value = "2"
        row.buttons["accept"].click()
        result = await asyncio.wait_for(panel.wait(), 30)
    assert result.result == "stop" and row.answered == "accept"
    assert entries(ledger, "ask")[0]["data"] == {"name": "tea", "count": 2}
    assert "sent to the server" in row.message.value


async def test_a_question_with_no_run_to_keep_it_is_cancelled_at_once(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    import logging

    ledger = tmp_path / "ledger"
    with caplog.at_level(logging.WARNING, logger="we0nb.mcp"):
        async with stdio_server(ledger, elicitation="ask") as server:  # called directly: no run watches it
            value = await asyncio.wait_for(server.call_tool("ask", {"question": "Now?"}), 30)
    assert [e["action"] for e in entries(ledger, "ask")] == ["cancel"] and "cancel" in str(value)
    assert any("no call of a run is under way" in r.getMessage() for r in caplog.records)
    with pytest.raises(TypeError, match="expected 'ask'"):
        stdio_server(ledger, elicitation="always")

"""The live view: coalesced display updates, exact final render, tool rows updated in place."""

import asyncio
import threading
import time

import pytest
from enginekit import hanging_read

import we0nb
from we0nb import ScriptedModel, We0Agent, text, tool, tool_call, user_message
from we0nb.notebook import LiveView, invoke_sync, run_sync, show
from we0nb.notebook.html import esc


class CountingHandle:
    """A fake display handle: records every bundle it is given."""

    def __init__(self):
        self.bundles = []
        self.times = []

    def update(self, bundle):
        self.bundles.append(bundle)
        self.times.append(time.monotonic())

    @property
    def last(self):
        return self.bundles[-1]


def _deltas(n):
    return [f"w{i} " if i % 50 else f"<x{i}>&\n" for i in range(n)]


async def test_10000_deltas_at_full_speed_are_coalesced_and_final_text_exact():
    deltas = _deltas(10_000)
    agent = We0Agent(ScriptedModel([[text(deltas)]]))
    handle = CountingHandle()
    t0 = time.monotonic()
    result = await show(agent.stream(session_id="ses_live", messages=[user_message("go")]), handle=handle)
    elapsed = time.monotonic() - t0
    full = "".join(deltas)
    assert result.text == full
    # bounded: one update per 50 ms at most, plus the final one
    assert len(handle.bundles) <= elapsed / 0.05 + 2, (len(handle.bundles), elapsed)
    assert len(handle.bundles) < 10_000 / 20
    for a, b in zip(handle.times, handle.times[1:-1]):
        assert b - a >= 0.045
    final = handle.last
    assert esc(full) in final["text/html"]
    assert "data-status='finished'" in final["text/html"]
    assert "we0-text we0-cursor" not in final["text/html"]
    assert final["text/plain"].startswith("we0nb run [finished] session=ses_live")
    assert "[user] go" in final["text/plain"]


async def test_paced_stream_stays_under_20_updates_per_second():
    deltas = [f"d{i} " for i in range(400)]
    agent = We0Agent(ScriptedModel([[text(deltas)]], delay=0.002))
    handle = CountingHandle()
    view = LiveView(handle=handle, interval=0.05)
    view.start()
    t0 = time.monotonic()
    await view.consume(agent.stream(messages=[user_message("go")]))
    elapsed = time.monotonic() - t0
    assert elapsed > 0.5
    rate = (len(handle.bundles) - 2) / elapsed  # n updates span n-1 gaps; the final one is not rate limited
    assert rate <= 20.5, rate
    for a, b in zip(handle.times, handle.times[1:-1]):
        assert b - a >= 0.045
    assert len(handle.bundles) >= 5  # it did stream (not only a final render)
    # intermediate text is a short summary, the final one is full
    assert "so far" in handle.bundles[0]["text/plain"]
    assert handle.last["text/plain"].endswith("".join(deltas))


async def test_bandwidth_budget_keeps_bytes_linear_in_time():
    deltas = [f"word{i} " for i in range(2000)]
    agent = We0Agent(ScriptedModel([[text(deltas)]], delay=0.001))
    handle = CountingHandle()
    view = LiveView(handle=handle, interval=0.05, max_bytes_per_s=100_000)
    view.start()
    t0 = time.monotonic()
    await view.consume(agent.stream(messages=[user_message("go")]))
    elapsed = time.monotonic() - t0
    sizes = [len(b["text/html"]) + len(b["text/plain"]) for b in handle.bundles]
    assert sum(sizes) == view.bytes_sent
    # each update waits size/budget after the previous one: the total stays within the budget
    # (plus the final render and the first update, which are not limited)
    assert sum(sizes) <= 100_000 * elapsed + 2 * sizes[-1], (sum(sizes), elapsed)
    assert len(handle.bundles) >= 5
    assert handle.last["text/plain"].endswith("".join(deltas))
    # without the budget the same stream sends clearly more
    handle2 = CountingHandle()
    view2 = LiveView(handle=handle2, interval=0.05, max_bytes_per_s=None)
    view2.start()
    agent2 = We0Agent(ScriptedModel([[text(deltas)]], delay=0.001))
    await view2.consume(agent2.stream(messages=[user_message("go")]))
    assert view2.bytes_sent > view.bytes_sent


async def test_tool_rows_update_in_place_and_quiet_text_is_flushed_by_the_timer():
    gate = asyncio.Event()

    @tool
    async def slow(n: int) -> str:
        await gate.wait()
        return f"<{n}>"

    agent = We0Agent(ScriptedModel([[text("thinking about it"), tool_call("slow", {"n": 1})], [text("ok")]]))
    agent = We0Agent(agent.model, tools=[slow])
    handle = CountingHandle()
    task = asyncio.create_task(show(agent, "go", handle=handle, session_id="ses_tools"))

    async def until(pred, timeout=10):
        t_end = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < t_end, "timed out"
            await asyncio.sleep(0.01)

    await until(lambda: handle.bundles and "<tr data-status='running'>" in handle.last["text/html"])
    html = handle.last["text/html"]
    assert "thinking about it" in html
    assert html.count("<tr data-status=") == 1
    gate.set()
    result = await asyncio.wait_for(task, 10)
    assert result.text == "ok"
    final = handle.last["text/html"]
    assert final.count("<tr data-status=") == 1  # the same row, updated in place
    assert "we0-s-completed" in final and esc("<1>") in final


async def test_aborted_stream_returns_none_and_shows_aborted():
    abort = asyncio.Event()
    agent = We0Agent(ScriptedModel([[text([f"t{i} " for i in range(10_000)])]], delay=0.001))
    handle = CountingHandle()
    task = asyncio.create_task(show(agent.stream(abort=abort, session_id="ses_ab", messages=[user_message("x")]),
                                    handle=handle))
    while not handle.bundles or "t5 " not in handle.last["text/html"]:
        await asyncio.sleep(0.01)
    abort.set()
    assert await asyncio.wait_for(task, 5) is None
    assert "data-status='aborted'" in handle.last["text/html"]
    t = await agent.transcript("ses_ab")
    assert t.messages[-1].info.time.completed is None
    # the partial text persisted is what the view shows
    assert esc(t.messages[-1].text) in handle.last["text/html"]


async def test_failure_is_shown_and_reraised():
    agent = We0Agent(ScriptedModel([[text("a")]]))
    handle = CountingHandle()
    await show(agent, "1", handle=handle, session_id="ses_f")
    with pytest.raises(we0nb.ModelError):
        await show(agent, "2", handle=handle, session_id="ses_f")
    assert "data-status='failed'" in handle.last["text/html"]
    assert "ScriptExhaustedError" in handle.last["text/html"]  # our model errors reach the caller as themselves


async def test_show_outside_ipython_prints_the_final_summary(capsys):
    agent = We0Agent(ScriptedModel([[text("hello there")]]))
    r = await we0nb.show(agent, "hi", session_id="ses_print")
    assert r.text == "hello there"
    out = capsys.readouterr().out
    assert out.startswith("we0nb run [finished] session=ses_print")
    assert "[assistant] hello there" in out


async def test_show_argument_errors():
    agent = We0Agent(ScriptedModel([[text("x")]]))
    with pytest.raises(TypeError):
        await show(42)
    with pytest.raises(TypeError):
        await show(agent.stream(messages=[user_message("x")]), "prompt")
    with pytest.raises(ValueError, match="messages is required"):
        await show(agent)


def test_display_function_is_called_once_then_updates():
    handles = []

    def display(bundle):
        h = CountingHandle()
        h.first = bundle
        handles.append(h)
        return h

    agent = We0Agent(ScriptedModel([[text("a b c")]]))
    r = asyncio.run(show(agent, "x", display=display))
    assert r.text == "a b c" and len(handles) == 1
    assert "data-status='running'" in handles[0].first["text/html"]
    assert "data-status='finished'" in handles[0].last["text/html"]


# ---------------------------------------------------------------- sync helpers


def test_run_sync_without_a_loop():
    agent = We0Agent(ScriptedModel([[text("sync hi")]]))
    r = invoke_sync(agent, prompt="x", session_id="ses_s")
    assert r.text == "sync hi"


async def test_run_sync_inside_a_running_loop_uses_a_worker_thread():
    main_thread = threading.get_ident()

    async def where():
        await asyncio.sleep(0)
        return threading.get_ident()

    assert run_sync(where()) != main_thread
    assert run_sync(where) != main_thread  # a coroutine function works too
    agent = We0Agent(ScriptedModel([[text("one")], [text("two")]]))
    r1 = invoke_sync(agent, messages=[user_message("a")], session_id="ses_rs")
    r2 = invoke_sync(agent, prompt="b", session_id="ses_rs")
    assert (r1.text, r2.text) == ("one", "two")
    with pytest.raises(ValueError, match="messages is required"):
        invoke_sync(agent, session_id="ses_rs")
    with pytest.raises(TypeError):
        run_sync(42)


async def test_resume_shows_recovery_actions_in_place():
    slow_read, started = hanging_read("contents")

    @tool
    def send(to: str) -> str:
        return "sent"

    agent = We0Agent(ScriptedModel([[tool_call("slow_read", {"path": "a"}), tool_call("send", {"to": "b"})],
                                    [text("recovered answer")]]), tools=[slow_read, send])
    abort = asyncio.Event()
    h1 = CountingHandle()
    task = asyncio.create_task(show(agent, "go", abort=abort, session_id="ses_rec", handle=h1))
    await asyncio.wait_for(started.wait(), 10)
    abort.set()
    assert await task is None
    assert "<tr data-status='running'>" in h1.last["text/html"]
    assert "<tr data-status='pending'>" in h1.last["text/html"]

    h2 = CountingHandle()
    result = await show(agent, mode="resume", session_id="ses_rec", handle=h2)
    assert result.text == "recovered answer"
    html = h2.last["text/html"]
    # the recovered message is rebuilt from the recovery events (its info comes with "close")
    assert "UnfinishedAssistantMessage" in html and "(earlier message)" not in html
    assert html.index("slow_read") < html.index("recovered answer")
    assert "<tr data-status='completed'>" in html and "recalled" in html
    assert "<tr data-status='interrupted'>" in html and "interrupted (resume)" in html
    assert "recovery: recall slow_read; interrupt send; closed the unfinished assistant message" in html
    plain = h2.last["text/plain"]
    assert "tool slow_read({\"path\": \"a\"}) completed [recalled]" in plain
    assert plain.rstrip().endswith("recovery: recall slow_read; interrupt send; closed the unfinished assistant message")


async def test_a_running_calls_progress_is_shown_in_its_row_coalesced():
    """A tool that reports updates (as MCP tools do: ToolDefinition.reports_updates) shows its last
    progress — fraction and message — in its row while it runs; 5,000 reports cost a few updates."""
    import dataclasses

    from we0nb.tools import ToolContext, ToolDefinition

    gate = asyncio.Event()

    @tool
    async def pack(n: int, ctx: ToolContext) -> str:
        for i in range(1, n + 1):
            ctx.updates.progress({"progress": i, "total": n, "message": f"packing <{i}>"})
            if i % 100 == 0:
                await asyncio.sleep(0)
        await gate.wait()
        return "packed"

    @dataclasses.dataclass(frozen=True)
    class Reporting(ToolDefinition):
        @property
        def reports_updates(self) -> bool:
            return True

    reporting = Reporting(**{f.name: getattr(pack, f.name) for f in dataclasses.fields(pack)})
    agent = We0Agent(ScriptedModel([[tool_call("pack", {"n": 5000})], [text("ok")]]), tools=[reporting])
    handle = CountingHandle()
    task = asyncio.create_task(show(agent, "go", handle=handle, session_id="ses_progress"))
    t_end = time.monotonic() + 10
    while not (handle.bundles and "5000/5000 (100%)" in handle.last["text/html"]):
        assert time.monotonic() < t_end, handle.bundles[-1]["text/html"] if handle.bundles else "no update"
        await asyncio.sleep(0.01)
    html = handle.last["text/html"]
    assert "<tr data-status='running'>" in html and esc("packing <5000>") in html
    assert "width:100%" in html  # the bar
    updates_while_running = len(handle.bundles)
    gate.set()
    await asyncio.wait_for(task, 10)
    assert updates_while_running < 40, updates_while_running
    final = handle.last["text/html"]
    assert "we0-progress-note" not in final  # a finished call's row shows its output instead


async def test_the_header_counts_one_delta_in_the_singular():
    handle = CountingHandle()
    await show(We0Agent(ScriptedModel([[text("x")]])).stream(session_id="ses_1d", messages=[user_message("go")]),
               handle=handle)
    assert ">1 delta<" in handle.last["text/html"], handle.last["text/html"]
    handle = CountingHandle()
    await show(We0Agent(ScriptedModel([[text(["a", "b"])]])).stream(session_id="ses_2d",
                                                                    messages=[user_message("go")]), handle=handle)
    assert ">2 deltas<" in handle.last["text/html"]

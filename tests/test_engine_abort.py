"""Abort at every phase: persist what was produced, close nothing, raise CancelledError."""

import asyncio
import threading
import time

import pytest

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message

SID = "ses_abort"


def agent_with(steps, tools=(), delay=0.0, **kw):
    model = ScriptedModel(steps, delay=delay)
    return We0Agent(model, tools=list(tools), persistence=MemoryPersistence(), **kw), model


async def deltas_until_stopped(agent, abort, stop, after: int = 2) -> list[str]:
    """Stream a run on ``abort``, calling ``stop()`` once ``after`` text deltas are in: the deltas
    it yielded (the run must end cancelled)."""
    seen: list[str] = []
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id=SID, messages=[user_message("hi")]):
            if ev["type"] == "text-delta":
                seen.append(ev["text"])
                if len(seen) == after:
                    stop()
    return seen


async def test_abort_before_start_writes_nothing():
    agent, model = agent_with([[text("never")]])
    abort = asyncio.Event()
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await agent.invoke(abort=abort, session_id=SID, messages=[user_message("hi")])
    t = await agent.transcript(SID)
    assert t.session is None and t.messages == []
    assert model.requests == []
    with pytest.raises(asyncio.CancelledError):
        async for _ in agent.stream(abort=abort, session_id=SID, messages=[user_message("hi")]):
            pass
    assert (await agent.transcript(SID)).session is None


async def test_abort_mid_delta_keeps_partial_text_and_leaves_message_unfinished():
    agent, model = agent_with([[text(["one ", "two ", "three ", "four "])], [text("resumed")]])
    abort = asyncio.Event()
    assert await deltas_until_stopped(agent, abort, abort.set) == ["one ", "two "]
    t = await agent.transcript(SID)
    a = t.messages[-1]
    assert a.info.role == "assistant" and a.info.time.completed is None and a.info.error is None
    assert a.text == "one two "
    assert a.parts[-1].type == "text" and a.parts[-1].time.end is None
    # a resume closes it and continues
    r = await agent.invoke(abort=asyncio.Event(), mode="resume", session_id=SID)
    assert r.text == "resumed"
    assert model.requests[1].messages[-1].text == "one two "


async def test_abort_with_a_slow_model_stops_reading_at_once():
    agent, model = agent_with([[text(["x"] * 1000)]], delay=0.01)
    abort = asyncio.Event()
    task = asyncio.ensure_future(agent.invoke(abort=abort, session_id=SID, messages=[user_message("hi")]))
    await asyncio.sleep(0.1)
    abort.set()
    t0 = time.perf_counter()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - t0 < 0.5
    a = (await agent.transcript(SID)).messages[-1]
    assert a.info.time.completed is None and 0 < len(a.text) < 1000


async def test_abort_during_an_async_tool_cancels_it_and_leaves_it_running():
    started, cancelled = asyncio.Event(), []

    @tool
    async def deploy(env: str) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(env)
            raise
        return "deployed"

    @tool(side_effects=False)
    def lookup(q: str) -> str:
        return "found"

    agent, model = agent_with([[tool_call("deploy", {"env": "prod"}), tool_call("lookup", {"q": "x"})],
                               [text("after")]], tools=[deploy, lookup])
    abort = asyncio.Event()
    task = asyncio.ensure_future(agent.invoke(abort=abort, session_id=SID, messages=[user_message("go")]))
    await asyncio.wait_for(started.wait(), 5)
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == ["prod"]
    t = await agent.transcript(SID)
    parts = [p for p in t.messages[-1].parts if p.type == "tool"]
    assert [p.state.status for p in parts] == ["running", "pending"]
    assert t.messages[-1].info.time.completed is None
    # resume: the side-effect tool is interrupted, the read-only one recalled
    r = await agent.invoke(mode="resume", session_id=SID)
    parts = [p for p in (await agent.transcript(SID)).messages[1].parts if p.type == "tool"]
    assert parts[0].state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()
    # lookup is read-only but comes after an interrupt: interrupted too, never run
    assert parts[1].state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()
    assert r.text == "after"


async def test_abort_between_steps():
    @tool(side_effects=False)
    def ping() -> str:
        return "pong"

    agent, model = agent_with([[tool_call("ping", {})], [text("second step")]], tools=[ping])
    abort = asyncio.Event()
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id=SID, messages=[user_message("go")]):
            if ev["type"] == "step-finish":
                abort.set()
    assert len(model.requests) == 1
    t = await agent.transcript(SID)
    assert t.messages[-1].info.time.completed is not None
    assert t.messages[-1].tool_parts[0].state.status == "completed"
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "second step" and len(model.requests) == 2


@pytest.mark.parametrize("mode", ["resume", "prompt"])
async def test_abort_set_on_a_recovery_event_calls_no_model(mode):
    agent, model = agent_with([[text(["one ", "two"])], [text("second")], [text("third")]])
    abort = asyncio.Event()
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id=SID, messages=[user_message("hi")]):
            if ev["type"] == "text-delta":
                abort.set()
    before = (await agent.transcript(SID)).model_dump_json()
    abort, kinds = asyncio.Event(), []
    more = {"messages": [user_message("again")]} if mode == "prompt" else {}
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, mode=mode, session_id=SID, **more):
            kinds.append(ev["type"])
            if ev["type"] == "recovery":
                abort.set()  # the message was closed: stop here, before any step
    assert "recovery" in kinds and "step-start" not in kinds
    assert len(model.requests) == 1
    t = await agent.transcript(SID)
    assert t.model_dump_json() != before and t.messages[1].info.error.reason == "UnfinishedAssistantMessage"
    # no new step's message; a prompt's own message is kept (a resume answers it)
    assert [m.info.role for m in t.messages] == ["user", "assistant"] + (["user"] if mode == "prompt" else [])


async def test_prompt_after_abort_interrupts_instead_of_recalling():
    ran = []

    @tool(side_effects=False)
    async def slow_read(path: str) -> str:
        ran.append(path)
        await asyncio.sleep(30)
        return "x"

    agent, model = agent_with([[tool_call("slow_read", {"path": "a"})], [text("new turn")]], tools=[slow_read])
    abort = asyncio.Event()
    task = asyncio.ensure_future(agent.invoke(abort=abort, session_id=SID, messages=[user_message("go")]))
    while not ran:
        await asyncio.sleep(0.005)
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    r = await agent.invoke(session_id=SID, messages=[user_message("something else")])
    assert r.text == "new turn" and ran == ["a"]
    part = (await agent.transcript(SID)).messages[1].tool_parts[0]
    assert part.state.metadata.items() >= {"interrupted": True, "reason": "prompt"}.items()


async def test_abort_set_from_another_thread_via_call_soon_threadsafe():
    agent, model = agent_with([[text(["x"] * 10_000)]], delay=0.005)
    abort = asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(agent.invoke(abort=abort, session_id=SID, messages=[user_message("hi")]))
    await asyncio.sleep(0.05)
    clicked = []

    def click():
        clicked.append(time.perf_counter())
        loop.call_soon_threadsafe(abort.set)

    threading.Thread(target=click).start()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - clicked[0] < 0.5
    assert (await agent.transcript(SID)).messages[-1].info.time.completed is None


async def test_breaking_out_of_stream_persists_and_releases_the_session():
    agent, model = agent_with([[text(["a", "b", "c"])], [text("done")]])
    stream = agent.stream(session_id=SID, messages=[user_message("hi")])
    async for ev in stream:
        if ev["type"] == "text-delta":
            break
    await stream.aclose()
    a = (await agent.transcript(SID)).messages[-1]
    assert a.info.time.completed is None and a.text == "a"
    r = await agent.invoke(mode="resume", session_id=SID)  # lease was released
    assert r.text == "done"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_resume_right_after_breaking_out_of_stream_finds_the_session_free(kind, tmp_path):
    # no aclose(): Python closes the abandoned generator on the loop's next turns, and until then
    # the run held its lease (MemoryPersistence answered SessionBusyError at once)
    from we0nb import SqlPersistence
    from we0nb.engine import left

    p = MemoryPersistence() if kind == "memory" else SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    agent = We0Agent(ScriptedModel([[text(["a", "b", "c"])], [text("done")]]), persistence=p)
    async for ev in agent.stream(session_id=SID, messages=[user_message("hi")]):
        if ev["type"] == "text-delta":
            break
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "done"
    t = await agent.transcript(SID)
    assert t.messages[1].text == "a" and t.messages[1].info.error.reason == "UnfinishedAssistantMessage"
    assert left._closing == {}  # (nothing kept once the left run let go)


async def test_a_session_held_by_a_live_run_is_still_busy():
    from we0nb import SessionBusyError

    agent, model = agent_with([[text(["a", "b", "c"])], [text("done")]])
    stream = agent.stream(session_id=SID, messages=[user_message("hi")])
    async for ev in stream:
        if ev["type"] == "text-delta":
            break  # (the stream is kept: its run is alive, not left)
    with pytest.raises(SessionBusyError):
        await agent.invoke(mode="resume", session_id=SID)
    await stream.aclose()


async def test_external_task_cancellation_also_persists():
    agent, model = agent_with([[text(["x"] * 1000)]], delay=0.01)
    task = asyncio.ensure_future(agent.invoke(session_id=SID, messages=[user_message("hi")]))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    a = (await agent.transcript(SID)).messages[-1]
    assert a.info.time.completed is None and len(a.text) > 0


class _CommitThatHangs(MemoryPersistence):
    """A store whose first commit carrying ``trigger`` hangs until cancelled (a slow database,
    a locked SQLite file, a network store) — nothing of that commit is written."""

    def __init__(self, trigger):
        super().__init__()
        self.trigger = trigger
        self.hanging = asyncio.Event()

    async def commit(self, writes, *, lease=None, session=None):
        if not self.hanging.is_set() and any(self.trigger(p) for _m, parts, _v in writes for p in parts):
            self.hanging.set()
            await asyncio.Event().wait()  # until cancelled: this commit never reaches the store
        await super().commit(writes, lease=lease, session=session)


async def _cancel_when_hanging(agent, store):
    task = asyncio.ensure_future(agent.invoke(session_id=SID, messages=[user_message("hi")]))
    await asyncio.wait_for(store.hanging.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_commit_of_a_step_end_is_written_by_the_cancel_not_lost():
    """A side-effect tool completed; the commit carrying its result (merged with the next step's
    start) is cancelled mid-way. The result must still be stored: else resume would treat a
    call that ran and answered as one that may have run."""
    paid = []

    @tool(side_effects=True)
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    store = _CommitThatHangs(lambda p: p.type == "step-finish")
    model = ScriptedModel([[tool_call("pay", {"amount": 5})], [text("done")]])
    agent = We0Agent(model, tools=[pay], persistence=store)
    await _cancel_when_hanging(agent, store)
    assert paid == [5]
    first = (await agent.transcript(SID)).messages[1]
    calls = [p for p in first.parts if p.type == "tool"]
    assert len(calls) == 1, [p.type for p in first.parts]
    call = calls[0]
    assert call.state.status == "completed" and call.state.output == "paid 5"
    assert first.parts[-1].type == "step-finish" and first.info.time.completed is not None
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.text == "done" and paid == [5]  # the result was kept: nothing ran twice, nothing was interrupted
    assert call.state.status == "completed"


async def test_a_cancelled_commit_of_dirty_parts_is_written_by_the_cancel_not_lost():
    """A pending call waits in the writer's dirty set; the write-ahead that carries it is
    cancelled before the tool runs. The call the model made must still be stored."""
    ran = []

    @tool(side_effects=True)
    def pay(amount: int) -> str:
        """Pay."""
        ran.append(amount)
        return "paid"

    store = _CommitThatHangs(lambda p: p.type == "tool")
    model = ScriptedModel([[tool_call("pay", {"amount": 7})], [text("done")]])
    agent = We0Agent(model, tools=[pay], persistence=store)
    await _cancel_when_hanging(agent, store)
    assert ran == []
    parts = (await agent.transcript(SID)).messages[1].parts
    calls = [p for p in parts if p.type == "tool"]
    assert len(calls) == 1, [p.type for p in parts]
    assert calls[0].tool == "pay" and calls[0].state.input == {"amount": 7}


async def test_runs_sharing_an_abort_event_share_one_watcher_and_all_stop():
    """A batch's items share its stop event: one waiting task for all of them, and one set()
    still stops each run at once; when the last run ends, nothing waits on the event."""
    from we0nb.engine import abort as abort_module

    abort = asyncio.Event()
    agent, _ = agent_with([[text(["x"] * 1000)]] * 3, delay=0.01)
    before = len(asyncio.all_tasks())
    runs = [asyncio.ensure_future(agent.invoke(abort=abort, session_id=f"s{i}", messages=[user_message("hi")]))
            for i in range(3)]
    await asyncio.sleep(0.1)
    assert len(abort_module._WATCHERS[abort].scopes) == 3
    assert len(asyncio.all_tasks()) == before + 3 + 1  # the runs and one watcher
    t0 = time.monotonic()
    abort.set()
    for r in runs:
        with pytest.raises(asyncio.CancelledError):
            await r
    assert time.monotonic() - t0 < 1.0
    assert abort not in abort_module._WATCHERS
    for i in range(3):
        a = (await agent.transcript(f"s{i}")).messages[-1]
        assert a.info.time.completed is None and a.text.startswith("x")


async def test_a_run_that_ends_normally_leaves_nothing_waiting_on_its_event():
    from we0nb.engine import abort as abort_module

    abort = asyncio.Event()
    agent, _ = agent_with([[text("a")], [text("b")]])
    await agent.invoke(abort=abort, session_id="s1", messages=[user_message("hi")])
    await agent.invoke(abort=abort, session_id="s2", messages=[user_message("hi")])
    await asyncio.sleep(0)
    assert abort not in abort_module._WATCHERS
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_cancel_while_the_lease_is_released_still_releases_it() -> None:
    """The run releases its lease in its own task (no trip through the loop when the store
    answers at once); a cancel that lands mid-release still lets the release finish."""
    entered = asyncio.Event()

    class SlowRelease(MemoryPersistence):
        async def release_lease(self, lease):  # type: ignore[no-untyped-def]
            entered.set()
            await asyncio.sleep(0.05)
            await super().release_lease(lease)

    store = SlowRelease()
    agent = We0Agent(ScriptedModel([[text("hi")]]), persistence=store)
    task = asyncio.ensure_future(agent.invoke(session_id="s", messages=[user_message("q")]))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # a bounded wait for the release that goes on (up to ~1 s)
        if "s" not in store._leases:
            break
        await asyncio.sleep(0.01)
    assert "s" not in store._leases
    lease = await store.acquire_lease("s", "run_next")  # free for the next run
    await lease.release()


class _FlagEvent(asyncio.Event):
    """An event whose ``is_set`` also reads a flag of its own (set from elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = False

    def is_set(self) -> bool:
        return self.flag or super().is_set()


async def test_an_event_class_with_its_own_is_set_aborts_mid_delta_too():
    # the delta path reads asyncio's own flag for a plain Event; a class that overrides
    # ``is_set`` is asked through it, so raising its own flag stops the stream at once
    agent, _ = agent_with([[text(["one ", "two ", "three ", "four "])]])
    abort = _FlagEvent()

    def raise_flag() -> None:
        abort.flag = True

    assert await deltas_until_stopped(agent, abort, raise_flag) == ["one ", "two "]
    assert (await agent.transcript(SID)).messages[-1].text == "one two "

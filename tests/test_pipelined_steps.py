"""A pipelined run (a batch item) sends each step's start while its model call goes out, on a
store whose commits wait: the same commits in the same order, the same events, the same
transcript — and nothing of the model's reply kept, yielded or acted on before that commit
has landed. A failing or aborted start is handled as on the plain path.
"""

from __future__ import annotations

import asyncio
import copy
import warnings
from pathlib import Path
from typing import Any, Optional

import pytest

from we0nb import (FunctionModel, MemoryPersistence, ModelError, PersistenceError, SqlPersistence, We0Agent, text, tool,
                   tool_call, user_message)
from we0nb.engine.run import Run, RunOptions
from we0nb.messages import StepStartPart, TextPart, ToolPart
from we0nb.models.base import ToolResult, UserTurn


@tool(side_effects=False)
def ping(i: int) -> str:
    return f"pong {i}"


def _kinds(writes: Any) -> list[str]:
    """A commit as the part types it carries (and ``msg`` for a message), in order."""
    out = []
    for message, parts, _view in writes:
        out.extend(type(p).__name__ for p in parts)
        if message is not None:
            out.append("msg")
    return out


class Gated(MemoryPersistence):
    """A store whose commits wait (``commit_waits``): a commit that starts a step waits until the
    model has been called for that step — which only a pipelined run does before the commit
    has landed; each commit landed is logged. Its rows are taken when the commit is made."""

    commit_waits = True

    def __init__(self, gate: bool = True) -> None:
        super().__init__()
        self.gate = gate
        self.calls: dict[str, int] = {}  # prompt → model calls so far
        self.called = asyncio.Event()
        self.starts: dict[str, int] = {}  # session → step starts committed
        self.log: list[list[str]] = []
        self.fail_start: Optional[int] = None  # the step whose start's commit fails
        self.hold: Optional[asyncio.Event] = None  # when given, a step's start waits for it too

    async def commit(self, writes: Any, **kw: Any) -> None:
        writes = copy.deepcopy(writes)  # (the rows as of now, as a SQL store makes them at once)
        kinds = _kinds(writes)
        if "StepStartPart" in kinds:
            sid = next(p.session_id for _, parts, _ in writes for p in parts if isinstance(p, StepStartPart))
            n = self.starts.get(sid, 0) + 1
            if self.gate:
                while sum(self.calls.values()) < sum(self.starts.values()) + 1:
                    self.called.clear()
                    try:
                        await asyncio.wait_for(self.called.wait(), 5)
                    except asyncio.TimeoutError:
                        raise PersistenceError("no model call came while this step's start waited") from None
            if self.hold is not None:
                await self.hold.wait()
            if self.fail_start == n:
                raise PersistenceError("the database went away (on purpose)")
            self.starts[sid] = n
        self.log.append(kinds)
        await super().commit(writes, **kw)


def _agent(store: Any, steps: int = 2, seen: Optional[list[bool]] = None) -> We0Agent:
    """``steps`` tool steps, then an answer; the model notes whether its step's start was stored."""

    async def reply(request: Any) -> list:
        key = next(m.text for m in request.messages if isinstance(m, UserTurn))
        if isinstance(store, Gated):
            store.calls[key] = store.calls.get(key, 0) + 1
            store.called.set()
            if seen is not None:
                seen.append(sum(store.starts.values()) == sum(store.calls.values()))
        await asyncio.sleep(0)
        n = sum(1 for m in request.messages if isinstance(m, ToolResult))
        return [tool_call("ping", {"i": n})] if n < steps else [text(f"done {key}")]

    return We0Agent(FunctionModel(reply), tools=[ping], persistence=store)


async def _events(agent: We0Agent, sid: str, *, pipelined: bool, mode: str = "prompt",
                  abort: Optional[asyncio.Event] = None, prompt: Optional[str] = None) -> list[dict[str, Any]]:
    request = agent.build_request(session_id=sid, mode=mode, abort=abort,
                                  messages=[user_message(prompt or f"go {sid}")] if mode == "prompt" else None)
    run = Run(agent, request, structured=False, options=RunOptions(pipelined=pipelined))
    try:
        return [ev async for ev in run.events()]
    finally:
        # a pipelined run releases its lease in a task of its own; the batch waits for it before
        # the session is used again, and so does this helper (from Python 3.12 on, wait_for runs
        # its coroutine in the caller's task: no turn of the loop would let the release land first)
        if run.released is not None:
            await asyncio.wait([run.released])


def _shape(tr: Any) -> list[tuple[Any, ...]]:
    """A transcript without ids and times: roles, part types, tool states, texts."""
    out = []
    for m in tr.messages:
        parts = tuple((p.type, p.state.status if isinstance(p, ToolPart) else None,
                       p.text if isinstance(p, TextPart) else None) for p in m.parts)
        out.append((m.info.role, m.info.time.completed is not None, parts))
    return out


async def test_the_model_is_called_while_the_step_start_is_committed_and_nothing_waits_on_it_twice() -> None:
    store, seen = Gated(), []
    events = await asyncio.wait_for(_events(_agent(store, seen=seen), "a", pipelined=True), 10)
    assert events[-1]["type"] == "finish"
    # each of the 3 model calls came before its step's start had landed (the gate made sure)
    assert seen == [False, False, False]
    # the plain path waits for the start before it calls the model: it sees it stored each time
    plain, seen = Gated(gate=False), []
    await _events(_agent(plain, seen=seen), "a", pipelined=False)
    assert seen == [True, True, True]
    # the same commits, in the same order
    assert store.log == plain.log


async def test_a_pipelined_run_yields_the_same_events_and_leaves_the_same_transcript(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'we0.db'}"
    store = SqlPersistence(url)
    assert store.commit_waits
    agent = _agent(store, steps=3)
    piped = await _events(agent, "p", pipelined=True, prompt="go")
    plain = await _events(agent, "q", pipelined=False, prompt="go")
    assert [e["type"] for e in piped] == [e["type"] for e in plain]
    assert "step-start" in [e["type"] for e in piped]
    a, b = await store.load_transcript("p"), await store.load_transcript("q")
    assert _shape(a) == _shape(b)
    assert [p.state.status for m in a.messages for p in m.tool_parts] == ["completed"] * 3
    await store.close()


async def test_a_step_start_that_fails_fails_the_run_and_keeps_nothing_of_the_reply() -> None:
    store = Gated()
    store.fail_start = 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a commit's error never left unretrieved)
        with pytest.raises(PersistenceError, match="went away"):
            await asyncio.wait_for(_events(_agent(store), "f", pipelined=True), 10)
    tr = await store.load_transcript("f")
    # the first step and its tool call are there; the second step's start (and the first step's
    # end, which went with it) was not written — nor anything of the second model reply
    steps = [m for m in tr.messages if m.info.role == "assistant"]
    assert len(steps) == 1 and store.calls == {"go f": 2}
    assert [p.state.status for p in steps[0].tool_parts] == ["running"]
    # resume repairs it as after a crash: the read-only call is run again, the turn ends
    store.gate, store.fail_start = False, None
    result = await _agent(store).invoke(session_id="f", mode="resume")
    assert result.text == "done go f"


async def test_a_model_that_fails_at_once_has_its_error_written_after_the_step_start() -> None:
    """The failure's write waits for the start still under way: written first, the start's
    message row (without the error) would land after it and hide the error."""
    store = Gated()

    async def reply(request: Any) -> list:
        store.calls["e"] = store.calls.get("e", 0) + 1
        store.called.set()
        if store.calls["e"] == 2:
            store.hold = asyncio.Event()
            asyncio.get_running_loop().call_later(0.05, store.hold.set)
            raise RuntimeError("the provider fell over")
        return [tool_call("ping", {"i": 0})]

    agent = We0Agent(FunctionModel(reply), tools=[ping], persistence=store)
    with pytest.raises(ModelError):
        await asyncio.wait_for(_events(agent, "e", pipelined=True), 10)
    tr = await store.load_transcript("e")
    steps = [m for m in tr.messages if m.info.role == "assistant"]
    assert len(steps) == 2
    assert steps[1].info.error is not None and "fell over" in steps[1].info.error.message
    starts = [i for i, kinds in enumerate(store.log) if "StepStartPart" in kinds]
    assert starts[-1] < len(store.log) - 1  # the error's write came after the second start


async def test_a_start_that_fails_under_a_failing_model_fails_the_run_as_on_the_plain_path() -> None:
    """Both fail: the store's error is the run's, as when the start is committed before the call."""
    for pipelined in (True, False):
        store = Gated(gate=pipelined)
        store.fail_start = 2

        async def reply(request: Any, store: Gated = store) -> list:
            store.calls["b"] = store.calls.get("b", 0) + 1
            store.called.set()
            if store.calls["b"] == 2:
                raise RuntimeError("the provider fell over")
            return [tool_call("ping", {"i": 0})]

        agent = We0Agent(FunctionModel(reply), tools=[ping], persistence=store)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(PersistenceError, match="went away"):
                await asyncio.wait_for(_events(agent, "b", pipelined=pipelined), 10)


async def test_an_abort_during_a_pipelined_step_persists_its_start_and_resume_finishes() -> None:
    store = Gated()
    abort = asyncio.Event()

    async def reply(request: Any) -> list:
        store.calls["x"] = store.calls.get("x", 0) + 1
        store.called.set()
        if store.calls["x"] == 2:
            abort.set()
            await asyncio.Event().wait()  # (until the abort cancels it)
        return [tool_call("ping", {"i": 0})]

    agent = We0Agent(FunctionModel(reply), tools=[ping], persistence=store)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(_events(agent, "x", pipelined=True, abort=abort), 10)
    tr = await store.load_transcript("x")
    steps = [m for m in tr.messages if m.info.role == "assistant"]
    # the second step's start landed (with the first step's end) before the abort's own write
    assert len(steps) == 2 and steps[1].info.time.completed is None
    assert [p.state.status for p in steps[0].tool_parts] == ["completed"]
    store.gate = False
    result = await _agent(store, steps=1).invoke(session_id="x", mode="resume")
    assert result.result == "stop"


async def test_pipelined_does_nothing_on_a_store_that_answers_at_once() -> None:
    agent = _agent(MemoryPersistence())
    request = agent.build_request(session_id="m", messages=[user_message("go")])
    assert Run(agent, request, structured=False, options=RunOptions(pipelined=True)).pipelined is False


async def test_batch_items_run_pipelined() -> None:
    """Every step start of a batch waits for its model call here: only pipelined items finish."""
    store = Gated()
    batch = await asyncio.wait_for(_agent(store).batch([f"p{i}" for i in range(6)], concurrency=3,
                                                       progress=False), 20)
    assert batch.counts == {"stop": 6}
    assert sorted(batch.df["text"]) == sorted(f"done p{i}" for i in range(6))


# --------------------------------------------------------------------------- commits sent soon


class Slow(MemoryPersistence):
    """Commits that take ``delay`` seconds; the ``fail``-th one (1-based) raises. Each commit's
    texts are logged as it lands (the rows as of when it was made)."""

    commit_waits = True

    def __init__(self, delay: float = 0.02, fail: Optional[int] = None) -> None:
        super().__init__()
        self.delay, self.fail, self.made = delay, fail, 0
        self.landed: list[list[str]] = []

    async def commit(self, writes: Any, **kw: Any) -> None:
        self.made += 1
        n = self.made
        texts = [p.text for _, parts, _ in writes for p in parts]
        await asyncio.sleep(self.delay if n == 1 else 0)  # (the first is the slowest)
        if n == self.fail:
            raise PersistenceError("the database went away (on purpose)")
        self.landed.append(texts)
        await super().commit(writes, **kw)


async def test_commits_sent_soon_land_one_after_the_other_in_the_order_they_were_made() -> None:
    from sql_support import user_write
    from we0nb.engine.writer import Writer

    store = Slow()
    w = Writer(store, None, 0.05)
    for body in ("a", "b", "c"):
        w.write_soon(*user_write("s", body))
    assert store.landed == []  # (nothing waited for them yet)
    await w.settle()
    assert store.landed == [["a"], ["b"], ["c"]]  # the slow first one did not let the others pass it


async def test_a_commit_sent_soon_that_fails_stops_the_ones_after_it_and_all_go_again_in_order() -> None:
    from sql_support import user_write
    from we0nb.engine.writer import Writer

    store = Slow(fail=1)
    w = Writer(store, None, 0.05)
    w.write_soon(*user_write("s", "a"))
    w.write_soon(*user_write("s", "b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (its error is never left unretrieved)
        with pytest.raises(PersistenceError, match="went away"):
            await w.settle()
        await w.settle()  # raised once
    w.write_soon(*user_write("s", "c"))  # (sent: the failure has been seen)
    await w.write(*user_write("s", "d"))
    assert store.landed == [["a", "b", "c"], ["d"]]  # nothing of "b" landed before "a"
    tr = await store.load_transcript("s")
    assert tr.session is None  # (no session row was written: the rows are there all the same)


async def test_a_write_made_after_an_unseen_failure_waits_with_the_failed_ones() -> None:
    from sql_support import user_write
    from we0nb.engine.writer import Writer

    store = Slow(delay=0, fail=1)
    w = Writer(store, None, 0.05)
    w.write_soon(*user_write("s", "a"))
    await asyncio.sleep(0.01)  # it failed; nobody has looked yet
    w.write_soon(*user_write("s", "b"))  # kept, not sent past the failure
    assert store.made == 1
    with pytest.raises(PersistenceError):
        await w.write(*user_write("s", "c"))
    await w.write(None)
    assert store.landed == [["a", "b", "c"]]


class RunningGate(MemoryPersistence):
    """A commit that carries a call's ``running`` state says so (``entered``) and waits until the
    tool has run (``ran``): only a run that does not wait for that commit gets past it."""

    commit_waits = True

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.ran = asyncio.Event(), asyncio.Event()
        self.stored: list[str] = []  # the call's status in the store each time the tool ran

    async def commit(self, writes: Any, **kw: Any) -> None:
        states = [p.state.status for _, parts, _ in copy.deepcopy(writes) for p in parts if isinstance(p, ToolPart)]
        if "running" in states and not self.ran.is_set():
            self.entered.set()
            try:
                await asyncio.wait_for(self.ran.wait(), 2)
            except asyncio.TimeoutError:
                raise PersistenceError("the tool did not run while its running state was being written") from None
        await super().commit(writes, **kw)


def _one_call_agent(store: Any, *, side_effects: bool) -> We0Agent:
    async def probe() -> str:
        """Runs while its own write-ahead is in the store (or waits for it to be sent)."""
        tr = await store.load_transcript("t")
        store.stored.append(next((p.state.status for m in tr.messages for p in m.tool_parts), "-"))
        if not side_effects:
            await asyncio.wait_for(store.entered.wait(), 2)
        store.ran.set()
        return "ok"

    async def reply(request: Any) -> list:
        done = any(isinstance(m, ToolResult) for m in request.messages)
        return [text("done")] if done else [tool_call("probe", {})]

    return We0Agent(FunctionModel(reply), tools=[tool(probe, side_effects=side_effects)], persistence=store)


async def test_a_read_only_call_runs_while_its_running_state_is_sent_in_a_pipelined_run() -> None:
    store = RunningGate()
    events = await asyncio.wait_for(_events(_one_call_agent(store, side_effects=False), "t", pipelined=True), 10)
    assert events[-1]["type"] == "finish"
    tr = await store.load_transcript("t")
    assert [p.state.status for m in tr.messages for p in m.tool_parts] == ["completed"]
    # the plain path writes it ahead first: its commit waits for a tool that cannot run yet
    store = RunningGate()
    with pytest.raises(PersistenceError, match="did not run while"):
        await asyncio.wait_for(_events(_one_call_agent(store, side_effects=False), "t", pipelined=False), 10)


async def test_a_call_with_side_effects_waits_for_its_write_ahead_in_a_pipelined_run() -> None:
    store = Gated(gate=False)
    store.stored = []  # type: ignore[attr-defined]
    store.entered, store.ran = asyncio.Event(), asyncio.Event()  # type: ignore[attr-defined]
    events = await asyncio.wait_for(_events(_one_call_agent(store, side_effects=True), "t", pipelined=True), 10)
    assert events[-1]["type"] == "finish"
    assert store.stored == ["running"]  # type: ignore[attr-defined]  # durable before it ran


async def test_a_read_only_calls_running_state_that_fails_fails_the_run_and_resume_finishes() -> None:
    class FailRunning(MemoryPersistence):
        commit_waits = True
        failed = False

        async def commit(self, writes: Any, **kw: Any) -> None:
            running = any(isinstance(p, ToolPart) and p.state.status == "running"
                          for _, parts, _ in writes for p in parts)
            if running and not self.failed:
                self.failed = True
                raise PersistenceError("the database went away (on purpose)")
            await super().commit(writes, **kw)

    store = FailRunning()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PersistenceError, match="went away"):
            await asyncio.wait_for(_events(_agent(store, steps=2), "r", pipelined=True), 10)
    tr = await store.load_transcript("r")
    # what the run produced was written by its failure's own commit (the call as it ended)
    assert [p.state.status for m in tr.messages for p in m.tool_parts] == ["completed"]
    result = await _agent(store, steps=2).invoke(session_id="r", mode="resume")
    assert result.result == "stop" and result.text == "done go r"

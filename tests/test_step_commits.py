"""A step's end is committed together with the next step's start — one commit fewer per
step, and never later: its events come only after that commit, an error or an abort
still writes it, and an abort on it leaves no trace of the step that did not start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from pydantic import BaseModel

from we0nb import MaxStepsExceeded, MemoryPersistence, OutputValidationError, ScriptedModel, SqlPersistence, \
    We0Agent, tool, user_message
from we0nb.testing import output, text, tool_call


@tool(side_effects=False)
def ping(i: int) -> str:
    return f"pong {i}"


class Counting(MemoryPersistence):
    """Records each commit (one transaction in a SQL store): "part" for a call's write-ahead (one
    part, with its message's row ahead of it: the model call's usage and cost), "batch+end" when
    it also carries a held step end, else "batch"."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    async def commit(self, writes: Any, **kw: Any) -> None:
        last = writes[-1]
        if last[0] is None and len(last[1]) == 1 and all(not parts for _, parts, _ in writes[:-1]):
            self.writes.append("part")
        elif len(writes) > 1:
            self.writes.append("batch+end")
        else:
            self.writes.append("batch")
        await super().commit(writes, **kw)


async def test_a_tool_step_costs_two_commits() -> None:
    p = Counting()
    k = 5
    agent = We0Agent(ScriptedModel([[tool_call("ping", {"i": i})] for i in range(k)] + [[text("done")]]),
                     tools=[ping], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    writes = p.writes
    # per tool step its start (the first with the user message, the others with the previous
    # step's end) and the write-ahead; the final step's start (with the last tool step's end),
    # and its end with its text part (opened while streaming, closed when the stream ended):
    # k + 1 steps, 2k + 2 commits
    assert writes == ["batch+end", "part"] * k + ["batch+end", "batch+end"]


async def test_a_text_steps_part_is_written_with_its_end_and_its_events_wait_for_it(tmp_path: Path) -> None:
    """The stream's end closes the text part; nothing runs before the step's end, so both go in
    one commit — and the text-end event comes only once that commit is durable, before step-finish."""
    url = f"sqlite:///{tmp_path / 'we0.db'}"
    agent = We0Agent(ScriptedModel([[text(["a", "b"])]]), persistence=SqlPersistence(url))
    other = SqlPersistence(url)  # another connection: what a crash right now would leave
    kinds = []
    async for ev in agent.stream(session_id="s", messages=[user_message("go")]):
        kinds.append(ev["type"])
        if ev["type"] in ("user-message", "text-end"):
            stored = await other.load_transcript("s")
            ids = {m.info.id for m in stored.messages}
            if ev["type"] == "user-message":
                assert ev["message"].id in ids
            else:
                part = next(p for m in stored.messages for p in m.parts if p.id == ev["part"].id)
                assert part.text == "ab" and part.time.end is not None
    assert kinds == ["start", "user-message", "step-start", "text-start", "text-delta", "text-delta", "text-end",
                     "step-finish", "finish"]
    await other.close()
    await agent.persistence.close()


async def test_step_finish_is_seen_only_once_durable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'we0.db'}"
    agent = We0Agent(ScriptedModel([[tool_call("ping", {"i": 1})], [tool_call("ping", {"i": 2})], [text("ok")]]),
                     tools=[ping], persistence=SqlPersistence(url))
    seen = 0
    async for ev in agent.stream(session_id="s", messages=[user_message("go")]):
        if ev["type"] == "step-finish":
            seen += 1
            other = SqlPersistence(url)  # another connection: what a crash right now would leave
            tr = await other.load_transcript("s")
            done = next(m for m in tr.messages if m.info.id == ev["message"].id)
            assert done.info.time.completed is not None
            assert [x.state.status for x in done.tool_parts] == ["completed"] * len(done.tool_parts)
            await other.close()
    assert seen == 3
    await agent.persistence.close()


async def test_an_error_after_a_step_still_writes_its_end() -> None:
    p = MemoryPersistence()
    agent = We0Agent(ScriptedModel([[tool_call("ping", {"i": 1})], [text("never")]]), tools=[ping],
                     persistence=p, max_steps=1)
    events = []
    with pytest.raises(MaxStepsExceeded):
        async for ev in agent.stream(session_id="s", messages=[user_message("go")]):
            events.append(ev["type"])
    assert events[-1] == "step-finish"
    last = (await p.load_transcript("s")).messages[-1]
    assert last.info.time.completed is not None and last.tool_parts[0].state.status == "completed"


async def test_abort_on_step_finish_leaves_no_next_step(tmp_path: Path) -> None:
    p = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    model = ScriptedModel([[tool_call("ping", {"i": 1})], [text("second")]])
    agent = We0Agent(model, tools=[ping], persistence=p)
    abort = asyncio.Event()
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, session_id="s", messages=[user_message("go")]):
            if ev["type"] == "step-finish":
                abort.set()
    assert len(model.requests) == 1
    tr = await p.load_transcript("s")
    assert [m.info.role for m in tr.messages] == ["user", "assistant"]
    assert tr.messages[-1].info.time.completed is not None
    r = await agent.invoke(mode="resume", session_id="s")
    assert r.text == "second" and len(model.requests) == 2
    await p.close()


class SessionWrites(MemoryPersistence):
    """Records how the session's row is written: on its own, or with a commit."""

    def __init__(self) -> None:
        super().__init__()
        self.alone = 0
        self.with_commit: list[int] = []  # the index of each commit that carried it

    async def upsert_session(self, session: Any) -> None:
        self.alone += 1
        await super().upsert_session(session)

    async def commit(self, writes: Any, *, lease: Any = None, session: Any = None) -> None:
        self.with_commit.append(session is not None)
        if session is not None:  # (as the port's default, without counting it as alone)
            await MemoryPersistence.upsert_session(self, session)
        await super().commit(writes, lease=lease)


async def test_the_session_row_goes_with_the_runs_first_and_last_commits() -> None:
    p = SessionWrites()
    agent = We0Agent(ScriptedModel([[tool_call("ping", {"i": 1})], [text("done")], [text("again")]]), tools=[ping],
                     persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    assert p.alone == 0
    assert p.with_commit[0] and p.with_commit[-1] and not any(p.with_commit[1:-1])
    first = (await agent.transcript("s")).session
    p.with_commit.clear()
    await agent.invoke(session_id="s", messages=[user_message("again")])
    assert p.alone == 0 and p.with_commit[-1] and not any(p.with_commit[:-1])  # (it exists: only its end time)
    later = (await agent.transcript("s")).session
    assert later.time.created == first.time.created and later.time.updated > first.time.updated


class Rows(MemoryPersistence):
    """Records, per commit, the roles of its message rows and the statuses of its tool parts."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[list[str], list[str]]] = []

    async def commit(self, writes: Any, **kw: Any) -> None:
        roles = [m.role for m, _, _ in writes if m is not None]
        tools = [p.state.status for _, ps, _ in writes for p in ps if p.type == "tool"]
        self.commits.append((roles, tools))
        await super().commit(writes, **kw)


@pytest.mark.parametrize("reported", [True, False])
async def test_the_write_ahead_carries_the_message_row_only_when_the_call_reported_usage(reported: bool) -> None:
    """The model call's usage goes with its first call's write-ahead (an abort while the tool
    runs keeps it); a call that reported no token and has no cost changed nothing on the row
    the step's start wrote, so the write-ahead is the running part alone."""
    from we0nb.testing import usage

    p = Rows()
    step = [tool_call("ping", {"i": 1})] + ([usage(10, 5)] if reported else [])
    agent = We0Agent(ScriptedModel([step, [text("done")]]), tools=[ping], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    ahead = [roles for roles, tools in p.commits if tools == ["running"]]
    assert ahead == [["assistant"] if reported else []]
    stored = [m.info for m in (await p.load_transcript("s")).messages if m.info.role == "assistant"][0]
    assert stored.usage.input_tokens == (10 if reported else 0)


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_a_valid_structured_answer_is_written_with_the_runs_end(mode: str) -> None:
    """The answer is checked before the step's end is committed: a valid one ends the run, whose
    last commit (the session's row) carries the step's end — two commits for a one-step run."""
    p = SessionWrites()
    reply = [output(Answer(value=7))] if mode == "tool" else [text('{"value": 7}')]
    agent = We0Agent(ScriptedModel([reply]), persistence=p, output_type=Answer, output_mode=mode)
    events = [e async for e in _events(agent)]
    assert p.alone == 0 and p.with_commit == [True, True]  # (the step's start; its end with the session)
    assert [e["type"] for e in events][-2:] == ["step-finish", "finish"]
    tr = await agent.transcript("s")
    assert [m.info.role for m in tr.messages] == ["user", "assistant"] and tr.messages[-1].info.time.completed


async def test_an_invalid_structured_answer_commits_the_step_end_before_asking_again() -> None:
    p = Rows()
    agent = We0Agent(ScriptedModel([[text("not json")], [text('{"value": 7}')]]), persistence=p,
                     output_type=Answer, output_mode="native")
    events = [e async for e in _events(agent)]
    kinds = [e["type"] for e in events]
    asked = len(kinds) - 1 - kinds[::-1].index("user-message")  # (the question again: the last user message)
    assert kinds.index("step-finish") < asked  # (the first step's end first, then the question again)
    tr = await agent.transcript("s")
    assert [m.info.role for m in tr.messages] == ["user", "assistant", "user", "assistant"]
    assert all(m.info.time.completed for m in tr.messages if m.info.role == "assistant")


async def test_structured_answers_invalid_past_the_retries_still_write_the_step_end() -> None:
    agent = We0Agent(ScriptedModel([[text("no")], [text("still no")]]), persistence=MemoryPersistence(),
                     output_type=Answer, output_mode="native", output_retries=1)
    seen: list[str] = []
    with pytest.raises(OutputValidationError):
        async for e in _events(agent):
            seen.append(e["type"])
    assert seen.count("step-finish") == 2  # (the last step's end too, before the error)
    tr = await agent.transcript("s")
    assert [m.info.role for m in tr.messages] == ["user", "assistant", "user", "assistant"]
    assert tr.messages[-1].info.time.completed is not None


async def _events(agent: We0Agent) -> Any:
    """A structured run's events (``stream()`` refuses an output type: the run is driven as
    ``invoke`` drives it)."""
    from we0nb.engine.run import Run

    run = Run(agent, agent.build_request(session_id="s", messages=[user_message("go")]), structured=True)
    async for e in run.events():
        yield e

"""Shared helpers for engine tests: seed a persisted state exactly as a crash would leave it."""

from __future__ import annotations

from typing import Any

from sql_support import put
from we0nb import tool
from we0nb._ids import new_id
from we0nb.messages import (
    AssistantMessage, MessageTime, PartTime, Session, SessionTime, StepStartPart, TextPart, ToolPart,
    ToolStateCompleted, ToolStateError, ToolStatePending, ToolStateRunning, ToolTime, UserMessage,
)


class Log:
    """Append-only record of tool bodies that actually ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)


def make_tools(log: Log, *, fail: tuple[str, ...] = ()):
    """write/rm have side effects; read/stat are read-only; 'strict' blocks on error."""

    @tool
    def write(path: str) -> str:
        log.calls.append(("write", path))
        return f"wrote {path}"

    @tool
    def rm(path: str) -> str:
        log.calls.append(("rm", path))
        return f"removed {path}"

    @tool(side_effects=False)
    def read(path: str) -> str:
        log.calls.append(("read", path))
        if "read" in fail:
            raise RuntimeError(f"cannot read {path}")
        return f"content of {path}"

    @tool(side_effects=False)
    def stat(path: str) -> str:
        log.calls.append(("stat", path))
        return f"size of {path}"

    @tool(side_effects=False, blocks_on_error=True)
    def strict(path: str) -> str:
        log.calls.append(("strict", path))
        if "strict" in fail:
            raise ValueError(f"strict failed on {path}")
        return f"strict ok {path}"

    return [write, rm, read, stat, strict]


def state(status: str, **input: Any):
    inp = input or {"path": "f"}
    if status == "pending":
        return ToolStatePending(input=inp)
    if status == "running":
        return ToolStateRunning(input=inp, time=ToolTime(start=1.0))
    if status == "completed":
        return ToolStateCompleted(input=inp, output="done before", time=ToolTime(start=1.0, end=2.0))
    if status == "error":
        return ToolStateError(input=inp, error="failed before", time=ToolTime(start=1.0, end=2.0))
    raise ValueError(status)


async def seed(p, sid: str, tools: list[tuple[str, Any]], *, completed: bool = False,
               text: str = "partial", error=None) -> dict[str, str]:
    """A session whose last assistant message holds these tool parts; returns tool → part id."""
    await p.upsert_session(Session(id=sid, time=SessionTime(created=1.0, updated=1.0)))
    u = UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=1.0))
    await put(p, u)
    await put(p, None, TextPart(id=new_id("prt"), session_id=sid, message_id=u.id, text="do it",
                                 time=PartTime(start=1.0, end=1.0)))
    a = AssistantMessage(id=new_id("msg"), session_id=sid, parent_id=u.id, error=error,
                         time=MessageTime(created=1.0, completed=2.0 if completed else None))
    await put(p, a)
    await put(p, None, StepStartPart(id=new_id("prt"), session_id=sid, message_id=a.id, time=1.0))
    if text:
        await put(p, None, TextPart(id=new_id("prt"), session_id=sid, message_id=a.id, text=text,
                                     time=PartTime(start=1.0)))
    ids = {}
    for i, (name, st) in enumerate(tools):
        pid = new_id("prt")
        ids[f"{i}:{name}"] = pid
        await put(p, None, ToolPart(id=pid, session_id=sid, message_id=a.id, call_id=f"call_{i}",
                                     tool=name, state=st))
    return ids


async def tool_parts(agent, sid: str) -> list[ToolPart]:
    t = await agent.transcript(sid)
    return [p for m in t.messages for p in m.parts if isinstance(p, ToolPart)]


def assert_paired(requests) -> None:
    """The model never receives a tool call without its result."""
    for r in requests:
        calls = [c.call_id for m in r.messages if m.role == "assistant" for c in m.tool_calls]
        results = [m.call_id for m in r.messages if m.role == "tool"]
        assert sorted(calls) == sorted(results), (calls, results)


def hanging_read(result: str):
    """``(slow_read, started)``: a read-only tool whose first call sets ``started`` and hangs
    until an abort cancels it; later calls (the recall) return ``result.format(path=path)`` at once."""
    import asyncio

    started = asyncio.Event()

    @tool(side_effects=False)
    async def slow_read(path: str) -> str:
        if not started.is_set():
            started.set()
            await asyncio.sleep(30)
        return result.format(path=path)

    return slow_read, started

"""The records the conformance checks write: sessions, messages and every kind of part and tool state."""

from __future__ import annotations

from typing import Any, Optional

from ..._ids import new_id
from ...messages import (
    AssistantMessage, CompactionPart, MessageError, MessageTime, Part, PartTime, ReasoningPart, Session, SessionTime,
    StepFinishPart, StepStartPart, TextPart, ToolPart, ToolStateCompleted, ToolStateError, ToolStatePending,
    ToolStateRunning, ToolTime, Usage, UserMessage,
)

__all__ = ["NUL", "session", "user", "assistant", "history", "nul_history", "write"]

#: a string with a NUL character (PostgreSQL text cannot hold one: stores must still round-trip it)
NUL = "a\x00b"


def session(sid: str, title: str = "t", created: float = 1.5) -> Session:
    return Session(id=sid, title=title, time=SessionTime(created=created, updated=created + 0.75))


def user(sid: str, body: str = "hi", created: float = 3.0) -> tuple[UserMessage, TextPart]:
    """A user message and its text part."""
    u = UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=created))
    return u, TextPart(id=new_id("prt"), session_id=sid, message_id=u.id, text=body,
                       time=PartTime(start=created, end=created))


def assistant(sid: str, parent: str, text: str = "ok", created: float = 4.0,
              summary: bool = False) -> tuple[AssistantMessage, list[Part]]:
    """A finished assistant message with a step and a text part (a compaction summary with ``summary``)."""
    a = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=created, completed=created + 1),
                         parent_id=parent, model_id="m", finish_reason="stop", usage=Usage(input_tokens=3),
                         summary=summary)
    mk: dict[str, Any] = dict(session_id=sid, message_id=a.id)
    parts: list[Part] = [StepStartPart(id=new_id("prt"), time=created, **mk)]
    if summary:
        parts.append(CompactionPart(id=new_id("prt"), summary=text, time=created + 0.5, **mk))
    else:
        parts.append(TextPart(id=new_id("prt"), text=text, time=PartTime(start=created, end=created + 0.5), **mk))
    return a, parts


def history(sid: str) -> tuple[list[Any], list[Part]]:
    """A user message and an assistant message with one part of every kind and tool state."""
    u, ut = user(sid, "hi ünïcode ✓", created=10.0)
    a = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=11.0, completed=19.0),
                         parent_id=u.id, model_id="m-1", finish_reason="tool-calls",
                         usage=Usage(input_tokens=10, output_tokens=5, reasoning_tokens=2, cached_tokens=1),
                         error=MessageError(reason="R", message="why", metadata={"k": [1, 2]}))
    mk: dict[str, Any] = dict(session_id=sid, message_id=a.id)
    parts: list[Part] = [
        ut,
        StepStartPart(id=new_id("prt"), time=11.0, **mk),
        ReasoningPart(id=new_id("prt"), text="hmm", time=PartTime(start=11.1), **mk),
        TextPart(id=new_id("prt"), text="let me look", time=PartTime(start=11.2, end=11.3), **mk),
        ToolPart(id=new_id("prt"), call_id="c1", tool="read",  # (§11 keys of the wrong JSON types: not read)
                 state=ToolStatePending(input={"p": "x"}, metadata={"idempotency_key": 7, "attempt": 2.5,
                                                                    "in_doubt": True, "reconciled": "yes"}), **mk),
        ToolPart(id=new_id("prt"), call_id="c2", tool="read",
                 state=ToolStateRunning(input={"p": "y"}, time=ToolTime(start=12.0),
                                        metadata={"idempotency_key": "key-c2", "attempt": 1}), **mk),
        ToolPart(id=new_id("prt"), call_id="c3", tool="read",
                 state=ToolStateCompleted(input={"p": "z"}, output="Z", metadata={"recalled": True, "attempt": 2},
                                          time=ToolTime(start=12.0, end=12.5)), **mk),
        ToolPart(id=new_id("prt"), call_id="c4", tool="write",
                 state=ToolStateError(input={"p": "w"}, error="stopped",
                                      metadata={"interrupted": True, "reason": "resume", "in_doubt": True,
                                                "idempotency_key": "key-c4", "attempt": 1},
                                      time=ToolTime(start=13.0, end=13.5)), **mk),
        ToolPart(id=new_id("prt"), call_id="c5", tool="x", state=ToolStatePending(input={}, raw="{not json"), **mk),
        ToolPart(id=new_id("prt"), call_id="c6", tool="write",
                 state=ToolStateCompleted(input={"p": "v"}, output="V", time=ToolTime(start=13.6, end=14.0),
                                          metadata={"reconciled": True, "attempt": 1, "idempotency_key": "key-c6"}),
                 **mk),
        ToolPart(id=new_id("prt"), call_id="c7", tool="write",
                 state=ToolStateError(input={}, error="never started", time=ToolTime(end=14.1),
                                      metadata={"interrupted": True, "reason": "blocked", "in_doubt": False}), **mk),
        StepFinishPart(id=new_id("prt"), reason="tool-calls", usage=Usage(input_tokens=10), time=19.0, **mk),
        CompactionPart(id=new_id("prt"), summary="so far", time=19.5, **mk),
    ]
    return [u, a], parts


def nul_history(sid: str) -> tuple[Session, list[Any], list[Part]]:
    """NUL in every kind of string a transcript holds (ids excepted: runs refuse them)."""
    u, ut = user(sid, "user says " + NUL)
    a = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=4.0, completed=5.0),
                         parent_id=u.id, model_id="model" + NUL, finish_reason="stop" + NUL, usage=Usage(),
                         error=MessageError(reason="Reason" + NUL, message="failed: " + NUL, metadata={"k": NUL}))
    mk: dict[str, Any] = dict(session_id=sid, message_id=a.id)
    parts: list[Part] = [
        ut,
        StepStartPart(id=new_id("prt"), time=4.0, **mk),
        TextPart(id=new_id("prt"), text="model text " + NUL, time=PartTime(start=4.1), **mk),
        ToolPart(id=new_id("prt"), call_id="call" + NUL, tool="tool" + NUL,
                 state=ToolStateCompleted(input={"q": NUL}, output="output " + NUL, time=ToolTime(start=4.2, end=4.3)),
                 **mk),
        ToolPart(id=new_id("prt"), call_id="c2", tool="t2",
                 state=ToolStateError(input={}, error="error " + NUL, metadata={"reason": "r" + NUL, "interrupted": True,
                                                "in_doubt": "true", "attempt": True, "idempotency_key": 5,
                                                "reconciled": 1},
                                      time=ToolTime(start=4.4, end=4.5)), **mk),
    ]
    return session(sid, "title " + NUL), [u, a], parts


async def write(store: Any, sid: str, title: str = "t") -> tuple[list[Any], list[Part]]:
    """:func:`history` of a new session ``sid``, written in three commits (no lease)."""
    await store.upsert_session(session(sid, title))
    msgs, parts = history(sid)
    await store.commit([(msgs[0], parts[:1], None)])
    await store.commit([(msgs[1], [], None)])
    await store.commit([(None, parts[1:], None)])
    return msgs, parts


def first(items: list[Any], pred: Any) -> Optional[Any]:
    return next((x for x in items if pred(x)), None)

"""The request's history built incrementally is the history built from scratch, whatever changes.

:class:`HistoryCache` converts each message once it is final; the last message of a request,
when it was settled then (a user message, or an assistant message whose step ended), is kept
as converted and taken as final once a message follows it — unless it gained a part since.
"""

from __future__ import annotations

from typing import Any

import pytest

from we0nb.engine import history
from we0nb.engine.history import HistoryCache, to_model_messages
from we0nb.messages import (AssistantMessage, MessageTime, MessageWithParts, TextPart, ToolPart, ToolStateCompleted,
                            ToolStatePending, ToolTime, UserMessage)

SID = "ses_history"


def _user(n: int) -> MessageWithParts:
    mid = f"msg_{n:04d}"
    return MessageWithParts(info=UserMessage(id=mid, session_id=SID, time=MessageTime(created=n)),
                            parts=[TextPart(id=f"prt_{n:04d}a", session_id=SID, message_id=mid, text=f"ask {n}")])


def _call(mid: str, n: int, done: bool) -> ToolPart:
    state: Any = (ToolStateCompleted(input={"i": n}, output=f"out {n}", time=ToolTime(start=1, end=2)) if done
                  else ToolStatePending(input={"i": n}))
    return ToolPart(id=f"prt_{mid[4:]}{n}", session_id=SID, message_id=mid, call_id=f"call_{mid}_{n}", tool="t",
                    state=state)


def _assistant(n: int, *, completed: bool = True, calls: int = 1) -> MessageWithParts:
    mid = f"msg_{n:04d}"
    info = AssistantMessage(id=mid, session_id=SID, time=MessageTime(created=n, completed=n + 0.5 if completed else None))
    parts: list[Any] = [TextPart(id=f"prt_{n:04d}a", session_id=SID, message_id=mid, text=f"say {n}")]
    parts += [_call(mid, i, True) for i in range(calls)]
    return MessageWithParts(info=info, parts=parts)


def test_a_growing_run_gets_the_history_built_from_scratch_at_every_step() -> None:
    cache, messages = HistoryCache(), [_user(0)]
    assert cache.build(messages) == to_model_messages(messages)
    for n in range(1, 8):
        messages.append(_assistant(n, calls=n % 3))
        assert cache.build(messages) == to_model_messages(messages)
        assert cache.build(messages) == to_model_messages(messages)  # (built twice between steps: the compaction check)


def test_a_settled_last_message_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = history.convert

    def counting(m: MessageWithParts) -> Any:
        seen.append(m.info.id)
        return real(m)

    monkeypatch.setattr(history, "convert", counting)
    cache, messages = HistoryCache(), [_user(0), _assistant(1)]
    cache.build(messages)
    messages.append(_assistant(2))
    cache.build(messages)
    messages.append(_assistant(3))
    cache.build(messages)
    assert seen == ["msg_0000", "msg_0001", "msg_0002", "msg_0003"]


def test_a_last_message_that_gained_a_part_is_converted_again() -> None:
    cache, messages = HistoryCache(), [_user(0), _assistant(1, calls=1)]
    cache.build(messages)
    messages[1].parts.append(_call("msg_0001", 7, True))  # (what no engine path does without invalidate(): still right)
    messages.append(_assistant(2))
    got = cache.build(messages)
    assert got == to_model_messages(messages)
    assert any(getattr(item, "call_id", None) == "call_msg_0001_7" for item in got)


def test_an_unfinished_last_message_is_not_kept_as_it_was() -> None:
    cache, messages = HistoryCache(), [_user(0), _assistant(1, completed=False, calls=0)]
    pending = _call("msg_0001", 0, False)
    messages[1].parts.append(pending)
    before = cache.build(messages)
    assert not any(getattr(item, "call_id", None) == pending.call_id for item in before)  # (unfinished: left out)
    pending.state = ToolStateCompleted(input={"i": 0}, output="late", time=ToolTime(start=1, end=2))
    messages[1].info.time = MessageTime(created=1, completed=2)
    messages.append(_user(2))
    assert cache.build(messages) == to_model_messages(messages)


def test_invalidate_drops_the_kept_last_message() -> None:
    cache, messages = HistoryCache(), [_user(0), _assistant(1, calls=1)]
    cache.build(messages)
    messages[1].parts[1].state = ToolStateCompleted(input={"i": 0}, output="changed", time=ToolTime(start=1, end=2))
    cache.invalidate()  # (what recovery, revert and compaction call after changing a message)
    messages.append(_user(2))
    got = cache.build(messages)
    assert got == to_model_messages(messages)
    assert any(getattr(item, "content", None) == "changed" for item in got)

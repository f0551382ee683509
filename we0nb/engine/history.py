"""Turning the persisted transcript into what the model sees.

Rules: a tool call is sent only together with its result (unfinished calls are left out),
empty assistant turns are dropped, and history before the latest compaction is replaced
by its summary. :class:`HistoryCache` converts finished messages once, so building a
request costs O(new messages), not O(history).
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..messages import CompactionPart, MessageWithParts, ReasoningPart, TextPart, ToolPart
from ..models.base import AssistantTurn, ModelMessage, ToolCall, ToolResult, UserTurn

__all__ = ["to_model_messages", "HistoryCache", "SUMMARY_PREFIX"]

SUMMARY_PREFIX = "Summary of the conversation so far:\n"


def _convert(m: MessageWithParts) -> list[ModelMessage]:
    if m.info.role == "user":
        return [UserTurn("".join(p.text for p in m.parts if isinstance(p, TextPart)))]
    out: list[ModelMessage] = []
    text: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    results: list[ToolResult] = []
    for p in m.parts:
        if isinstance(p, TextPart):
            text.append(p.text)
        elif isinstance(p, ReasoningPart):
            thinking.append(p.text)
        elif isinstance(p, ToolPart):
            st = p.state
            if st.status == "completed":
                calls.append(ToolCall(p.call_id, p.tool, st.input))
                results.append(ToolResult(p.call_id, p.tool, st.output, False))
            elif st.status == "error":
                calls.append(ToolCall(p.call_id, p.tool, st.input))
                results.append(ToolResult(p.call_id, p.tool, st.error, True))
        elif isinstance(p, CompactionPart):
            return [UserTurn(SUMMARY_PREFIX + p.summary)]
    joined = "".join(text)
    if joined or calls:
        out.append(AssistantTurn(joined, "".join(thinking), calls))
        out.extend(results)
    return out


def _visible(messages: Sequence[MessageWithParts]) -> int:
    """Index of the first message the model sees: the latest compaction summary, else 0."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.info.role == "assistant" and getattr(m.info, "summary", False) and any(
            isinstance(p, CompactionPart) for p in m.parts
        ):
            return i
    return 0


def to_model_messages(messages: Sequence[MessageWithParts]) -> list[ModelMessage]:
    """The whole history as model messages (no cache)."""
    out: list[ModelMessage] = []
    for m in messages[_visible(messages):]:
        out.extend(_convert(m))
    return out


class HistoryCache:
    """Incremental conversion: every message but the last is final and converted once."""

    def __init__(self) -> None:
        self._messages: Optional[list[MessageWithParts]] = None
        self._start = 0
        self._done = 0
        self._converted: list[ModelMessage] = []

    def invalidate(self) -> None:
        self._messages = None

    def build(self, messages: list[MessageWithParts]) -> list[ModelMessage]:
        if self._messages is not messages or self._done > len(messages):
            self._messages = messages
            self._start = self._done = _visible(messages)
            self._converted = []
        end = len(messages) - 1
        while self._done < end:
            m = messages[self._done]
            if m.info.role == "assistant" and getattr(m.info, "summary", False):
                # a compaction summary restarts what the model sees
                self._start = self._done
                self._converted = []
            self._converted.extend(_convert(m))
            self._done += 1
        out = list(self._converted)
        if end >= self._start and end >= 0:
            last = messages[end]
            if last.info.role == "assistant" and getattr(last.info, "summary", False):
                return _convert(last)
            out.extend(_convert(last))
        return out

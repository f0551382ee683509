"""Turning the persisted transcript into what the model sees.

Rules: a tool call is sent only together with its result (unfinished calls are left out),
empty assistant turns are dropped, and history before the latest compaction is replaced
by its summary. :class:`HistoryCache` converts finished messages once, so building a
request costs O(new messages), not O(history); it can start from the stored model views of
the older messages (``earlier``), so a cold start need not load them as objects.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..messages import CompactionPart, MessageWithParts
from ..models.base import AssistantTurn, ModelMessage, ReasoningBlock, ToolCall, ToolResult, UserTurn

__all__ = ["to_model_messages", "convert", "HistoryCache", "SUMMARY_PREFIX"]

SUMMARY_PREFIX = "Summary of the conversation so far:\n"


def convert(m: MessageWithParts) -> list[ModelMessage]:
    """One message as model items (a compaction summary: the user turn that stands for it)."""
    if m.info.role == "user":
        return [UserTurn("".join(p.text for p in m.parts if p.type == "text"))]
    out: list[ModelMessage] = []
    text: list[str] = []
    thinking: list[str] = []
    blocks: list[ReasoningBlock] = []
    calls: list[ToolCall] = []
    results: list[ToolResult] = []
    # parts told apart by their type field: a failing isinstance against a pydantic class costs
    # several field reads (its metaclass is not type: __instancecheck__ is looked up and called,
    # and a miss reads __class__ through pydantic's __getattr__ hook)
    for p in m.parts:
        if p.type == "text":
            text.append(p.text)
        elif p.type == "reasoning":
            thinking.append(p.text)
            if p.signature is not None or p.redacted is not None:  # (an unsigned block cannot go back)
                blocks.append(ReasoningBlock(p.text, p.signature, p.redacted))
        elif p.type == "tool":
            st = p.state
            if st.status == "completed":
                calls.append(ToolCall(p.call_id, p.tool, st.input))
                results.append(ToolResult(p.call_id, p.tool, st.output, False))
            elif st.status == "error":
                calls.append(ToolCall(p.call_id, p.tool, st.input))
                results.append(ToolResult(p.call_id, p.tool, st.error, True))
        elif p.type == "compaction":
            return [UserTurn(SUMMARY_PREFIX + p.summary)]
    joined = "".join(text)
    if joined or calls:
        out.append(AssistantTurn(joined, "".join(thinking), calls, reasoning_blocks=blocks))
        out.extend(results)
    return out


def _latest_summary(messages: Sequence[MessageWithParts]) -> int:
    """Index of the latest compaction summary (where what the model sees starts), else -1."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.info.role == "assistant" and getattr(m.info, "summary", False) and any(
            isinstance(p, CompactionPart) for p in m.parts
        ):
            return i
    return -1


def to_model_messages(messages: Sequence[MessageWithParts]) -> list[ModelMessage]:
    """The whole history as model messages (no cache)."""
    out: list[ModelMessage] = []
    for m in messages[max(_latest_summary(messages), 0):]:
        out.extend(convert(m))
    return out


class HistoryCache:
    """Incremental conversion: every message but the last is final and converted once.

    ``earlier``: the model items of the messages before the list it is given (stored views),
    used as they are unless a summary in the list replaces them.
    """

    def __init__(self, earlier: Sequence[ModelMessage] = ()) -> None:
        self._earlier = list(earlier)
        self._messages: Optional[list[MessageWithParts]] = None
        self._start = 0
        self._done = 0
        self._converted: list[ModelMessage] = []
        #: the last message as converted for the previous request, when it was settled then:
        #: ``(message, its part count, its items)`` — taken as its final conversion once a later
        #: message follows it (a step's request is built before its own message joins the list)
        self._last: Optional[tuple[MessageWithParts, int, list[ModelMessage]]] = None

    def invalidate(self) -> None:
        self._messages = None

    def build(self, messages: list[MessageWithParts]) -> list[ModelMessage]:
        if self._messages is not messages or self._done > len(messages):
            self._messages = messages
            summary = _latest_summary(messages)
            self._start = self._done = max(summary, 0)
            self._converted = [] if summary >= 0 else list(self._earlier)
            self._last = None
        end = len(messages) - 1
        while self._done < end:
            m = messages[self._done]
            if m.info.role == "assistant" and getattr(m.info, "summary", False):
                # a compaction summary restarts what the model sees
                self._start = self._done
                self._converted = []
            last = self._last
            if last is not None and last[0] is m and last[1] == len(m.parts):
                self._converted.extend(last[2])
            else:
                self._converted.extend(convert(m))
            self._last = None
            self._done += 1
        out = list(self._converted)
        if end >= self._start and end >= 0:
            last_message = messages[end]
            if last_message.info.role == "assistant" and getattr(last_message.info, "summary", False):
                return convert(last_message)
            items = convert(last_message)
            info = last_message.info
            if info.role == "user" or info.time.completed is not None:  # (settled: no more parts come)
                self._last = (last_message, len(last_message.parts), items)
            out.extend(items)
        return out

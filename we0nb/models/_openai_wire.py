"""The chat-completions wire format: requests out, stream chunks in (pure: no I/O).

Requests: the port's history as ``messages`` (an assistant turn that only calls tools is
sent with ``"content": ""`` — some servers, llama-cpp-python's among them, refuse
``null``), the tool schemas as ``tools``, and the structured-output schema as a
``response_format`` in one of two dialects:

* ``"json_schema"`` — ``{"type": "json_schema", "json_schema": {"name", "schema"}}``, as
  OpenAI, vLLM and llama.cpp's ``llama-server`` document it;
* ``"json_object"`` — ``{"type": "json_object", "schema": …}``, the dialect of
  llama-cpp-python's server (it answers HTTP 500 to the other one).

Stream: ``delta.content`` → :class:`TextDelta`; ``delta.reasoning_content`` /
``delta.reasoning`` → :class:`ReasoningDelta`; ``delta.tool_calls`` pieces joined per
``index`` and emitted as :class:`ToolCallEvent` when the finish reason arrives; usage →
:attr:`FinishEvent.usage`; finish reasons → ``"stop"``, ``"tool-calls"``, ``"length"``,
``"content-filter"`` (others pass through with ``_`` → ``-``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from .._ids import new_id
from ..errors import ModelProviderError
from ..messages import Usage
from ._wire import as_int, get, tool_input
from .base import (
    AssistantTurn,
    FinishEvent,
    ModelEvent,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
    ToolResult,
    UserTurn,
)

__all__ = ["to_openai_messages", "to_openai_tools", "response_format", "ChunkAccumulator", "NativeFormat",
           "FINISH_REASONS"]

NativeFormat = Literal["json_schema", "json_object"]

FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}

_NAME = re.compile(r"[^A-Za-z0-9_-]+")


# --------------------------------------------------------------------------- request


def to_openai_messages(request: ModelRequest, *, send_reasoning: bool = False) -> list[dict[str, Any]]:
    """The request's history as chat-completions messages (system prompt first)."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for m in request.messages:
        if isinstance(m, UserTurn):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, AssistantTurn):
            # "" rather than null: llama-cpp-python's server answers 500 to a null content
            msg: dict[str, Any] = {"role": "assistant", "content": m.text}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.call_id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.input, ensure_ascii=False)}}
                    for c in m.tool_calls
                ]
            if send_reasoning and m.reasoning:
                msg["reasoning_content"] = m.reasoning
            out.append(msg)
        elif isinstance(m, ToolResult):
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.content})
        else:  # pragma: no cover - the port has exactly three message kinds
            raise TypeError(f"OpenAIChatModel: unknown history item {m!r}.")
    return out


def to_openai_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [{"type": "function",
             "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools]


def response_format(request: ModelRequest, dialect: NativeFormat) -> Optional[dict[str, Any]]:
    """The ``response_format`` that asks the server for the output schema (native mode only)."""
    if request.output_mode != "native" or not request.output_schema:
        return None
    schema = request.output_schema
    if dialect == "json_object":
        return {"type": "json_object", "schema": schema}
    name = _NAME.sub("_", str(schema.get("title") or "output"))[:64] or "output"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


# --------------------------------------------------------------------------- stream


@dataclass
class _PendingCall:
    index: int
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def event(self) -> ToolCallEvent:
        return ToolCallEvent(self.call_id or new_id("call"), self.name, tool_input("".join(self.arguments)))


def to_usage(u: Any) -> Usage:
    def num(x: Any) -> int:
        return as_int(x) or 0

    return Usage(
        input_tokens=num(get(u, "prompt_tokens")),
        output_tokens=num(get(u, "completion_tokens")),
        reasoning_tokens=num(get(get(u, "completion_tokens_details"), "reasoning_tokens")),
        cached_tokens=num(get(get(u, "prompt_tokens_details"), "cached_tokens")),
    )


class ChunkAccumulator:
    """Turns chat-completion chunks into model events (pure: no I/O)."""

    def __init__(self) -> None:
        self.calls: dict[int, _PendingCall] = {}
        self.finish_reason: Optional[str] = None
        self.usage = Usage()
        self.emitted = False
        self.chunks = 0

    def feed(self, chunk: Any) -> list[ModelEvent]:
        self.chunks += 1
        out: list[ModelEvent] = []
        u = get(chunk, "usage")
        if u is not None:
            self.usage = to_usage(u)  # some servers repeat a running total: keep the last
        for choice in get(chunk, "choices") or ():
            if (get(choice, "index") or 0) != 0:
                continue  # n > 1 is not used: only the first choice counts
            delta = get(choice, "delta")
            if delta is not None:
                r = get(delta, "reasoning_content")
                if r is None:
                    r = get(delta, "reasoning")
                if isinstance(r, str) and r:
                    out.append(ReasoningDelta(r))
                c = get(delta, "content")
                if isinstance(c, str) and c:
                    out.append(TextDelta(c))
                for tc in get(delta, "tool_calls") or ():
                    self._tool_piece(tc)
            reason = get(choice, "finish_reason")
            if reason and self.finish_reason is None:
                self.finish_reason = str(reason)
                out.extend(self._calls())
        return out

    def _tool_piece(self, tc: Any) -> None:
        index = get(tc, "index")
        cid = get(tc, "id")
        if not isinstance(index, int):
            # servers that omit the index: a new id starts a new call, otherwise continue the last
            known = next((c.index for c in self.calls.values() if cid and c.call_id == cid), None)
            if known is not None:
                index = known
            elif cid or not self.calls:
                index = len(self.calls)
            else:
                index = max(self.calls)
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _PendingCall(index)
        if isinstance(cid, str) and cid and not call.call_id:
            call.call_id = cid
        fn = get(tc, "function")
        name = get(fn, "name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        args = get(fn, "arguments")
        if isinstance(args, str) and args:
            call.arguments.append(args)
        elif isinstance(args, dict):  # a few servers send the arguments as an object
            call.arguments.append(json.dumps(args))

    def _calls(self) -> list[ModelEvent]:
        if self.emitted:
            return []
        self.emitted = True
        return [self.calls[i].event() for i in sorted(self.calls) if self.calls[i].name]

    def finish(self, where: str = "The model server") -> list[ModelEvent]:
        """The step's :class:`FinishEvent`; an error when the stream ended without one."""
        if self.finish_reason is None:
            if self.chunks == 0:
                raise ModelProviderError(
                    f"{where} returned an empty stream (HTTP 200 with no events): it failed on this request; "
                    "look at the server's log for the reason")
            raise ModelProviderError(
                "The model stream ended before the model finished (no finish_reason was received): "
                "the connection was probably cut", retryable=True)
        has_calls = any(c.name for c in self.calls.values())
        reason = FINISH_REASONS.get(self.finish_reason, self.finish_reason.replace("_", "-"))
        if has_calls and reason == "stop":
            reason = "tool-calls"  # e.g. Ollama reports "stop" for a step that called tools
        return [FinishEvent(reason, self.usage)]

"""The Messages API wire format of :class:`~we0nb.models.anthropic.AnthropicModel`: the request
built from a :class:`ModelRequest`, and the SSE event sequence turned into model events.

Pure functions and a pure accumulator (no I/O), so each rule is testable on its own.

Request rules:

* the history becomes alternating ``user``/``assistant`` messages of content blocks: tool
  results (``tool_result``, ``is_error`` for a failed call) go in the user message that
  follows the assistant's ``tool_use`` blocks, before any user text;
* an assistant turn sends back its signed ``thinking`` and ``redacted_thinking`` blocks
  first (as received), then its text, then its ``tool_use`` blocks;
* the API reads a final assistant message as a prefill to continue (and rejects one with
  thinking enabled), so a history that ends with the model's own interrupted answer gets
  a short user turn (:data:`CONTINUE_PROMPT`);
* ``cache`` (``prompt_cache=True``) puts ``cache_control`` breakpoints on the system
  prompt, the last tool and the last block of the latest turn.

Stream rules: ``message_start`` … ``content_block_start/delta/stop`` … ``message_delta`` …
``message_stop``, with ``ping`` anywhere (the SDK drops pings and raises ``error`` events).
Text and thinking deltas stream as they come; a tool call is emitted at its block's stop,
with its ``input_json_delta`` pieces parsed as JSON (raw text when they do not parse); a
thinking block's end carries its signature; event types this module does not know are
ignored, as the API reference asks. A delta for a block that never started is a malformed
stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

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
    ReasoningEnd,
    TextDelta,
    ToolCallEvent,
    ToolResult,
    UserTurn,
)

__all__ = ["CONTINUE_PROMPT", "to_anthropic_messages", "to_anthropic_tools", "system_param", "StreamAccumulator"]

CONTINUE_PROMPT = "Your previous reply was interrupted. Continue it from where it stopped."
_EPHEMERAL = {"type": "ephemeral"}
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
}


# --------------------------------------------------------------------------- request


def _assistant_blocks(m: AssistantTurn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in m.reasoning_blocks:
        if b.redacted is not None:
            blocks.append({"type": "redacted_thinking", "data": b.redacted})
        elif b.signature is not None:
            blocks.append({"type": "thinking", "thinking": b.text, "signature": b.signature})
    if m.text:
        blocks.append({"type": "text", "text": m.text})
    for c in m.tool_calls:
        blocks.append({"type": "tool_use", "id": c.call_id, "name": c.name, "input": c.input})
    return blocks


def to_anthropic_messages(request: ModelRequest, *, cache: bool = False) -> list[dict[str, Any]]:
    """The request's history as Messages API ``messages`` (the system prompt goes apart)."""
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in request.messages:
        if isinstance(m, UserTurn):
            add("user", [{"type": "text", "text": m.text}] if m.text else [])
        elif isinstance(m, AssistantTurn):
            add("assistant", _assistant_blocks(m))
        elif isinstance(m, ToolResult):
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.call_id}
            if m.content:
                block["content"] = m.content
            if m.is_error:
                block["is_error"] = True
            add("user", [block])
        else:  # pragma: no cover - the port has exactly three message kinds
            raise TypeError(f"AnthropicModel: unknown history item {m!r}.")
    if out and out[-1]["role"] == "assistant":
        add("user", [{"type": "text", "text": CONTINUE_PROMPT}])
    if cache and out:
        out[-1]["content"][-1]["cache_control"] = _EPHEMERAL
    return out


def to_anthropic_tools(request: ModelRequest, *, cache: bool = False) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for t in request.tools:
        spec: dict[str, Any] = {"name": t.name, "input_schema": t.parameters}
        if t.description:
            spec["description"] = t.description
        tools.append(spec)
    if cache and tools:
        tools[-1]["cache_control"] = _EPHEMERAL
    return tools


def system_param(system: Optional[str], *, cache: bool = False) -> Any:
    """The ``system`` parameter: the prompt as text, or as one cached text block."""
    if not system:
        return None
    if cache:
        return [{"type": "text", "text": system, "cache_control": _EPHEMERAL}]
    return system


# --------------------------------------------------------------------------- stream


@dataclass
class _Block:
    kind: str
    call_id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    data: Optional[str] = None
    start_input: Any = None

    def tool_event(self) -> ToolCallEvent:
        empty = self.start_input if isinstance(self.start_input, dict) else None
        return ToolCallEvent(self.call_id or new_id("call"), self.name, tool_input("".join(self.pieces), empty))


class StreamAccumulator:
    """Turns Messages API stream events into model events (pure: no I/O)."""

    def __init__(self, where: str = "The Anthropic API") -> None:
        self.where = where
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: Optional[str] = None
        self.stopped = False
        self.tokens = {"input": 0, "cache_write": 0, "cache_read": 0, "output": 0}
        self.thinking_tokens: Optional[int] = None
        self.has_calls = False

    def malformed(self, what: str) -> ModelProviderError:
        return ModelProviderError(f"{self.where} sent a malformed stream: {what}", retryable=True)

    def feed(self, ev: Any) -> list[ModelEvent]:
        kind = get(ev, "type")
        if kind == "content_block_delta":
            return self._delta(ev)
        if kind == "content_block_start":
            return self._start(ev)
        if kind == "content_block_stop":
            return self._stop(ev)
        if kind == "message_start":
            self._usage(get(get(ev, "message"), "usage"))
        elif kind == "message_delta":
            reason = get(get(ev, "delta"), "stop_reason")
            if isinstance(reason, str) and reason:
                self.stop_reason = reason
            self._usage(get(ev, "usage"))
        elif kind == "message_stop":
            self.stopped = True
        return []  # ping and event types added to the API later: nothing to do

    def _index(self, ev: Any) -> int:
        index = get(ev, "index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise self.malformed(f"a {get(ev, 'type')} event without a block index")
        return index

    def _start(self, ev: Any) -> list[ModelEvent]:
        index = self._index(ev)
        cb = get(ev, "content_block")
        kind = get(cb, "type")
        if not isinstance(kind, str):
            raise self.malformed(f"content_block_start {index} without a block type")
        block = self.blocks[index] = _Block(kind)
        if kind == "text":
            t = get(cb, "text")
            return [TextDelta(t)] if isinstance(t, str) and t else []
        if kind == "thinking":
            t = get(cb, "thinking")
            return [ReasoningDelta(t)] if isinstance(t, str) and t else []
        if kind == "redacted_thinking":
            data = get(cb, "data")
            block.data = data if isinstance(data, str) else ""
        elif kind == "tool_use":
            cid, name = get(cb, "id"), get(cb, "name")
            block.call_id = cid if isinstance(cid, str) else ""
            block.name = name if isinstance(name, str) else ""
            block.start_input = get(cb, "input")
        return []

    def _delta(self, ev: Any) -> list[ModelEvent]:
        index = self._index(ev)
        block = self.blocks.get(index)
        if block is None:
            raise self.malformed(f"a content_block_delta for block {index}, which never started")
        delta = get(ev, "delta")
        dtype = get(delta, "type")
        if dtype == "text_delta":
            t = get(delta, "text")
            return [TextDelta(t)] if isinstance(t, str) and t else []
        if dtype == "thinking_delta":
            t = get(delta, "thinking")
            return [ReasoningDelta(t)] if isinstance(t, str) and t else []
        if dtype == "input_json_delta":
            piece = get(delta, "partial_json")
            if isinstance(piece, str):
                block.pieces.append(piece)
        elif dtype == "signature_delta":
            sig = get(delta, "signature")
            if isinstance(sig, str):
                block.signature.append(sig)
        return []  # citations and delta types added later are not kept

    def _stop(self, ev: Any) -> list[ModelEvent]:
        index = self._index(ev)
        block = self.blocks.get(index)
        if block is None:
            raise self.malformed(f"a content_block_stop for block {index}, which never started")
        if block.kind == "thinking":
            return [ReasoningEnd(signature="".join(block.signature) or None)]
        if block.kind == "redacted_thinking":
            return [ReasoningEnd(redacted=block.data or "")]
        if block.kind == "tool_use":
            if not block.name:
                raise self.malformed(f"tool_use block {index} without a tool name")
            self.has_calls = True
            return [block.tool_event()]
        return []

    def _usage(self, u: Any) -> None:
        """Usage from ``message_start``, then the cumulative counts of ``message_delta``."""
        if u is None:
            return
        for key, name in (("input", "input_tokens"), ("cache_write", "cache_creation_input_tokens"),
                          ("cache_read", "cache_read_input_tokens"), ("output", "output_tokens")):
            value = as_int(get(u, name))
            if value is not None:
                self.tokens[key] = value
        thinking = as_int(get(get(u, "output_tokens_details"), "thinking_tokens"))
        if thinking is not None:
            self.thinking_tokens = thinking

    def usage(self) -> Usage:
        t = self.tokens
        return Usage(input_tokens=t["input"] + t["cache_write"] + t["cache_read"], output_tokens=t["output"],
                     reasoning_tokens=self.thinking_tokens or 0, cached_tokens=t["cache_read"],
                     cache_write_tokens=t["cache_write"])

    def finish(self) -> FinishEvent:
        if not self.stopped:
            raise ModelProviderError(
                f"The stream from {self.where[0].lower()}{self.where[1:]} ended before the message did "
                "(no message_stop event): the connection was probably cut", retryable=True)
        stop = self.stop_reason or "end_turn"
        reason = _FINISH.get(stop, stop.replace("_", "-"))
        if self.has_calls and reason == "stop":
            reason = "tool-calls"
        return FinishEvent(reason, self.usage())

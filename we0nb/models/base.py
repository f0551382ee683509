"""The model port: a provider-neutral request in, a stream of model events out.

A model sees the history as :data:`ModelMessage` items — user turns, assistant turns
(text, reasoning, tool calls) and tool results, every tool call paired with its result —
plus the tool schemas. It streams :data:`ModelEvent` items back.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Literal, Optional, Union

from ..messages import Usage

__all__ = [
    "UserTurn",
    "ToolCall",
    "ReasoningBlock",
    "AssistantTurn",
    "ToolResult",
    "ModelMessage",
    "ToolSchema",
    "ModelRequest",
    "OutputMode",
    "TextDelta",
    "ReasoningDelta",
    "ReasoningEnd",
    "ToolCallEvent",
    "FinishEvent",
    "ModelEvent",
    "Model",
]


# --------------------------------------------------------------------------- history


@dataclass
class UserTurn:
    text: str
    role: Literal["user"] = "user"


@dataclass
class ToolCall:
    call_id: str
    name: str
    input: dict[str, Any]


@dataclass
class ReasoningBlock:
    """A reasoning block as its provider must get it back: the text with its ``signature``, or
    the opaque ``redacted`` data of a block the provider redacted (then ``text`` is empty)."""

    text: str = ""
    signature: Optional[str] = None
    redacted: Optional[str] = None


@dataclass
class AssistantTurn:
    """An assistant turn. ``reasoning`` is its reasoning text (all of it, joined);
    ``reasoning_blocks`` the blocks that carry a signature or redacted data, in order — what
    a provider that verifies reasoning (Anthropic) needs back; others ignore them."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    role: Literal["assistant"] = "assistant"
    reasoning_blocks: list[ReasoningBlock] = field(default_factory=list)


@dataclass
class ToolResult:
    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"


ModelMessage = Union[UserTurn, AssistantTurn, ToolResult]


@dataclass(frozen=True)
class ToolSchema:
    name: str
    description: str
    parameters: dict[str, Any]


#: how structured output is asked for: the model calls an output tool ("tool"), the server
#: constrains the reply to the JSON schema ("native"), or the instructions ask for JSON ("prompted")
OutputMode = Literal["tool", "native", "prompted"]


@dataclass
class ModelRequest:
    """What one model call receives.

    With structured output, ``output_mode`` says how it is asked for and ``output_schema``
    is its JSON schema; in ``"tool"`` mode ``output_tool`` names the output tool (listed in
    ``tools``), in the other modes the reply's text is the JSON answer.
    """

    messages: list[ModelMessage]
    tools: list[ToolSchema]
    system: Optional[str] = None
    output_tool: Optional[str] = None
    purpose: Literal["step", "summary"] = "step"
    output_mode: Optional[OutputMode] = None
    output_schema: Optional[dict[str, Any]] = None

    @property
    def turn_steps(self) -> int:
        """How many model steps of the current turn came before this one (0: the turn's first).

        Counts the assistant turns after the last user turn, e.g. to force a tool call on the
        first step only: ``tool_choice=lambda r: "get_weather" if r.turn_steps == 0 else None``.
        """
        n = 0
        for m in reversed(self.messages):
            if isinstance(m, UserTurn):
                break
            if isinstance(m, AssistantTurn):
                n += 1
        return n


# --------------------------------------------------------------------------- events


@dataclass
class TextDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ReasoningEnd:
    """The end of a reasoning block, with what the provider wants back: its ``signature``, or
    the ``redacted`` data of a block without text (it then stands for a block of its own).
    Optional: a model that sends none gets consecutive reasoning deltas as one part."""

    signature: Optional[str] = None
    redacted: Optional[str] = None


@dataclass
class ToolCallEvent:
    """A complete tool call. ``input`` is a dict, or the raw argument text when it did not parse."""

    call_id: str
    name: str
    input: Union[dict[str, Any], str]


@dataclass
class FinishEvent:
    reason: str = "stop"
    usage: Usage = field(default_factory=Usage)


ModelEvent = Union[TextDelta, ReasoningDelta, ReasoningEnd, ToolCallEvent, FinishEvent]


class Model(abc.ABC):
    """An LLM behind the port. Subclasses implement :meth:`stream`."""

    #: a short id recorded on every assistant message
    model_id: str = "model"
    #: the context window in tokens (used by compaction); None when unknown
    context_window: Optional[int] = None
    #: the structured-output mode this model works with when the agent does not choose one
    output_mode: OutputMode = "tool"

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the reply to ``request``. Must be an async iterator; ``aclose()`` stops it."""

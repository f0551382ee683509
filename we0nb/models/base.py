"""The model port: a provider-neutral request in, a stream of model events out.

A model sees the history as :data:`ModelMessage` items — user turns, assistant turns
(text, reasoning, tool calls) and tool results, every tool call paired with its result —
plus the tool schemas. It streams :data:`ModelEvent` items back.
"""

from __future__ import annotations

import abc
import math
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
    "ModelPrice",
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


@dataclass(slots=True)
class TextDelta:
    """A piece of the reply's text (slotted: made once per delta, thousands per second)."""

    text: str


@dataclass(slots=True)
class ReasoningDelta:
    """A piece of the reasoning's text (slotted, as :class:`TextDelta`)."""

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


#: the provider name of a model that names none: the package's offline test models (no server,
#: no price to look up)
OWN_PROVIDER = "we0nb"


@dataclass(frozen=True)
class ModelPrice:
    """A price given to a model by its user: USD per million input tokens and per million
    output tokens (``price=(0.15, 0.60)`` on a model, or ``price=ModelPrice(0.15, 0.60)``).

    Stored and validated here; the cost of a call is computed from usage later (SPEC §13).
    A model without one is priced by its :attr:`Model.provider_name` and
    :attr:`Model.request_model` (None: unknown, never 0)."""

    input_mtok: float
    output_mtok: float

    def __post_init__(self) -> None:
        for value in (self.input_mtok, self.output_mtok):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(
                    "price=...: expected USD per million input and output tokens as two numbers >= 0, "
                    f"e.g. price=(0.15, 0.60); got {self.input_mtok!r}, {self.output_mtok!r}.")

    @classmethod
    def of(cls, value: Any) -> Optional["ModelPrice"]:
        """``value`` as a price: None, a :class:`ModelPrice`, or an ``(input, output)`` pair."""
        if value is None or isinstance(value, ModelPrice):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(value[0], value[1])
        raise ValueError("price=...: expected USD per million input and output tokens as a pair, e.g. "
                         f"price=(0.15, 0.60), or a ModelPrice; got {value!r}.")


class Model(abc.ABC):
    """An LLM behind the port. Subclasses implement :meth:`stream`.

    The properties :attr:`provider_name`, :attr:`request_model`, :attr:`server_address`,
    :attr:`server_port` and :attr:`price` are the facts a trace and a price lookup need
    (OpenTelemetry GenAI terms); a subclass overrides those that differ from the defaults.
    """

    #: a short id recorded on every assistant message
    model_id: str = "model"
    #: the context window in tokens (used by compaction); None when unknown
    context_window: Optional[int] = None
    #: the structured-output mode this model works with when the agent does not choose one
    output_mode: OutputMode = "tool"
    #: whether the model can return structured output at all (a ``judge`` needs it); a model
    #: that cannot (a plain completion endpoint without tools or JSON) sets it False
    structured_output: bool = True
    #: why this model never reports token usage, when that is known and nothing can change it
    #: (compaction then says so at INFO, instead of a warning that advises turning usage on)
    usage_unreported: Optional[str] = None
    # set through _set_pricing() from a model's provider= and price= keywords
    _provider: str = OWN_PROVIDER
    _price: Optional[ModelPrice] = None

    @property
    def provider_name(self) -> str:
        """The provider in OpenTelemetry GenAI terms (``gen_ai.provider.name``): ``"openai"``,
        ``"anthropic"`` … (``"we0nb"`` for the offline test models)."""
        return self._provider

    @property
    def request_model(self) -> str:
        """The model name sent to the provider (``gen_ai.request.model``)."""
        return self.model_id

    @property
    def server_address(self) -> Optional[str]:
        """The host an HTTP model talks to (``server.address``); None for a model without one."""
        return None

    @property
    def server_port(self) -> Optional[int]:
        """The port an HTTP model talks to (``server.port``); None for a model without one."""
        return None

    @property
    def price(self) -> Optional[ModelPrice]:
        """The price its user gave this model (None: look it up by provider and model)."""
        return self._price

    def _set_pricing(self, provider: Optional[str], price: Any) -> None:
        """Validate and keep the ``provider=`` and ``price=`` keywords of a model's constructor."""
        if provider is not None:
            if not isinstance(provider, str) or not provider.strip():
                raise ValueError(f"{type(self).__name__}(provider=...): expected a provider name such as "
                                 f"'openai' or 'anthropic', got {provider!r}.")
            self._provider = provider
        self._price = ModelPrice.of(price)

    async def prepare(self) -> None:
        """Called at the start of every run, before anything is written: a model that must load
        something first (a replay's recording) does it here, so its errors leave no trace."""
        return None

    @abc.abstractmethod
    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the reply to ``request``. Must be an async iterator; ``aclose()`` stops it."""

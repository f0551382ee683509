"""The vocabulary every layer speaks: sessions, messages, parts and tool states.

These pydantic models are what the engine writes, what persistence stores (as JSON,
round-tripping exactly), what the notebook renders and what the data frames flatten.
Times are epoch seconds (floats). Nested state objects are replaced, never mutated in
place, so a shallow copy of a part is a faithful snapshot.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Sequence, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from ._call_facts import (COMPLETED_ON_RESUME, MAY_HAVE_RUN, NEVER_STARTED, attempts_of, call_key_of,  # noqa: F401
                          effect_label, in_doubt_of)
from ._plugins import display_bundle

__all__ = [
    "SessionTime",
    "SessionRevert",
    "Session",
    "MessageError",
    "MessageTime",
    "Usage",
    "UserMessage",
    "AssistantMessage",
    "Message",
    "PartTime",
    "TextPart",
    "ReasoningPart",
    "ToolTime",
    "Attachment",
    "ToolStatePending",
    "ToolStateRunning",
    "ToolStateCompleted",
    "ToolStateError",
    "ToolState",
    "ToolPart",
    "ToolApproval",
    "ApprovalStatus",
    "StepStartPart",
    "StepFinishPart",
    "CompactionPart",
    "Part",
    "MessageWithParts",
    "Transcript",
    "turn_pending",
    "is_unfinished",
    "UNFINISHED_REASON",
    "UNFINISHED_MESSAGE",
]

UNFINISHED_REASON = "UnfinishedAssistantMessage"
UNFINISHED_MESSAGE = "Assistant message was not completed before recovery."


class _Displayable:
    """Rich display in notebooks (HTML + plain text), by the renderer the notebook layer connects
    (:mod:`we0nb._plugins`): the data model never imports the layers above it."""

    def _repr_html_(self) -> Optional[str]:
        return display_bundle(self).get("text/html")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return display_bundle(self)


class _Model(_Displayable, BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


_set = object.__setattr__


_M = TypeVar("_M", bound=BaseModel)
#: per model class: its field names in order when :func:`assembled` may build it directly (no
#: private attributes, no extra fields kept: then what ``model_construct`` makes is the field dict
#: and the fields set), else None
_PLAIN: dict[type, Optional[tuple[str, ...]]] = {}


def assembled(cls: type[_M], **fields: Any) -> _M:
    """``cls.model_construct(**fields)`` — values already valid, no validation — without pydantic's
    generic loop over the fields when every field is given: the same object (its fields set, no
    extra, no private attributes), 1.3 µs against 4.3 µs for a :class:`MessageWithParts` (3.11).
    Any other case (a field left to its default, the fields in another order, a class with private
    attributes or extra fields) is ``model_construct`` itself. (It sets the four attributes
    :func:`snapshot` sets, written out in each: both are on a step's path, and a helper they
    shared, one call more each, measured ~5k instructions a W2 step — callgrind, three runs of
    each, whose spread is ~±10k.)"""
    try:
        names = _PLAIN[cls]
    except KeyError:
        plain = not cls.__private_attributes__ and cls.model_config.get("extra") != "allow"
        names = _PLAIN[cls] = tuple(cls.model_fields) if plain else None
    if names is None or tuple(fields) != names:  # (every field, in their order: the same dict)
        return cls.model_construct(**fields)
    m = cls.__new__(cls)
    _set(m, "__dict__", fields)
    _set(m, "__pydantic_fields_set__", set(fields))
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


def put(m: BaseModel, name: str, value: Any) -> None:
    """``m.<name> = value`` for a field of one of these models (no assignment validation, no
    private attributes): what pydantic's ``__setattr__`` does, in one call instead of two — a
    step sets six fields this way."""
    m.__dict__[name] = value  # pyright: ignore[reportIndexIssue]  (an instance's dict, not a class's proxy)
    m.__pydantic_fields_set__.add(name)


def snapshot(m: BaseModel) -> Any:
    """``m.model_copy()`` — a shallow copy, what events carry — without its generic overhead.

    The same copy as pydantic's ``__copy__``: the field dict, the fields set and the extra
    fields copied, no private attributes (a model with some takes ``model_copy`` itself).
    """
    if getattr(m, "__pydantic_private__", None) is not None:
        return m.model_copy()
    cls = type(m)
    c = cls.__new__(cls)
    _set(c, "__dict__", m.__dict__.copy())
    extra = m.__pydantic_extra__
    _set(c, "__pydantic_extra__", None if extra is None else extra.copy())
    _set(c, "__pydantic_fields_set__", m.__pydantic_fields_set__.copy())
    _set(c, "__pydantic_private__", None)
    return c


# --------------------------------------------------------------------------- sessions


class SessionTime(_Model):
    created: float
    updated: float


class SessionRevert(_Model):
    """A revert point: ``message_id`` and every later message are hidden until cleared."""

    message_id: str
    time: float


class Session(_Model):
    id: str
    title: str = ""
    time: SessionTime
    revert: Optional[SessionRevert] = None
    #: the session this one was forked from (``agent.fork``), None for a session that is not a fork
    forked_from: Optional[str] = None
    #: the message of ``forked_from`` the fork was copied up to (None: its whole history)
    forked_at: Optional[str] = None


# --------------------------------------------------------------------------- messages


class MessageError(_Model):
    reason: str
    message: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class MessageTime(_Model):
    created: float
    completed: Optional[float] = None


class Usage(_Model):
    """Tokens of one model call (or a sum). ``input_tokens`` is the whole prompt: uncached,
    read from the provider's cache (``cached_tokens``) and written to it (``cache_write_tokens``)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


class UserMessage(_Model):
    id: str
    session_id: str
    role: Literal["user"] = "user"
    time: MessageTime
    error: Optional[MessageError] = None


class AssistantMessage(_Model):
    id: str
    session_id: str
    role: Literal["assistant"] = "assistant"
    time: MessageTime
    error: Optional[MessageError] = None
    parent_id: Optional[str] = None
    model_id: Optional[str] = None
    usage: Usage = Field(default_factory=Usage)
    finish_reason: Optional[str] = None
    summary: bool = False
    #: what the model call cost in USD, computed when it ended (None: unknown — no price for
    #: the model, or the call reported no usage; see :mod:`we0nb.models.pricing`)
    cost: Optional[float] = None


Message = Annotated[Union[UserMessage, AssistantMessage], Field(discriminator="role")]


# --------------------------------------------------------------------------- parts


class PartTime(_Model):
    start: float
    end: Optional[float] = None


class _PartBase(_Model):
    id: str
    session_id: str
    message_id: str


class TextPart(_PartBase):
    type: Literal["text"] = "text"
    text: str = ""
    time: Optional[PartTime] = None
    synthetic: bool = False


class ReasoningPart(_PartBase):
    """The model's reasoning ("thinking"). A provider that verifies reasoning sent back to it
    (Anthropic) gives each block a ``signature``, or, for a block it redacted, opaque
    ``redacted`` data instead of text; both are kept so a later run can send them back."""

    type: Literal["reasoning"] = "reasoning"
    text: str = ""
    time: Optional[PartTime] = None
    signature: Optional[str] = None
    redacted: Optional[str] = None


class ToolTime(_Model):
    start: Optional[float] = None
    end: Optional[float] = None


class ToolStatePending(_Model):
    status: Literal["pending"] = "pending"
    input: dict[str, Any] = Field(default_factory=dict)
    raw: Optional[str] = None
    #: ``idempotency_key`` from the moment the call is first written (see :class:`~we0nb.ToolContext`)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ToolStateRunning(_Model):
    """A call written before its tool executes (the write-ahead); ``metadata`` holds its
    ``idempotency_key`` and ``attempt`` (the number of this execution, counted from the store)."""

    status: Literal["running"] = "running"
    input: dict[str, Any] = Field(default_factory=dict)
    time: ToolTime
    metadata: dict[str, Any] = Field(default_factory=dict)


class Attachment(_Model):
    """Something a tool returned beside its text (an MCP server's images, audio, files and links).

    ``type`` is ``"image"``, ``"audio"`` or ``"file"`` (base64 ``data`` with its ``mime_type``;
    ``uri`` names an embedded file, whose text, if it is text, is in the output instead) or
    ``"link"`` (a resource link: ``uri``, maybe ``name``). ``annotations`` are the server's
    (MCP's ``audience``, ``priority``, ``lastModified``). The model sees only the call's
    ``output`` (which mentions each attachment); attachments are kept for people (the
    notebook renders them) and for analysis.
    """

    type: Literal["image", "audio", "file", "link"]
    mime_type: Optional[str] = None
    data: Optional[str] = None
    uri: Optional[str] = None
    name: Optional[str] = None
    annotations: Optional[dict[str, Any]] = None


class ToolStateCompleted(_Model):
    status: Literal["completed"] = "completed"
    input: dict[str, Any] = Field(default_factory=dict)
    output: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    time: ToolTime
    attachments: list[Attachment] = Field(default_factory=list)


class ToolStateError(_Model):
    """A tool that failed, or was interrupted (``metadata["interrupted"] is True``)."""

    status: Literal["error"] = "error"
    input: dict[str, Any] = Field(default_factory=dict)
    error: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    time: ToolTime = Field(default_factory=ToolTime)


ToolState = Annotated[
    Union[ToolStatePending, ToolStateRunning, ToolStateCompleted, ToolStateError],
    Field(discriminator="status"),
]


class ToolApproval(_Model):
    """The approval record of a call whose tool requires a person's decision before it runs.

    ``why`` says why it needs approval; ``decided`` is when a person approved or denied it;
    ``reason`` is the reason given with a denial; ``input`` the arguments a person corrected
    before approving, and ``original_input`` the model's own (they stay in the call's state
    until it runs, then in its final state's ``metadata["original_input"]``).
    """

    requested: float
    why: str = ""
    decided: Optional[float] = None
    reason: Optional[str] = None
    input: Optional[dict[str, Any]] = None
    original_input: Optional[dict[str, Any]] = None


ApprovalStatus = Literal["requested", "approved", "denied"]


class ToolPart(_PartBase):
    type: Literal["tool"] = "tool"
    call_id: str
    tool: str
    #: (validated by its ``status``; serialized by its own class — the same JSON, without the
    #: tagged union's lookup: a third of a tool part's encoding, which every commit of one pays)
    state: SerializeAsAny[ToolState]
    #: None (no approval needed), "requested" (awaiting a decision), "approved" or "denied"
    approval: Optional[ApprovalStatus] = None
    approval_detail: Optional[ToolApproval] = None

    @property
    def awaiting_approval(self) -> bool:
        """The call waits for a person to approve or deny it (it has not started)."""
        return self.approval == "requested" and self.state.status == "pending"

    @property
    def finished(self) -> bool:
        """The call reached a final state (completed or error)."""
        return self.state.status in ("completed", "error")

    @property
    def interrupted(self) -> bool:
        """The call was stopped without a result (it ended as an error marked interrupted)."""
        st = self.state
        return st.status == "error" and st.metadata.get("interrupted") is True

    @property
    def interrupt_reason(self) -> Optional[str]:
        """Why it was interrupted: ``"resume"``, ``"prompt"``, ``"blocked"`` or ``"fork"`` (None if it was not)."""
        if not self.interrupted:
            return None
        reason = self.state.metadata.get("reason")  # type: ignore[union-attr]
        return reason if isinstance(reason, str) else None

    @property
    def recalled(self) -> bool:
        """The call was executed again by a resume (a read-only or idempotent tool's call)."""
        return self.state.metadata.get("recalled") is True

    @property
    def idempotency_key(self) -> str:
        """The call's key: as first written with it (derived the same way for a call stored
        before keys were written)."""
        return call_key_of(self.session_id, self.id, self.state.metadata.get("idempotency_key"))

    @property
    def attempts(self) -> int:
        """How many executions of the call started, as the store says (0: never executed)."""
        return attempts_of(self.state.metadata.get("attempt"))

    @property
    def in_doubt(self) -> Optional[bool]:
        """For an interrupted call: whether it may have run (True: it was running; False: it
        never started). None for any other call, and for one interrupted before this was recorded."""
        return in_doubt_of(self.interrupted, self.state.metadata.get("in_doubt"))

    @property
    def reconciled(self) -> bool:
        """The call was completed by its tool's reconcile (it had run before the process died)."""
        return self.state.metadata.get("reconciled") is True

    @property
    def effect(self) -> Optional[str]:
        """What a person reads of the call's effect (see :func:`effect_label`), or None."""
        return effect_label(self.in_doubt, self.reconciled)

    @property
    def is_output(self) -> bool:
        """The call that returned the run's structured output (and so ended the turn)."""
        st = self.state
        return st.status == "completed" and st.metadata.get("output") is True


class StepStartPart(_PartBase):
    type: Literal["step-start"] = "step-start"
    time: float


class StepFinishPart(_PartBase):
    type: Literal["step-finish"] = "step-finish"
    reason: Optional[str] = None
    usage: Usage = Field(default_factory=Usage)
    time: float


class CompactionPart(_PartBase):
    """A summary of the history before it; that history is kept but no longer sent."""

    type: Literal["compaction"] = "compaction"
    summary: str = ""
    time: float


Part = Annotated[
    Union[TextPart, ReasoningPart, ToolPart, StepStartPart, StepFinishPart, CompactionPart],
    Field(discriminator="type"),
]


# --------------------------------------------------------------------------- transcript


class MessageWithParts(_Displayable, BaseModel):
    info: Union[UserMessage, AssistantMessage] = Field(discriminator="role")
    parts: list[Part] = Field(default_factory=list)

    # (parts are told apart by their ``type`` field, not isinstance, which costs several field
    # reads when it fails against a pydantic class; see engine/history.py)
    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if p.type == "text")

    @property
    def tool_parts(self) -> list[ToolPart]:
        return [p for p in self.parts if p.type == "tool"]

    @property
    def unfinished(self) -> bool:
        """An assistant message that needs recovery (see :func:`is_unfinished`)."""
        info = self.info
        return info.role == "assistant" and is_unfinished(info, self.parts)  # type: ignore[arg-type]

    @property
    def awaiting_approval(self) -> list[ToolPart]:
        """The calls of this message that wait for a person's decision, in call order."""
        return [p for p in self.parts if p.type == "tool" and p.awaiting_approval]

    @property
    def is_summary(self) -> bool:
        """A compaction summary (what the model sees instead of the history before it)."""
        return self.info.role == "assistant" and self.info.summary  # type: ignore[union-attr]


def is_unfinished(message: AssistantMessage, parts: "Sequence[Part]") -> bool:
    """The single definition of "needs recovery", the seed's two signals: the message was never
    closed, or one of its tool calls never reached a final state (pending or running)."""
    if message.time.completed is None:
        return True
    return any(p.type == "tool" and p.state.status in ("pending", "running") for p in parts)


def turn_pending(messages: "list[MessageWithParts]") -> bool:
    """Whether the last turn of ``messages`` is not over, so a resume would continue it.

    The single definition of "needs resume": the last message is a user message (not yet
    answered), or the last assistant message needs recovery, or it ended with tool calls
    whose results the model has not seen (unless one of them returned the structured
    output), or it is a compaction summary of a turn that was not over (a compaction mid-turn
    writes the turn's user message again with it; a fork or a revert may end at the summary),
    or a resume's
    recovery closed it and nothing followed (that resume stopped before its own step wrote
    anything: the model never finished the turn). A turn whose calls await a person's
    approval is not pending: it waits for the decision (see :func:`awaiting_approval`); once
    every call is decided it is.
    """
    if not messages:
        return False
    last = messages[-1]
    if last.info.role == "user":
        return True
    if last.awaiting_approval:
        return False
    if last.unfinished:
        return True
    if last.is_summary:
        return turn_pending(messages[:-1])
    tools = last.tool_parts
    if any(p.is_output for p in tools):
        return False
    return bool(tools) or _closed_by_resume(last.info)


def _closed_by_resume(info: Any) -> bool:
    """The message was cut, and a resume's recovery closed it (the resume then takes a step)."""
    error = getattr(info, "error", None)
    return (error is not None and error.reason == UNFINISHED_REASON
            and error.metadata.get("recovered") is True and error.metadata.get("mode") == "resume")


class Transcript(_Displayable, BaseModel):
    """The persisted history of one session; ``session`` is None when it does not exist."""

    session: Optional[Session] = None
    messages: list[MessageWithParts] = Field(default_factory=list)

    @property
    def pending_approvals(self) -> list[ToolPart]:
        """The calls awaiting a person's decision (in the last assistant message), in call order."""
        last = self.last_assistant
        return last.awaiting_approval if last is not None else []

    @property
    def needs_resume(self) -> bool:
        """The last turn is not over: ``mode="resume"`` would continue it (see :func:`turn_pending`)."""
        return turn_pending(self.messages)

    @property
    def last_assistant(self) -> Optional[MessageWithParts]:
        for m in reversed(self.messages):
            if m.info.role == "assistant":
                return m
        return None

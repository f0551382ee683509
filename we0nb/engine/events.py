"""The event vocabulary of ``We0Agent.stream()``: plain dicts with a ``"type"``, typed.

Each event is a ``TypedDict`` (a plain ``dict`` at run time: no cost), and :data:`Event`
is their union, so a type checker narrows ``event["type"] == "text-delta"`` to
:class:`TextDeltaEvent`. Parts and messages in events are snapshots (copies), safe to keep.

================  ==================================================================
type              keys
================  ==================================================================
start             session_id, mode ("prompt"/"resume"), run_id
user-message      message (UserMessage), text — prompt mode, once per written message
recovery          action ("keep"/"recall"/"interrupt"/"execute"/"deny"/"await"/"reconcile"),
                  part (ToolPart) — resume, and prompt-mode interrupts; a "reconcile" is
                  followed by the action its answer decided ("complete": it ran, and
                  is recorded completed); action "close", message (AssistantMessage)
                  when an unfinished assistant message is closed
step-start        step (1-based within the run), message (AssistantMessage, unfinished)
text-start        part (TextPart)
text-delta        text, part_id
text-end          part (TextPart, final text)
reasoning-start   part (ReasoningPart)
reasoning-delta   text, part_id
reasoning-end     part (ReasoningPart)
tool              part (ToolPart) — every tool-state change: pending, running,
                  completed, error (interrupted ones carry metadata["interrupted"])
step-finish       step, message (AssistantMessage, completed), finish_reason, usage
approval-request  part (ToolPart awaiting a person's decision) — the run then ends with
                  result "approval" (see We0Agent.approve / deny)
compaction        part (CompactionPart), message (the summary AssistantMessage) — the
                  history was summarised; the run then ends with result "compact"
finish            result (RunResult) — always the last event of a run that ended
================  ==================================================================

An aborted run yields no final event: the iterator raises ``asyncio.CancelledError``.
"""

from __future__ import annotations

from typing import Literal, Union

from typing_extensions import NotRequired, TypedDict

from ..messages import (
    AssistantMessage,
    CompactionPart,
    ReasoningPart,
    TextPart,
    ToolPart,
    Usage,
    UserMessage,
)

from .request import RunResult

__all__ = [
    "EVENT_TYPES", "Event", "StartEvent", "UserMessageEvent", "RecoveryEvent", "StepStartEvent",
    "TextStartEvent", "TextDeltaEvent", "TextEndEvent", "ReasoningStartEvent", "ReasoningDeltaEvent",
    "ReasoningEndEvent", "ToolEvent", "StepFinishEvent", "ApprovalRequestEvent", "CompactionEvent", "FinishEvent",
]


class StartEvent(TypedDict):
    type: Literal["start"]
    session_id: str
    mode: Literal["prompt", "resume"]
    run_id: str


class UserMessageEvent(TypedDict):
    type: Literal["user-message"]
    message: UserMessage
    text: str


class RecoveryEvent(TypedDict):
    type: Literal["recovery"]
    action: Literal["keep", "recall", "interrupt", "execute", "deny", "await", "reconcile", "complete", "close"]
    part: NotRequired[ToolPart]
    message: NotRequired[AssistantMessage]


class StepStartEvent(TypedDict):
    type: Literal["step-start"]
    step: int
    message: AssistantMessage


class TextStartEvent(TypedDict):
    type: Literal["text-start"]
    part: TextPart


class TextDeltaEvent(TypedDict):
    type: Literal["text-delta"]
    text: str
    part_id: str


class TextEndEvent(TypedDict):
    type: Literal["text-end"]
    part: TextPart


class ReasoningStartEvent(TypedDict):
    type: Literal["reasoning-start"]
    part: ReasoningPart


class ReasoningDeltaEvent(TypedDict):
    type: Literal["reasoning-delta"]
    text: str
    part_id: str


class ReasoningEndEvent(TypedDict):
    type: Literal["reasoning-end"]
    part: ReasoningPart


class ToolEvent(TypedDict):
    type: Literal["tool"]
    part: ToolPart


class StepFinishEvent(TypedDict):
    type: Literal["step-finish"]
    step: int
    message: AssistantMessage
    finish_reason: str
    usage: Usage


class ApprovalRequestEvent(TypedDict):
    type: Literal["approval-request"]
    part: ToolPart


class CompactionEvent(TypedDict):
    type: Literal["compaction"]
    part: CompactionPart
    message: AssistantMessage


class FinishEvent(TypedDict):
    type: Literal["finish"]
    result: RunResult


Event = Union[
    StartEvent, UserMessageEvent, RecoveryEvent, StepStartEvent, TextStartEvent, TextDeltaEvent,
    TextEndEvent, ReasoningStartEvent, ReasoningDeltaEvent, ReasoningEndEvent, ToolEvent,
    StepFinishEvent, ApprovalRequestEvent, CompactionEvent, FinishEvent,
]

EVENT_TYPES = (
    "start", "user-message", "recovery", "step-start", "text-start", "text-delta", "text-end",
    "reasoning-start", "reasoning-delta", "reasoning-end", "tool", "step-finish", "approval-request", "compaction",
    "finish",
)

"""The recovery planner: a pure function from the last assistant message to actions.

No I/O and no clock: ``(message, parts, tool policies, mode) → RecoveryPlan``. The rows of
the spec's table map one-to-one onto its branches:

==================================  ===========================================
tool state                          action
==================================  ===========================================
completed                           keep
error                               keep (blocks later ones if its policy says so)
pending/running, no side effects    recall (resume mode only)
pending/running, side effects       interrupt
pending/running, tool unregistered  interrupt
unfinished after interrupt/blocking interrupt
any unfinished, prompt mode         interrupt (reason "prompt")
==================================  ===========================================

A recall decided here may still end in a blocking error when executed; the executor then
applies :func:`block_after` to turn the later recalls into interrupts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Optional, Sequence

from ..messages import AssistantMessage, Part, ToolPart
from ..tools import ToolPolicy

__all__ = ["ToolAction", "RecoveryPlan", "needs_recovery", "plan_recovery", "block_after"]

Action = Literal["keep", "recall", "interrupt"]
_UNFINISHED = ("pending", "running")


@dataclass(frozen=True)
class ToolAction:
    part_id: str
    call_id: str
    tool: str
    status: str
    action: Action
    reason: Optional[str] = None  # for interrupts: "resume" or "prompt"


@dataclass(frozen=True)
class RecoveryPlan:
    tool_actions: tuple[ToolAction, ...] = ()
    close_message: bool = False

    @property
    def needed(self) -> bool:
        return self.close_message or any(a.action != "keep" for a in self.tool_actions)


def needs_recovery(message: AssistantMessage, parts: Sequence[Part]) -> bool:
    """Either signal: the message was never closed, or a tool call never reached a final state."""
    if message.time.completed is None:
        return True
    return any(isinstance(p, ToolPart) and p.state.status in _UNFINISHED for p in parts)


def plan_recovery(message: AssistantMessage, parts: Sequence[Part],
                  policies: Mapping[str, ToolPolicy], mode: str) -> RecoveryPlan:
    """Decide keep / recall / interrupt for every tool part, in order, and whether to close."""
    if mode not in ("prompt", "resume"):
        raise ValueError(f"mode must be 'prompt' or 'resume', got {mode!r}.")
    if not needs_recovery(message, parts):
        return RecoveryPlan()
    actions: list[ToolAction] = []
    blocked = False
    for p in parts:
        if not isinstance(p, ToolPart):
            continue
        status = p.state.status
        policy = policies.get(p.tool)
        if status == "completed":
            action, reason = "keep", None
        elif status == "error":
            action, reason = "keep", None
            if policy is not None and policy.blocks_on_error:
                blocked = True
        elif mode == "prompt":
            action, reason = "interrupt", "prompt"
        elif blocked or policy is None or policy.side_effects:
            action, reason = "interrupt", "resume"
            blocked = True
        else:
            action, reason = "recall", None
        actions.append(ToolAction(p.id, p.call_id, p.tool, status, action, reason))  # type: ignore[arg-type]
    return RecoveryPlan(tuple(actions), message.time.completed is None)


def block_after(plan: RecoveryPlan, index: int) -> RecoveryPlan:
    """The plan once the recall at ``index`` ended in a blocking error: later recalls interrupt."""
    actions = list(plan.tool_actions)
    for i in range(index + 1, len(actions)):
        if actions[i].action == "recall":
            actions[i] = replace(actions[i], action="interrupt", reason="resume")
    return replace(plan, tool_actions=tuple(actions))

"""The recovery planner: a pure function from the last assistant message to actions.

No I/O and no clock: ``(message, parts, tool policies, mode) → RecoveryPlan``. The rows of
the spec's table map one-to-one onto its branches, in this order of precedence:

==============================================  ====================================
tool state                                      action
==============================================  ====================================
completed                                       keep
error                                           keep (blocks later ones if its policy says so)
any unfinished, prompt mode                     interrupt (reason "prompt")
unfinished after an interrupt/blocking error    interrupt
pending, awaiting approval ("requested")        await (the run ends "approval")
unfinished after a call that awaits             await (order is kept)
pending, denied                                 deny (an error result; blocks later ones
                                                only if its policy blocks on error)
pending, approved                               execute (it provably never started)
pending in a *completed* message                execute (deferred behind an approval:
                                                the step ended normally, so it never started)
pending/running, no side effects                recall (resume mode only)
pending/running, side effects                   interrupt
pending/running, tool unregistered              interrupt
==============================================  ====================================

Why "execute" is safe: the engine writes a call ``running`` before its tool executes, and a
step's message is completed only after each of its calls finished or was deliberately
deferred; so a ``pending`` call that was approved, or that sits in a completed message,
never started. A ``running`` approved call is treated as any running call.

A recall or execution decided here may still end in a blocking error when executed; the
executor then applies :func:`block_after` to turn the later recalls/executions into interrupts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Optional, Sequence

from ..messages import AssistantMessage, Part, ToolPart
from ..tools import ToolPolicy

__all__ = ["ToolAction", "RecoveryPlan", "needs_recovery", "plan_recovery", "block_after"]

Action = Literal["keep", "recall", "interrupt", "execute", "deny", "await"]
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

    @property
    def awaiting(self) -> bool:
        """Some call waits for a person's decision: the run ends "approval" without a model call."""
        return any(a.action == "await" for a in self.tool_actions)


def needs_recovery(message: AssistantMessage, parts: Sequence[Part]) -> bool:
    """Either signal: the message was never closed, or a tool call never reached a final state."""
    if message.time.completed is None:
        return True
    return any(isinstance(p, ToolPart) and p.state.status in _UNFINISHED for p in parts)


def plan_recovery(message: AssistantMessage, parts: Sequence[Part],
                  policies: Mapping[str, ToolPolicy], mode: str) -> RecoveryPlan:
    """Decide an action for every tool part, in order, and whether to close the message."""
    if mode not in ("prompt", "resume"):
        raise ValueError(f"mode must be 'prompt' or 'resume', got {mode!r}.")
    if not needs_recovery(message, parts):
        return RecoveryPlan()
    completed = message.time.completed is not None
    actions: list[ToolAction] = []
    blocked = waiting = False
    for p in parts:
        if not isinstance(p, ToolPart):
            continue
        status = p.state.status
        policy = policies.get(p.tool)
        blocks = policy is not None and policy.blocks_on_error
        reason: Optional[str] = None
        if status in ("completed", "error"):
            action = "keep"
            blocked = blocked or (status == "error" and blocks)
        elif mode == "prompt":
            action, reason = "interrupt", "prompt"
        elif blocked:
            action, reason = "interrupt", "resume"
        elif waiting or (status == "pending" and p.approval == "requested"):
            action, waiting = "await", True
        elif status == "pending" and p.approval == "denied":
            action, blocked = "deny", blocks
        elif status == "pending" and (p.approval == "approved" or completed):
            action = "execute"
        elif policy is None or policy.side_effects:
            action, reason, blocked = "interrupt", "resume", True
        else:
            action = "recall"
        actions.append(ToolAction(p.id, p.call_id, p.tool, status, action, reason))  # type: ignore[arg-type]
    return RecoveryPlan(tuple(actions), not completed)


def block_after(plan: RecoveryPlan, index: int) -> RecoveryPlan:
    """The plan once the call run at ``index`` ended in a blocking error: later runs interrupt."""
    actions = list(plan.tool_actions)
    for i in range(index + 1, len(actions)):
        if actions[i].action in ("recall", "execute"):
            actions[i] = replace(actions[i], action="interrupt", reason="resume")
    return replace(plan, tool_actions=tuple(actions))

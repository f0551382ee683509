"""What becomes of each tool call: the one decision, for live steps and recovery alike.

No I/O and no clock. The calls of one assistant message are walked **in order**;
:func:`decide` maps one call (its state, its tool's policy, the situation and what the
calls before it decided — a :class:`Walk`) to one :class:`ToolAction`, and
:func:`after_execution` / :func:`after_reconcile` fold in what an execution or a reconcile
found. The executor carries the actions out; nothing else decides "blocked", "waiting",
"in doubt" or which interrupt reason a call gets. The rows, in order of precedence:

==============================================  ==============================================
call                                            action
==============================================  ==============================================
completed / error                               keep (an error blocks what follows when its
                                                policy says ``blocks_on_error``)
live step, after a blocking error               interrupt ("blocked", never started)
live step, awaiting approval, or after one      await (order is kept)
live step, otherwise                            execute
fork                                            interrupt ("fork")
prompt, running, tool has ``reconcile``         reconcile (done → completed; otherwise
                                                interrupted "prompt")
prompt, otherwise                               interrupt ("prompt")
resume, unfinished after an interrupt or a      interrupt ("resume")
blocking error
resume, pending and awaiting approval, or       await (the run ends "approval")
after a call that awaits
resume, pending, denied                         deny (an error result; blocks later calls only
                                                if its policy blocks on error)
resume, pending, approved — or pending in a     execute (it provably never started)
completed message
resume, tool no longer registered               interrupt ("resume")
resume, ``side_effects=False``                  recall
resume, running, tool has ``reconcile``         reconcile: done → completed ("reconciled");
                                                not done → executed again (same key);
                                                unknown → executed again if ``idempotent``,
                                                else interrupted, in doubt
resume, ``idempotent=True``                     recall (executed again with the same key)
resume, pending, tool has ``reconcile``         execute (it never started)
resume, side effects, neither keyword           interrupt ("resume")
==============================================  ==============================================

Why "execute" is safe: a call is written ``running`` before its tool executes, and a step's
message is completed only after each of its calls finished or was deliberately deferred; so
a ``pending`` call that was approved, or that sits in a completed message, never started.

**In doubt**: an interrupted call that was ``running`` may have run (``in_doubt`` True); one
that was ``pending`` never started (False) — so are calls cut by a blocking error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Mapping, Optional, Sequence

from ..messages import AssistantMessage, Part, ToolPart, is_unfinished
from ..tools import Reconciled, ToolPolicy

__all__ = ["Action", "Situation", "InterruptReason", "ToolAction", "RecoveryPlan", "Walk", "decide",
           "after_execution", "after_reconcile", "needs_recovery", "plan_recovery", "block_after",
           "interrupt_text"]

#: what becomes of a call ("complete": a reconcile found it done, and it is recorded completed)
Action = Literal["keep", "recall", "interrupt", "execute", "deny", "await", "reconcile", "complete"]
#: where the decision is made: a live step, a resume, a prompt closing the last turn, a fork's copy
Situation = Literal["live", "resume", "prompt", "fork"]
#: why a call was interrupted (kept in its metadata's "reason")
InterruptReason = Literal["resume", "prompt", "blocked", "fork"]


@dataclass(frozen=True)
class ToolAction:
    """The decision for one call. ``reason`` and ``in_doubt`` are set for interrupts
    (``in_doubt``: it was running, so it may have run); ``detail`` says why a reconcile could
    not tell (kept in the call's metadata as ``reconcile_reason``)."""

    part_id: str
    call_id: str
    tool: str
    status: str
    action: Action
    reason: Optional[InterruptReason] = None
    in_doubt: Optional[bool] = None
    detail: Optional[str] = None


@dataclass(frozen=True)
class Walk:
    """What the calls walked so far decided: ``blocked`` (an interrupt or a blocking error: every
    later unfinished call is interrupted), ``waiting`` (a call awaits a person: every later
    unfinished call waits with it, in order)."""

    blocked: bool = False
    waiting: bool = False


def needs_recovery(message: AssistantMessage, parts: Sequence[Part]) -> bool:
    """Either signal: the message was never closed, or a tool call never reached a final state."""
    return is_unfinished(message, parts)


def decide(part: ToolPart, policy: Optional[ToolPolicy], situation: Situation, walk: Walk, *,
           completed: bool = False) -> tuple[ToolAction, Walk]:
    """The action for ``part`` and the walk after it (``completed``: its message was closed)."""
    status = part.state.status
    if status in ("completed", "error"):
        blocks = status == "error" and policy is not None and policy.blocks_on_error
        return _action(part, "keep"), replace(walk, blocked=walk.blocked or blocks)
    running = status == "running"
    if situation == "live":
        if walk.blocked:
            return _interrupt(part, "blocked", False), walk
        if walk.waiting or part.awaiting_approval:
            return _action(part, "await"), replace(walk, waiting=True)
        return _action(part, "execute"), walk
    if situation in ("prompt", "fork"):
        if situation == "prompt" and running and policy is not None and policy.reconcile is not None:
            return _action(part, "reconcile"), walk
        return _interrupt(part, situation, running), walk
    return _resume(part, policy, walk, completed, running)


def _resume(part: ToolPart, policy: Optional[ToolPolicy], walk: Walk, completed: bool,
            running: bool) -> tuple[ToolAction, Walk]:
    """The resume rows for an unfinished call (see the module's table)."""
    blocked = replace(walk, blocked=True)
    if walk.blocked:
        return _interrupt(part, "resume", running), walk
    if not running and (walk.waiting or part.approval == "requested"):
        return _action(part, "await"), replace(walk, waiting=True)
    if walk.waiting:  # (a running call after an awaiting one cannot happen: calls start in order)
        return _action(part, "await"), walk
    if not running and part.approval == "denied":
        return _action(part, "deny"), replace(walk, blocked=bool(policy and policy.blocks_on_error))
    if not running and (part.approval == "approved" or completed):
        return _action(part, "execute"), walk
    if policy is None:  # the tool is no longer registered: it cannot run
        return _interrupt(part, "resume", running), blocked
    if not policy.side_effects:
        return _action(part, "recall"), walk
    if running and policy.reconcile is not None:
        return _action(part, "reconcile"), walk
    if policy.idempotent:
        return _action(part, "recall"), walk
    if policy.reconcile is not None:
        return _action(part, "execute"), walk
    return _interrupt(part, "resume", running), blocked


def after_execution(walk: Walk, part: ToolPart, policy: Optional[ToolPolicy]) -> Walk:
    """The walk after ``part`` was executed (or recalled): an error blocks the later calls when
    its tool's policy says so."""
    if part.state.status == "error" and policy is not None and policy.blocks_on_error:
        return replace(walk, blocked=True)
    return walk


def after_reconcile(action: ToolAction, answer: Reconciled, policy: ToolPolicy, situation: Situation,
                    walk: Walk) -> tuple[ToolAction, Walk]:
    """What a reconcile's answer makes of a ``running`` call (see the module's table)."""
    if answer.kind == "done":
        return replace(action, action="complete"), walk
    blocked = replace(walk, blocked=True)
    if situation != "resume":  # prompt mode executes nothing
        in_doubt = answer.kind == "unknown"
        return replace(action, action="interrupt", reason="prompt", in_doubt=in_doubt,
                       detail=answer.reason if in_doubt else None), walk
    if answer.kind == "not_done" or policy.idempotent:
        return replace(action, action="recall", detail=answer.reason or None), walk
    return replace(action, action="interrupt", reason="resume", in_doubt=True, detail=answer.reason), blocked


def _action(part: ToolPart, action: Action) -> ToolAction:
    return ToolAction(part.id, part.call_id, part.tool, part.state.status, action)


def _interrupt(part: ToolPart, reason: InterruptReason, in_doubt: bool) -> ToolAction:
    return ToolAction(part.id, part.call_id, part.tool, part.state.status, "interrupt", reason, in_doubt)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class RecoveryPlan:
    """The actions for an unfinished message's calls, and whether to close the message.

    A preview: a call planned to run may still end in a blocking error, which the run folds
    in (:func:`after_execution`), and a reconcile's answer is known only when it is asked."""

    tool_actions: tuple[ToolAction, ...] = ()
    close_message: bool = False

    @property
    def needed(self) -> bool:
        return self.close_message or any(a.action != "keep" for a in self.tool_actions)

    @property
    def awaiting(self) -> bool:
        """Some call waits for a person's decision: the run ends "approval" without a model call."""
        return any(a.action == "await" for a in self.tool_actions)


def plan_recovery(message: AssistantMessage, parts: Sequence[Part],
                  policies: Mapping[str, ToolPolicy], mode: str) -> RecoveryPlan:
    """Decide an action for every tool part, in order, and whether to close the message."""
    if mode not in ("prompt", "resume", "fork"):
        raise ValueError(f"mode must be 'prompt' or 'resume', got {mode!r}.")
    if not needs_recovery(message, parts):
        return RecoveryPlan()
    completed = message.time.completed is not None
    actions: list[ToolAction] = []
    walk = Walk()
    for p in parts:
        if isinstance(p, ToolPart):
            action, walk = decide(p, policies.get(p.tool), mode, walk, completed=completed)  # type: ignore[arg-type]
            actions.append(action)
    return RecoveryPlan(tuple(actions), not completed)


def block_after(plan: RecoveryPlan, index: int) -> RecoveryPlan:
    """The plan once the call run at ``index`` ended in a blocking error: later runs interrupt."""
    actions = list(plan.tool_actions)
    for i in range(index + 1, len(actions)):
        if actions[i].action in ("recall", "execute", "reconcile"):
            actions[i] = replace(actions[i], action="interrupt", reason="resume",
                                 in_doubt=actions[i].status == "running")
    return replace(plan, tool_actions=tuple(actions))


# --------------------------------------------------------------------------- what the model is told

_TEXT = {
    ("resume", True): "Interrupted during recovery: this call was running when the run stopped and was not "
                      "run again; it may have run, its outcome is unknown.",
    ("resume", False): "Interrupted during recovery: this call never started and was not run (its tool has "
                       "side effects, or an earlier call was interrupted or blocks it); it had no effect.",
    ("prompt", True): "Interrupted: a new user message arrived while this call was running; it was not run "
                      "again and may have run, its outcome is unknown.",
    ("prompt", False): "Interrupted: a new user message arrived before this call started; it never ran.",
    ("blocked", False): "Not executed: an earlier call in this step failed and its tool blocks the calls "
                        "after it.",
    ("fork", True): "Not executed in this fork: the call was running in the session this one was forked "
                    "from, so it may have run there; it was not run here.",
    ("fork", False): "Not executed in this fork: the call had not started in the session this one was "
                     "forked from; it was not run here.",
}


#: a call that was running, interrupted by a new prompt after its reconcile answered ``not_done``
_NO_EFFECT = ("Interrupted: a new user message arrived while this call was running; its tool reports that it "
              "had no effect, and it was not run again.")


def interrupt_text(reason: InterruptReason, in_doubt: bool, detail: Optional[str] = None, *,
                   started: bool = False) -> str:
    """The error text the model (and a person) reads for an interrupted call: whether it may
    have run, and why a reconcile could not tell (``detail``). ``started``: it was ``running``
    (not in doubt then only because its reconcile said it had no effect)."""
    if started and not in_doubt and reason == "prompt":
        return _NO_EFFECT
    text = _TEXT.get((reason, in_doubt)) or _TEXT[(reason, not in_doubt)]
    return f"{text} (Asked whether it ran, its tool could not tell: {detail}.)" if detail else text

"""A person's decision on a call that awaits approval: durable before it returns.

``approve``/``deny`` take the session lease for the moment they write (so they are refused
with :class:`~we0nb.SessionBusyError` while a run holds the session), find the awaiting
call by its ``call_id`` in the last assistant message, and commit the decision. Nothing
runs here: the next ``mode="resume"`` run executes approved calls (write-ahead, as every
call) and tells the model about denied ones. A decision, once committed, is never lost and
never taken twice: deciding again raises and the first decision stands.
"""

from __future__ import annotations

from typing import Any, Optional

from .._ids import new_id, now
from ..messages import ToolApproval, ToolPart, snapshot
from ..persistence.base import Persistence
from ..tools import AnyToolDefinition, ToolInputError
from .request import check_session_id

__all__ = ["pending_approvals", "decide"]


async def pending_approvals(p: Persistence, session_id: str) -> list[ToolPart]:
    """The calls of ``session_id`` that await a decision, in call order."""
    check_session_id(session_id)
    recent = await p.load_recent(session_id)
    for m in reversed(recent.messages):
        if m.info.role == "assistant":
            return [snapshot(part) for part in m.awaiting_approval]
    return []


async def decide(p: Persistence, tools: dict[str, AnyToolDefinition], session_id: str, call_id: str, *,
                 approve: bool, input: Optional[dict[str, Any]] = None, reason: Optional[str] = None) -> ToolPart:
    """Record one decision (see the module docstring); returns the call as now stored."""
    check_session_id(session_id)
    verb = "approve" if approve else "deny"
    if not isinstance(call_id, str) or not call_id:
        raise TypeError(f"{verb}(session_id, call_id): call_id must be the call's id (a non-empty string).")
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"deny(reason=...): expected a string or None, got {type(reason).__name__}.")
    lease = await p.acquire_lease(session_id, new_id("run"))  # refused while a run holds the session
    try:
        part = _find(await p.load_recent(session_id), session_id, call_id, verb)
        detail = part.approval_detail or ToolApproval(requested=now())
        update: dict[str, Any] = {"decided": now()}
        if approve and input is not None:
            update.update(input=_validated(tools.get(part.tool), part, input), original_input=dict(part.state.input))
        if not approve:
            update["reason"] = reason
        part.approval = "approved" if approve else "denied"
        part.approval_detail = detail.model_copy(update=update)
        await p.commit([(None, [part], None)], lease=lease)
        await p.flush()
        return snapshot(part)
    finally:
        await lease.release()


def _find(recent: Any, session_id: str, call_id: str, verb: str) -> ToolPart:
    """The call awaiting approval, or a ValueError saying why this one cannot be decided."""
    for m in reversed(recent.messages):
        for part in m.tool_parts:
            if part.call_id != call_id:
                continue
            if part.awaiting_approval:
                return part
            if part.approval in ("approved", "denied"):
                raise ValueError(f"{verb}(): call {call_id!r} of session {session_id!r} was already "
                                 f"{part.approval}; a decision is final.")
            raise ValueError(f"{verb}(): call {call_id!r} of session {session_id!r} is not awaiting approval "
                             f"(it is {part.state.status}); see agent.pending_approvals(session_id).")
    raise ValueError(f"{verb}(): session {session_id!r} has no call {call_id!r} awaiting approval; "
                     "see agent.pending_approvals(session_id) for the calls that do.")


def _validated(definition: Optional[AnyToolDefinition], part: ToolPart, input: Any) -> dict[str, Any]:
    """``input`` checked against the tool's schema at once (a ValueError records no decision)."""
    if not isinstance(input, dict):
        raise TypeError(f"approve(input=...): expected the corrected arguments as a dict, got "
                        f"{type(input).__name__}.")
    if definition is None:
        raise ValueError(f"approve(input=...): tool {part.tool!r} is not registered on this agent, so the "
                         "corrected arguments cannot be checked; approve without input=, or add the tool.")
    try:
        definition.validate_input(input)
    except ToolInputError as e:
        raise ValueError(f"approve(input=...): {e}") from None
    return dict(input)

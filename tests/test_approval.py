"""Human approval of tool calls (issue 11, SPEC §10): durable requests and decisions, resume."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from we0nb import (
    MemoryPersistence, ScriptedModel, SessionBusyError, We0Agent, text, tool, tool_call, user_message,
)
from we0nb.engine.recovery import plan_recovery
from we0nb.messages import AssistantMessage, MessageTime, ToolApproval, ToolPart, ToolStatePending
from we0nb.tools import ToolPolicy

from enginekit import assert_paired


class Ledger:
    def __init__(self) -> None:
        self.ran: list[tuple[str, Any]] = []


def tools(ledger: Ledger, *, blocks: bool = False):
    @tool(requires_approval=True, blocks_on_error=blocks)
    def pay(amount: int) -> str:
        """Pay someone (a side effect a person must approve)."""
        ledger.ran.append(("pay", amount))
        return f"paid {amount}"

    @tool(side_effects=False)
    def look(what: str) -> str:
        ledger.ran.append(("look", what))
        return f"saw {what}"

    @tool(requires_approval=lambda input: input.get("qty", 0) > 10)
    def order(item: str, qty: int) -> str:
        ledger.ran.append(("order", (item, qty)))
        return f"ordered {qty} {item}"

    return [pay, look, order]


def agent_for(steps, ledger=None, persistence=None, **kw):
    ledger = ledger or Ledger()
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=tools(ledger, **kw), persistence=persistence or MemoryPersistence())
    return agent, model, ledger


class Recording(MemoryPersistence):
    """Keeps the approval/status of every call at every commit (what a crash would leave)."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[list[tuple[str, str, Any]]] = []

    async def commit(self, writes: Any, **kw: Any) -> None:
        await super().commit(writes, **kw)
        self.commits.append([(p.tool, p.state.status, p.approval) for _, parts, _ in writes
                             for p in parts if isinstance(p, ToolPart)])


# --------------------------------------------------------------------------- the request


async def test_a_call_that_needs_approval_ends_the_run_with_approval() -> None:
    p = Recording()
    agent, model, ledger = agent_for(
        [[text("Let me pay."), tool_call("look", {"what": "invoice"}), tool_call("pay", {"amount": 5}),
          tool_call("look", {"what": "receipt"})], [text("never")]], persistence=p)
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("pay the invoice")])]
    requests = [e for e in events if e["type"] == "approval-request"]
    assert len(requests) == 1 and requests[0]["part"].tool == "pay" and requests[0]["part"].approval == "requested"
    # the request is durable before anything else happens: before any tool of the step ran
    first = next(i for i, c in enumerate(p.commits) if ("pay", "pending", "requested") in c)
    assert not any(status == "running" for c in p.commits[:first + 1] for _, status, _ in c)
    result = events[-1]["result"]
    assert result.result == "approval" and [a.tool for a in result.approvals] == ["pay"]
    # one event per state change: the calls left pending are announced once
    tool_events = [(e["part"].call_id, e["part"].state.status) for e in events if e["type"] == "tool"]
    assert len(tool_events) == len(set(tool_events))
    assert ledger.ran == [("look", "invoice")]  # the call before it ran; the one after waits with it
    assert len(model.requests) == 1  # no model call after the request
    t = await agent.transcript("s")
    assert [c.state.status for c in t.messages[1].tool_parts] == ["completed", "pending", "pending"]
    assert t.pending_approvals[0].call_id == result.approvals[0].call_id
    assert not t.needs_resume  # it waits for a person, not for a resume
    assert [a.call_id for a in await agent.pending_approvals("s")] == [result.approvals[0].call_id]
    why = t.messages[1].tool_parts[1].approval_detail.why
    assert "pay requires approval" in why


async def test_a_rule_asks_only_for_some_arguments() -> None:
    agent, _, ledger = agent_for([[tool_call("order", {"item": "tea", "qty": 2}),
                                   tool_call("order", {"item": "coffee", "qty": 50})], [text("ok")]])
    r = await agent.invoke(session_id="s", messages=[user_message("order")])
    assert r.result == "approval" and [a.state.input["item"] for a in r.approvals] == ["coffee"]
    assert ledger.ran == [("order", ("tea", 2))]


async def test_runs_without_approval_still_end_stop() -> None:
    agent, _, _ = agent_for([[tool_call("look", {"what": "x"})], [text("done")]])
    r = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert r.result == "stop" and r.approvals == []


# --------------------------------------------------------------------------- decisions


async def test_approve_then_resume_runs_it_and_the_call_waiting_behind_it() -> None:
    agent, model, ledger = agent_for([[tool_call("pay", {"amount": 5}), tool_call("look", {"what": "receipt"})],
                                      [text("Paid and checked.")]])
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    call = r.approvals[0].call_id
    decided = await agent.approve("s", call)
    assert decided.approval == "approved" and decided.approval_detail.decided is not None
    assert ledger.ran == []
    events = [e async for e in agent.stream(mode="resume", session_id="s")]
    pay_states = [e["part"].state.status for e in events if e["type"] == "tool" and e["part"].tool == "pay"]
    assert pay_states == ["running", "completed"]  # write-ahead as every call
    assert ledger.ran == [("pay", 5), ("look", "receipt")]
    assert events[-1]["result"].result == "stop" and events[-1]["result"].text == "Paid and checked."
    assert_paired(model.requests)


async def test_deny_then_resume_tells_the_model_and_never_runs_it() -> None:
    agent, model, ledger = agent_for([[tool_call("pay", {"amount": 500}), tool_call("look", {"what": "x"})],
                                      [text("Understood, not paying.")]])
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    await agent.deny("s", r.approvals[0].call_id, reason="too much")
    r2 = await agent.invoke(mode="resume", session_id="s")
    assert r2.text == "Understood, not paying."
    pay, look = (await agent.transcript("s")).messages[1].tool_parts
    assert pay.state.status == "error" and pay.state.metadata.items() >= {"denied": True, "reason": "too much"}.items()
    assert "too much" in pay.state.error
    assert look.state.status == "completed"  # a denial blocks only when the tool blocks on error
    assert ledger.ran == [("look", "x")]
    sent = model.requests[1].messages
    assert any(getattr(m, "is_error", False) and "Denied" in m.content for m in sent)


async def test_a_denial_of_a_blocking_tool_interrupts_the_calls_after_it() -> None:
    agent, _, ledger = agent_for([[tool_call("pay", {"amount": 1}), tool_call("look", {"what": "x"})],
                                  [text("ok")]], blocks=True)
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    await agent.deny("s", r.approvals[0].call_id)
    await agent.invoke(mode="resume", session_id="s")
    pay, look = (await agent.transcript("s")).messages[1].tool_parts
    assert pay.state.metadata.items() >= {"denied": True, "reason": None}.items()
    assert look.interrupted and ledger.ran == []


async def test_undecided_calls_keep_waiting_and_the_model_is_not_called() -> None:
    agent, model, ledger = agent_for([[tool_call("pay", {"amount": 1}), tool_call("pay", {"amount": 2})],
                                      [text("both done")]])
    r = await agent.invoke(session_id="s", messages=[user_message("pay twice")])
    assert [a.state.input["amount"] for a in r.approvals] == [1, 2]
    await agent.approve("s", r.approvals[0].call_id)
    r2 = await agent.invoke(mode="resume", session_id="s")
    assert r2.result == "approval" and [a.state.input["amount"] for a in r2.approvals] == [2]
    assert ledger.ran == [("pay", 1)] and len(model.requests) == 1
    await agent.approve("s", r.approvals[1].call_id)
    r3 = await agent.invoke(mode="resume", session_id="s")
    assert r3.result == "stop" and r3.text == "both done" and ledger.ran == [("pay", 1), ("pay", 2)]


async def test_approve_with_corrected_input_runs_it_and_keeps_the_models() -> None:
    agent, _, ledger = agent_for([[tool_call("pay", {"amount": 500})], [text("ok")]])
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    call = r.approvals[0].call_id
    with pytest.raises(ValueError, match="Invalid arguments"):
        await agent.approve("s", call, input={"amount": "lots"})
    assert (await agent.pending_approvals("s"))[0].approval == "requested"  # no decision recorded
    await agent.approve("s", call, input={"amount": 50})
    await agent.invoke(mode="resume", session_id="s")
    pay = (await agent.transcript("s")).messages[1].tool_parts[0]
    assert ledger.ran == [("pay", 50)]
    assert pay.state.input == {"amount": 50} and pay.state.metadata["original_input"] == {"amount": 500}


async def test_decisions_are_refused_while_a_run_holds_the_session_and_for_wrong_calls() -> None:
    agent, _, _ = agent_for([[tool_call("pay", {"amount": 1})], [text("ok")]])
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    call = r.approvals[0].call_id
    lease = await agent.persistence.acquire_lease("s", "run_other")
    with pytest.raises(SessionBusyError):
        await agent.approve("s", call)
    await lease.release()
    with pytest.raises(ValueError, match="no call 'nope'"):
        await agent.deny("s", "nope")
    await agent.deny("s", call, reason="no")
    with pytest.raises(ValueError, match="already denied"):
        await agent.approve("s", call)  # deciding twice: the first decision stands
    assert (await agent.transcript("s")).messages[1].tool_parts[0].approval == "denied"


async def test_prompt_mode_interrupts_awaiting_calls() -> None:
    agent, _, ledger = agent_for([[tool_call("pay", {"amount": 1})], [text("new answer")]])
    await agent.invoke(session_id="s", messages=[user_message("pay")])
    r = await agent.invoke(session_id="s", messages=[user_message("forget it")])
    assert r.text == "new answer"
    pay = (await agent.transcript("s")).messages[1].tool_parts[0]
    assert pay.interrupted and pay.interrupt_reason == "prompt" and ledger.ran == []


async def test_an_abort_while_an_approved_call_runs_is_then_treated_as_the_seed_says() -> None:
    ran: list[int] = []
    started = asyncio.Event()

    @tool(requires_approval=True)
    async def pay(amount: int) -> str:
        ran.append(amount)
        started.set()
        await asyncio.Event().wait()
        return "never"

    agent = We0Agent(ScriptedModel([[tool_call("pay", {"amount": 1})], [text("told")]]), tools=[pay])
    r = await agent.invoke(session_id="s", messages=[user_message("pay")])
    await agent.approve("s", r.approvals[0].call_id)
    abort = asyncio.Event()
    task = asyncio.ensure_future(agent.invoke(abort=abort, mode="resume", session_id="s"))
    await started.wait()
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    r2 = await agent.invoke(mode="resume", session_id="s")
    part = (await agent.transcript("s")).messages[1].tool_parts[0]
    assert ran == [1] and part.interrupted and r2.text == "told"  # side effects: interrupted, never twice


# --------------------------------------------------------------------------- the planner rows


def _msg(completed: bool) -> AssistantMessage:
    return AssistantMessage(id="msg_1", session_id="s", time=MessageTime(created=1.0, completed=2.0 if completed else None))


def _part(i: int, tool_name: str, approval=None) -> ToolPart:
    return ToolPart(id=f"prt_{i}", session_id="s", message_id="msg_1", call_id=f"c{i}", tool=tool_name,
                    state=ToolStatePending(input={}), approval=approval,
                    approval_detail=ToolApproval(requested=1.0) if approval else None)


def test_plan_rows_for_approval() -> None:
    pol = {"pay": ToolPolicy(requires_approval=True), "look": ToolPolicy(side_effects=False),
           "act": ToolPolicy(), "strict": ToolPolicy(blocks_on_error=True, requires_approval=True)}
    parts = [_part(1, "pay", "approved"), _part(2, "act"), _part(3, "pay", "requested"), _part(4, "look")]
    plan = plan_recovery(_msg(True), parts, pol, "resume")
    assert [a.action for a in plan.tool_actions] == ["execute", "execute", "await", "await"]
    assert plan.awaiting and not plan.close_message
    # in an unfinished message a pending call without approval is the seed's: interrupt/recall
    plan = plan_recovery(_msg(False), [_part(1, "pay", "approved"), _part(2, "act"), _part(3, "look")], pol, "resume")
    assert [a.action for a in plan.tool_actions] == ["execute", "interrupt", "interrupt"]
    plan = plan_recovery(_msg(True), [_part(1, "strict", "denied"), _part(2, "act")], pol, "resume")
    assert [a.action for a in plan.tool_actions] == ["deny", "interrupt"]
    plan = plan_recovery(_msg(True), [_part(1, "pay", "denied"), _part(2, "act")], pol, "resume")
    assert [a.action for a in plan.tool_actions] == ["deny", "execute"]
    plan = plan_recovery(_msg(True), [_part(1, "pay", "requested"), _part(2, "pay", "approved")], pol, "prompt")
    assert [(a.action, a.reason) for a in plan.tool_actions] == [("interrupt", "prompt")] * 2

"""SPEC §11: every call carries a stable idempotency key; a tool that says how to use it is
completed on resume, exactly once — one test per row of the table, and the bad inputs."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import pytest

from we0nb import (MemoryPersistence, Reconciled, ScriptedModel, ToolContext, We0Agent, text, tool, tool_call,
                   user_message)
from we0nb._ids import call_key

from enginekit import seed, state, tool_parts

SID = "ses_eo"


class Service:
    """A payments service that deduplicates on the idempotency key (as Stripe documents it)."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.executions: list[tuple[str, int]] = []

    def charge(self, ctx: ToolContext, amount: int) -> str:
        self.executions.append((ctx.idempotency_key, ctx.attempt))
        self.charges.setdefault(ctx.idempotency_key, amount)
        return f"charged {amount}"


def agent_with(tools: list[Any], steps: Any = None, p: Any = None) -> We0Agent:
    return We0Agent(ScriptedModel(steps or [[text("ok")]]), tools=tools, persistence=p or MemoryPersistence())


def meta(part: Any) -> dict[str, Any]:
    return part.state.metadata


# --------------------------------------------------------------------------- the context and the key


async def test_a_live_call_gets_its_context_with_the_key_written_before_it_runs() -> None:
    p, seen = MemoryPersistence(), []

    @tool
    async def pay(amount: int, ctx: ToolContext) -> str:
        stored = (await p.load_transcript(SID)).messages[-1].tool_parts[0]
        seen.append((ctx, stored.state.status, meta(stored).get("idempotency_key"), meta(stored).get("attempt")))
        return "paid"

    agent = agent_with([pay], [[tool_call("pay", {"amount": 5})], [text("done")]], p)
    assert "ctx" not in pay.json_schema()["properties"]
    await agent.invoke(session_id=SID, messages=[user_message("pay")])
    [(ctx, status, key, attempt)] = seen
    [part] = await tool_parts(agent, SID)
    assert (status, key, attempt) == ("running", ctx.idempotency_key, 1)
    assert ctx == ToolContext(session_id=SID, call_id=part.call_id, tool="pay", idempotency_key=part.state.metadata[
        "idempotency_key"], attempt=1)
    assert re.fullmatch(r"[\x20-\x7e]{1,255}", ctx.idempotency_key)
    assert meta(part)["idempotency_key"] == ctx.idempotency_key and meta(part)["attempt"] == 1


async def test_every_call_has_its_key_from_its_first_write_and_keys_differ() -> None:
    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        return "paid"

    agent = agent_with([pay], [[tool_call("pay", {"amount": 1}), tool_call("pay", {"amount": 2})]])
    r = await agent.invoke(session_id=SID, messages=[user_message("pay")])
    assert r.result == "approval"
    a, b = await tool_parts(agent, SID)
    assert a.state.status == b.state.status == "pending"
    assert meta(a)["idempotency_key"] != meta(b)["idempotency_key"]
    assert meta(a)["idempotency_key"] == call_key(SID, a.id) != call_key("other", a.id)


def test_a_context_annotated_as_a_string_is_recognised_and_two_are_refused() -> None:
    namespace: dict[str, Any] = {}
    exec("from __future__ import annotations\nfrom we0nb import tool, ToolContext\n"
         "@tool\ndef f(x: int, c: ToolContext) -> str:\n    return ''\n", namespace)
    assert namespace["f"].context_param == "c" and list(namespace["f"].json_schema()["properties"]) == ["x"]
    with pytest.raises(TypeError, match="two parameters are annotated ToolContext"):
        @tool
        def g(a: ToolContext, b: ToolContext) -> str:
            return ""


def test_policy_keywords_are_checked_at_definition() -> None:
    with pytest.raises(TypeError, match="reconcile must be a function"):
        tool(lambda x: x, name="t", reconcile="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="idempotent must be True or False"):
        tool(lambda x: x, name="t", idempotent=1)  # type: ignore[arg-type]
    assert tool(lambda x: x, name="t", idempotent=True, side_effects=False).policy.idempotent  # redundant: accepted


# --------------------------------------------------------------------------- resume, row by row


async def test_running_idempotent_call_runs_again_with_the_same_key_and_the_next_attempt() -> None:
    svc = Service()
    pay = tool(svc.charge, name="pay", idempotent=True)
    agent = agent_with([pay])
    ids = await seed(agent.persistence, SID, [("pay", state("running", amount=3))])
    key = call_key(SID, ids["0:pay"])
    await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert part.state.status == "completed" and meta(part)["recalled"] is True and part.recalled
    assert svc.executions == [(key, 1)] and meta(part)["attempt"] == 1  # (seeded with no attempt stored)
    assert meta(part)["idempotency_key"] == key


async def test_attempts_count_from_the_store_across_resumes() -> None:
    svc, gate = Service(), asyncio.Event()

    async def slow(ctx: ToolContext, amount: int) -> str:
        svc.executions.append((ctx.idempotency_key, ctx.attempt))
        if ctx.attempt < 3:
            await gate.wait()  # aborted while it runs
        return "charged"

    pay = tool(slow, name="pay", idempotent=True)
    agent = agent_with([pay], [[tool_call("pay", {"amount": 1})], [text("done")]])
    for mode in ("prompt", "resume"):
        abort = asyncio.Event()
        task = asyncio.ensure_future(agent.invoke(abort=abort, mode=mode, session_id=SID,
                                                  messages=[user_message("go")] if mode == "prompt" else None))
        while len(svc.executions) < (1 if mode == "prompt" else 2):
            await asyncio.sleep(0.01)
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    await agent.invoke(mode="resume", session_id=SID)
    keys = {k for k, _ in svc.executions}
    assert [a for _, a in svc.executions] == [1, 2, 3] and len(keys) == 1
    [part] = await tool_parts(agent, SID)
    assert part.state.status == "completed" and meta(part)["attempt"] == 3


@pytest.mark.parametrize("answer, outcome", [
    (Reconciled.done({"charge": "ch_1"}), "completed-reconciled"),
    (Reconciled.not_done(), "executed"),
    (Reconciled.unknown("the service is down"), "interrupted"),
])
async def test_running_call_with_reconcile(answer: Reconciled, outcome: str) -> None:
    svc, asked = Service(), []

    def check(ctx: ToolContext, input: dict[str, Any]) -> Reconciled:
        asked.append((ctx.idempotency_key, ctx.attempt, input))
        return answer

    pay = tool(svc.charge, name="pay", reconcile=check)
    agent = agent_with([pay])
    ids = await seed(agent.persistence, SID, [("pay", state("running", amount=7))])
    await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert asked == [(call_key(SID, ids["0:pay"]), 1, {"amount": 7})]
    if outcome == "completed-reconciled":
        assert part.state.status == "completed" and meta(part)["reconciled"] is True
        assert part.state.output == '{"charge":"ch_1"}' and svc.executions == []
    elif outcome == "executed":
        assert part.state.status == "completed" and svc.executions and meta(part)["recalled"] is True
    else:
        assert part.state.status == "error" and svc.executions == []
        assert meta(part)["in_doubt"] is True and meta(part)["interrupted"] is True
        assert meta(part)["reason"] == "resume" and meta(part)["reconcile_reason"] == "the service is down"
        assert "may have run" in part.state.error and "the service is down" in part.state.error


async def test_unknown_reconcile_of_an_idempotent_tool_runs_it_again() -> None:
    svc = Service()
    pay = tool(svc.charge, name="pay", idempotent=True, reconcile=lambda ctx, inp: Reconciled.unknown("?"))
    agent = agent_with([pay])
    await seed(agent.persistence, SID, [("pay", state("running", amount=1))])
    await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert part.state.status == "completed" and len(svc.executions) == 1


async def test_pending_call_with_reconcile_runs_without_asking() -> None:
    svc, asked = Service(), []
    pay = tool(svc.charge, name="pay", reconcile=lambda ctx, inp: asked.append(1) or Reconciled.done("x"))
    agent = agent_with([pay])
    await seed(agent.persistence, SID, [("pay", state("pending", amount=1))])
    await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert part.state.status == "completed" and asked == [] and len(svc.executions) == 1


@pytest.mark.parametrize("status, in_doubt, words", [("running", True, "may have run"),
                                                     ("pending", False, "never started")])
async def test_a_plain_side_effect_call_is_interrupted_and_the_model_told_whether_it_may_have_run(
        status: str, in_doubt: bool, words: str) -> None:
    svc = Service()
    agent = agent_with([tool(svc.charge, name="pay")])
    await seed(agent.persistence, SID, [("pay", state(status, amount=1))])
    await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert part.interrupted and meta(part)["in_doubt"] is in_doubt and words in part.state.error
    assert svc.executions == []
    [request] = agent.model.requests
    assert words in request.messages[-1].content


async def test_calls_cut_by_a_blocking_error_never_started() -> None:
    @tool(blocks_on_error=True)
    def first() -> str:
        raise RuntimeError("no")

    @tool
    def second() -> str:
        return "x"

    agent = agent_with([first, second], [[tool_call("first", {}), tool_call("second", {})], [text("ok")]])
    await agent.invoke(session_id=SID, messages=[user_message("go")])
    _, cut = await tool_parts(agent, SID)
    assert meta(cut)["reason"] == "blocked" and meta(cut)["in_doubt"] is False and "idempotency_key" in meta(cut)


# --------------------------------------------------------------------------- prompt mode reconciles, runs nothing


@pytest.mark.parametrize("answer, status, in_doubt", [(Reconciled.done("done"), "completed", None),
                                                      (Reconciled.not_done(), "error", False),
                                                      (Reconciled.unknown("?"), "error", True)])
async def test_prompt_mode_reconciles_a_running_call_and_executes_nothing(answer: Reconciled, status: str,
                                                                         in_doubt: Any) -> None:
    svc = Service()
    pay = tool(svc.charge, name="pay", idempotent=True, reconcile=lambda ctx, inp: answer)
    agent = agent_with([pay])
    await seed(agent.persistence, SID, [("pay", state("running", amount=1)), ("pay", state("pending", amount=2))])
    await agent.invoke(session_id=SID, messages=[user_message("something else")])
    a, b = (await tool_parts(agent, SID))[:2]
    assert svc.executions == []
    assert a.state.status == status and meta(a).get("in_doubt") is in_doubt
    if status == "completed":
        assert meta(a)["reconciled"] is True
    else:
        assert meta(a)["reason"] == "prompt"
    if in_doubt is False:  # (it was running: the model is told it had no effect, not that it never started)
        assert a.state.error == ("Interrupted: a new user message arrived while this call was running; its tool "
                                 "reports that it had no effect, and it was not run again.")
    assert meta(b)["reason"] == "prompt" and meta(b)["in_doubt"] is False
    assert b.state.error == "Interrupted: a new user message arrived before this call started; it never ran."


# --------------------------------------------------------------------------- a reconcile that misbehaves


@pytest.mark.parametrize("make, why", [
    (lambda: (lambda ctx, inp: 1 / 0), "raised ZeroDivisionError"),
    (lambda: (lambda ctx, inp: "yes"), "returned str, not Reconciled"),
    (lambda: _hanging, "took longer than 0.2 s"),
])
async def test_a_reconcile_that_raises_hangs_or_answers_nonsense_is_unknown(make: Any, why: str) -> None:
    svc = Service()
    pay = tool(svc.charge, name="pay", reconcile=make())
    object.__setattr__(pay, "policy", pay.policy.__class__(**{**pay.policy.__dict__, "reconcile_timeout": 0.2}))
    agent = agent_with([pay])
    await seed(agent.persistence, SID, [("pay", state("running", amount=1))])
    r = await agent.invoke(mode="resume", session_id=SID)
    [part] = await tool_parts(agent, SID)
    assert r.result == "stop" and part.interrupted and meta(part)["in_doubt"] is True
    assert why in meta(part)["reconcile_reason"] and svc.executions == []


async def _hanging(ctx: ToolContext, inp: dict[str, Any]) -> Reconciled:
    await asyncio.sleep(30)
    return Reconciled.done("late")


# --------------------------------------------------------------------------- a sync call an abort left running


def _aborting_agent(effects: list, *, seconds: float, reconcile: Any = None, idempotent: bool = False,
                    reconcile_timeout: float = 30.0):
    """A sync tool that sets the run's abort (a person clicked Abort) and lands its effect
    ``seconds`` later, on the worker thread the abort stopped waiting for."""
    import threading
    import time

    abort = asyncio.Event()
    loop_box: dict[str, Any] = {}

    def write(n: int, ctx: ToolContext) -> str:
        """A sync tool with an effect."""
        loop_box["loop"].call_soon_threadsafe(abort.set)
        effects.append(("start", ctx.idempotency_key, threading.get_ident()))
        time.sleep(seconds)
        effects.append(("effect", ctx.idempotency_key, threading.get_ident()))
        return f"wrote {n}"

    t = tool(write, reconcile=reconcile, idempotent=idempotent)
    object.__setattr__(t, "policy", dataclasses.replace(t.policy, reconcile_timeout=reconcile_timeout))
    agent = We0Agent(ScriptedModel([[tool_call("write", {"n": 1})], [text("done")]]), tools=[t])
    return agent, abort, loop_box


async def _abort_then_resume(agent, abort, loop_box) -> Any:
    loop_box["loop"] = asyncio.get_running_loop()
    with pytest.raises(asyncio.CancelledError):
        await agent.invoke(abort=abort, session_id="ses_inflight", messages=[user_message("go")])
    await agent.invoke(mode="resume", session_id="ses_inflight")  # at once, in the same process
    await asyncio.sleep(0.4)  # (anything still running lands)
    return (await agent.transcript("ses_inflight")).messages[1].tool_parts[0]


async def test_a_reconcile_waits_for_the_call_an_abort_left_running_in_this_process() -> None:
    effects: list = []

    def check(ctx: ToolContext, input: dict) -> Reconciled:
        done = any(kind == "effect" and key == ctx.idempotency_key for kind, key, _ in effects)
        return Reconciled.done(f"wrote {input['n']}") if done else Reconciled.not_done()

    agent, abort, box = _aborting_agent(effects, seconds=0.2, reconcile=check)
    call = await _abort_then_resume(agent, abort, box)
    # asked before its thread returned, the reconcile said not_done and the call ran twice
    assert [k for k, *_ in effects] == ["start", "effect"]
    assert call.state.status == "completed" and call.state.metadata["reconciled"] is True


async def test_a_call_still_running_past_the_reconcile_timeout_is_unknown_and_in_doubt() -> None:
    effects: list = []

    def check(ctx: ToolContext, input: dict) -> Reconciled:
        return Reconciled.not_done()  # (never asked: the call still runs here)

    agent, abort, box = _aborting_agent(effects, seconds=0.3, reconcile=check, reconcile_timeout=0.05)
    call = await _abort_then_resume(agent, abort, box)
    assert [k for k, *_ in effects] == ["start", "effect"]  # executed once, never again
    assert call.state.status == "error" and call.state.metadata["interrupted"] is True
    assert call.state.metadata["in_doubt"] is True
    assert "still running" in call.state.metadata["reconcile_reason"]


async def test_an_idempotent_call_is_run_again_only_once_the_one_in_flight_returned() -> None:
    effects: list = []
    agent, abort, box = _aborting_agent(effects, seconds=0.2, idempotent=True)
    call = await _abort_then_resume(agent, abort, box)
    kinds = [k for k, *_ in effects]
    assert kinds == ["start", "effect", "start", "effect"]  # (the service deduplicates the second)
    assert len({key for _, key, _ in effects}) == 1 and call.state.status == "completed"

"""Property: any script, any tool policies, any abort point, then resume — resume is safe.

Invariants after the resume:
* no tool with side effects ever ran twice for the same call;
* every tool part is completed or error, every assistant message has ``time.completed``;
* the model never received a tool call without its result;
* calls of side-effect-free tools that never finished were recalled, never lost.
"""

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message

from enginekit import assert_paired

policy = st.tuples(st.booleans(), st.booleans(), st.booleans())  # side_effects, blocks_on_error, fails
scripts = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=3), min_size=1, max_size=4)


def make_tool(name, side_effects, blocks, fails, log, abort_in):
    async def body(n: int) -> str:
        log.append((name, n))
        if n in abort_in["calls"]:
            abort_in["event"].set()
            await asyncio.sleep(0.05)  # the abort cancels us here
        await asyncio.sleep(0)
        if fails:
            raise RuntimeError(f"{name} failed on {n}")
        return f"{name}:{n}"

    body.__name__ = name
    return tool(body, side_effects=side_effects, blocks_on_error=blocks)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies=st.lists(policy, min_size=4, max_size=4), script=scripts,
       abort_at=st.integers(0, 60), abort_in_tool=st.one_of(st.none(), st.integers(0, 12)),
       prompt_after=st.booleans())
def test_resume_after_any_abort_is_safe(policies, script, abort_at, abort_in_tool, prompt_after):
    asyncio.run(_scenario(policies, script, abort_at, abort_in_tool, prompt_after))


async def _scenario(policies, script, abort_at, abort_in_tool, prompt_after):
    log: list = []
    abort = asyncio.Event()
    abort_in = {"event": abort, "calls": {abort_in_tool} if abort_in_tool is not None else set()}
    tools = [make_tool(f"t{i}", se, bl, fa, log, abort_in) for i, (se, bl, fa) in enumerate(policies)]
    n = 0
    steps = []
    for step in script:
        items = [text("thinking ")]
        for t in step:
            items.append(tool_call(f"t{t}", {"n": n}))
            n += 1
        steps.append(items)
    steps += [[text("final answer")]] * 6  # enough to finish after any recovery
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=tools, persistence=MemoryPersistence())
    sid = "ses_prop"

    count = 0
    aborted = False
    try:
        async for _ in agent.stream(abort=abort, session_id=sid, messages=[user_message("go")]):
            count += 1
            if count == abort_at:
                abort.set()
    except asyncio.CancelledError:
        aborted = True
    abort_in["calls"] = set()

    if aborted:
        before = await agent.transcript(sid)
        unfinished = {p.id for m in before.messages for p in m.tool_parts if p.state.status in ("pending", "running")}
        if prompt_after:
            r = await agent.invoke(session_id=sid, messages=[user_message("new")])
        else:
            r = await agent.invoke(mode="resume", session_id=sid)
        assert r.result == "stop"
    else:
        unfinished = set()

    side_effects = {f"t{i}" for i, (se, _, _) in enumerate(policies) if se}
    runs: dict = {}
    for name, call in log:
        runs[(name, call)] = runs.get((name, call), 0) + 1
    for (name, call), times in runs.items():
        if name in side_effects:
            assert times == 1, f"{name} call {call} ran {times} times"

    t = await agent.transcript(sid)
    for m in t.messages:
        if m.info.role == "assistant":
            assert m.info.time.completed is not None
        for p in m.tool_parts:
            assert p.state.status in ("completed", "error")
            if p.id in unfinished and p.state.metadata.get("recalled"):
                assert p.tool not in side_effects and not prompt_after
            if p.id in unfinished and not p.state.metadata.get("recalled"):
                assert p.state.metadata.get("interrupted") is True
    assert_paired(model.requests)


# --------------------------------------------------------------------------- with approvals

approval_policy = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans())  # + requires approval


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies=st.lists(approval_policy, min_size=4, max_size=4), script=scripts,
       aborts=st.lists(st.integers(0, 40), min_size=1, max_size=4), decisions=st.lists(st.booleans(), max_size=40))
def test_approvals_with_any_decisions_and_aborts_are_safe(policies, script, aborts, decisions):
    asyncio.run(_approval_scenario(policies, script, aborts, decisions))


async def _approval_scenario(policies, script, aborts, decisions):
    """Invariants: no side effect runs twice, no denied call ever runs, an approved call is never
    silently dropped (it ran, or it is marked interrupted), every call ends final once all are decided."""
    log: list = []
    abort_in = {"event": asyncio.Event(), "calls": set()}
    tools = []
    for i, (se, bl, fa, ask) in enumerate(policies):
        t = make_tool(f"t{i}", se, bl, fa, log, abort_in)
        tools.append(tool(t.function, name=t.name, side_effects=se, blocks_on_error=bl, requires_approval=ask))
    n, steps = 0, []
    for step in script:
        items = [text("plan ")]
        for t in step:
            items.append(tool_call(f"t{t}", {"n": n}))
            n += 1
        steps.append(items)
    steps += [[text("final answer")]] * 12
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=tools, persistence=MemoryPersistence())
    sid, choices = "ses_appr", iter(decisions)
    approved, denied_calls = set(), set()
    mode, result = "prompt", None
    for round_ in range(30):
        abort = asyncio.Event()
        abort_at = aborts[round_] if round_ < len(aborts) else -1
        kw = {"messages": [user_message("go")]} if mode == "prompt" else {}
        try:
            count = 0
            async for ev in agent.stream(abort=abort, mode=mode, session_id=sid, **kw):
                count += 1
                if count == abort_at:
                    abort.set()
                if ev["type"] == "finish":
                    result = ev["result"]
        except asyncio.CancelledError:
            result = None
        mode = "resume"
        if result is not None and result.result == "stop":
            break
        for part in await agent.pending_approvals(sid):
            if next(choices, True):
                await agent.approve(sid, part.call_id)
                approved.add(part.state.input["n"])
            else:
                await agent.deny(sid, part.call_id, reason="no")
                denied_calls.add(part.state.input["n"])
    assert result is not None and result.result == "stop"
    side_effects = {f"t{i}" for i, p in enumerate(policies) if p[0]}
    runs: dict = {}
    for name, call in log:
        runs[(name, call)] = runs.get((name, call), 0) + 1
    for (name, call), times in runs.items():
        assert call not in denied_calls, f"denied call {call} ran"
        if name in side_effects:
            assert times == 1, f"{name} call {call} ran {times} times"
    t = await agent.transcript(sid)
    for m in t.messages:
        for p in m.tool_parts:
            assert p.state.status in ("completed", "error")
            if p.state.input.get("n") in approved and (p.tool, p.state.input["n"]) not in runs:
                assert p.interrupted, f"approved call {p.state.input} neither ran nor was interrupted"
    assert_paired(model.requests)

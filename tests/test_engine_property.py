"""Property: any script, any tool policies, any abort point, then resume — resume is safe.

Invariants after the resume:
* no tool with side effects ever ran twice for the same call;
* every tool part is completed or error, every assistant message has ``time.completed``;
* the model never received a tool call without its result;
* calls of side-effect-free tools that never finished were recalled, never lost.
"""

import asyncio
from typing import Any

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


# --------------------------------------------------------------------------- exactly once (SPEC §11)

#: plain (side effects, neither keyword), idempotent (its service deduplicates on the key),
#: reconcile (it tells the truth), reconcile that sometimes cannot tell, read-only
KINDS = ("plain", "idempotent", "reconcile", "reconcile-unsure", "read")


class Effects:
    """The outside world: effects by key (deduplicated) and every execution, per call."""

    def __init__(self) -> None:
        self.by_key: dict[str, int] = {}
        self.executions: dict[int, int] = {}
        self.applied: dict[int, int] = {}
        #: executions of a call whose effect had happened already (a reconcile said so, or should have)
        self.redundant: dict[int, int] = {}


def eo_tool(name: str, kind: str, world: Effects, abort_in: dict, unsure: set) -> Any:
    from we0nb import Reconciled, ToolContext

    async def body(n: int, ctx: ToolContext) -> str:
        world.executions[n] = world.executions.get(n, 0) + 1
        effect_first = n in abort_in["effect_first"]
        if n in abort_in["calls"] and not effect_first:
            abort_in["event"].set()
            await asyncio.sleep(0.05)  # cut before the effect
        if kind in ("idempotent", "reconcile", "reconcile-unsure"):
            if ctx.idempotency_key in world.by_key:
                world.redundant[n] = world.redundant.get(n, 0) + 1
            else:  # the service deduplicates on the key
                world.by_key[ctx.idempotency_key] = n
                world.applied[n] = world.applied.get(n, 0) + 1
        elif kind == "plain":
            world.applied[n] = world.applied.get(n, 0) + 1
        if n in abort_in["calls"] and effect_first:
            abort_in["event"].set()
            await asyncio.sleep(0.05)  # cut after the effect: in doubt
        return f"{name}:{n}"

    def reconcile(ctx: Any, inp: dict) -> Any:
        if kind == "reconcile-unsure" and inp["n"] in unsure:
            return Reconciled.unknown("the service could not say")
        return Reconciled.done(f"{name}:{inp['n']}") if ctx.idempotency_key in world.by_key else Reconciled.not_done()

    body.__name__ = name
    return tool(body, side_effects=kind != "read", idempotent=kind == "idempotent",
                reconcile=reconcile if kind.startswith("reconcile") else None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=4, max_size=4),
       script=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=3),
       aborts=st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 40)), st.integers(0, 12)), min_size=1,
                       max_size=3),
       effect_first=st.sets(st.integers(0, 12)), unsure=st.sets(st.integers(0, 12)),
       prompt_after=st.booleans())
def test_exactly_once_under_any_aborts_and_reconcile_answers(kinds, script, aborts, effect_first, unsure,
                                                            prompt_after):
    asyncio.run(_exactly_once(kinds, script, aborts, effect_first, unsure, prompt_after))


async def _exactly_once(kinds, script, aborts, effect_first, unsure, prompt_after):
    world = Effects()
    abort_in: dict = {"event": None, "calls": set(), "effect_first": effect_first}
    tools = [eo_tool(f"t{i}", k, world, abort_in, unsure) for i, k in enumerate(kinds)]
    n, steps, kind_of = 0, [], {}
    for step in script:
        items = [text("thinking ")]
        for t in step:
            items.append(tool_call(f"t{t}", {"n": n}))
            kind_of[n] = kinds[t]
            n += 1
        steps.append(items)
    steps += [[text("final answer")]] * 12
    model = ScriptedModel(steps)
    agent = We0Agent(model, tools=tools, persistence=MemoryPersistence())
    sid, mode, messages = "ses_eo", "prompt", [user_message("go")]
    for abort_at, abort_in_tool in aborts:  # a run, and each resume, cut at another point
        abort = asyncio.Event()
        cut = abort_in_tool % n if abort_in_tool is not None and n else None  # (a call that exists)
        abort_in["event"], abort_in["calls"] = abort, {cut} - {None}
        count = 0
        try:
            async for _ in agent.stream(abort=abort, mode=mode, session_id=sid, messages=messages):
                count += 1
                if count == abort_at:
                    abort.set()
            break  # (it finished)
        except asyncio.CancelledError:
            mode, messages = "resume", None
    abort_in["calls"] = set()
    if mode == "resume":  # the last one was cut: finish it
        if prompt_after:
            r = await agent.invoke(session_id=sid, messages=[user_message("new")])
        else:
            r = await agent.invoke(mode="resume", session_id=sid)
        assert r.result == "stop"

    t = await agent.transcript(sid)
    parts = {int(p.state.input["n"]): p for m in t.messages for p in m.tool_parts}
    for call, part in parts.items():
        kind = kind_of[call]
        applied = world.applied.get(call, 0)
        assert part.state.status in ("completed", "error")
        if kind != "read":
            assert applied <= 1, f"call {call} ({kind}) had {applied} effects"
        if kind.startswith("reconcile"):  # a reconcile that tells the truth: never run once it ran
            assert world.redundant.get(call, 0) == 0, f"call {call} ({kind}) ran again after its effect"
        if part.interrupted:
            assert part.state.metadata["in_doubt"] in (True, False)
            if part.state.metadata["in_doubt"] is False:
                assert applied == 0, f"call {call} ({kind}) never started, yet had an effect"
        # exactly once: a deduplicating or truthfully reconciled call that was not left to a new
        # prompt ends completed with one effect
        exact = kind == "idempotent" or kind == "reconcile" or (kind == "reconcile-unsure" and call not in unsure)
        if exact and not prompt_after:
            if part.state.status == "completed":
                assert applied == 1, f"call {call} ({kind}) completed with {applied} effects"
            else:  # interrupted only where it never started (behind an interrupt, or blocked)
                assert part.state.metadata["in_doubt"] is False and applied == 0, (call, kind, part.state)
    assert_paired(model.requests)

"""Every event stream() yields matches its TypedDict in we0nb.engine.events (keys and types)."""

from __future__ import annotations

import typing

from pydantic import TypeAdapter

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message
from we0nb.testing import reasoning, usage
from we0nb.engine import events as E

BY_TYPE = {typing.get_type_hints(cls)["type"].__args__[0]: cls for cls in typing.get_args(E.Event)}


async def test_every_event_of_a_rich_run_matches_its_typed_dict() -> None:
    @tool(side_effects=False)
    def look(x: int) -> str:
        return f"saw {x}"

    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        return "paid"

    model = ScriptedModel([[reasoning("hmm"), text("Looking."), tool_call("look", {"x": 1}), usage(10, 2)],
                           [tool_call("pay", {"amount": 3})], [text("Done.")]])
    agent = We0Agent(model, tools=[look, pay], persistence=MemoryPersistence())
    seen = [e async for e in agent.stream(session_id="s", messages=[user_message("go")])]
    await agent.approve("s", seen[-1]["result"].approvals[0].call_id)
    seen += [e async for e in agent.stream(mode="resume", session_id="s")]
    assert set(BY_TYPE) == set(E.EVENT_TYPES)
    for ev in seen:
        cls = BY_TYPE[ev["type"]]
        assert set(ev) <= set(typing.get_type_hints(cls)), ev  # no undeclared key
        TypeAdapter(cls).validate_python(ev)  # required keys present, values of the declared types
    kinds = {e["type"] for e in seen}
    assert {"start", "user-message", "recovery", "step-start", "reasoning-start", "reasoning-delta",
            "reasoning-end", "text-start", "text-delta", "text-end", "tool", "step-finish",
            "approval-request", "finish"} <= kinds

"""The agent's tool table (engine/toolset.py) and the MCP policy rule (mcp/adapter.py), in process."""

from __future__ import annotations

from typing import Sequence

import pytest

from we0nb import ScriptedModel, ToolPolicy, We0Agent, text, tool, tool_call, user_message
from we0nb.engine.toolset import ToolSource, Toolset
from we0nb.tools import AnyToolDefinition


@tool(side_effects=False)
def ping(n: int) -> str:
    return f"pong {n}"


class Source:
    """A tool source whose tool list the test changes (what an MCP server does on list_changed)."""

    label = "source 'fake'"

    def __init__(self, *tools: AnyToolDefinition) -> None:
        self.tools: tuple[AnyToolDefinition, ...] = tools
        self.asked = 0
        self.closed = 0

    async def ensure_tools(self) -> Sequence[AnyToolDefinition]:
        self.asked += 1
        return self.tools

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_static_toolset_never_changes_and_never_awaits_a_source() -> None:
    ts = Toolset([ping], [])
    table = ts.table
    assert await ts.refresh() is table
    assert table.by_name == {"ping": ping} and table.policies == {"ping": ping.policy}


async def test_the_table_is_rebuilt_only_when_a_sources_list_changes() -> None:
    @tool
    def pong(n: int) -> str:
        return "x"

    src = Source()
    assert isinstance(src, ToolSource)
    ts = Toolset([ping], [src])
    first = await ts.refresh()
    assert await ts.refresh() is first and src.asked == 2  # asked each time, rebuilt never
    src.tools = (pong,)
    second = await ts.refresh()
    assert second is not first and [t.name for t in second.tools] == ["ping", "pong"]
    assert [s.name for s in second.schemas] == ["ping", "pong"]


async def test_tools_appearing_between_steps_reach_the_model_and_the_executor() -> None:
    @tool
    def late(n: int) -> str:
        return f"late {n}"

    src = Source()

    @tool
    def grow(n: int) -> str:
        src.tools = (late,)
        return "grown"

    model = ScriptedModel([[tool_call("grow", {"n": 1})], [tool_call("late", {"n": 2})], [text("done")]])
    async with We0Agent(model, tools=[grow, src]) as agent:
        r = await agent.invoke(messages=[user_message("go")])
        tr = await agent.transcript(r.session_id)
    assert [p.state.status for m in tr.messages for p in m.tool_parts] == ["completed", "completed"]
    assert [s.name for s in model.requests[0].tools] == ["grow"]
    assert [s.name for s in model.requests[1].tools] == ["grow", "late"]
    assert src.closed == 1  # async with agent: closed its sources


async def test_the_structured_output_name_is_reserved_for_source_tools_too() -> None:
    @tool
    def final_result(n: int) -> str:
        return "x"

    from pydantic import BaseModel

    class Out(BaseModel):
        n: int

    agent = We0Agent(ScriptedModel([[text("x")]]), tools=[Source(final_result)], output_type=Out)
    with pytest.raises(ValueError, match="reserved for structured output.*prefix="):
        await agent.tool_table()


@pytest.mark.parametrize("hints,trust,override,approval,expect,why", [
    ({}, False, None, False, ToolPolicy(), "default"),
    ({}, True, None, False, ToolPolicy(), "default"),
    ({"read_only_hint": True}, False, None, False, ToolPolicy(), "default (readOnlyHint not trusted)"),
    ({"read_only_hint": True}, True, None, False, ToolPolicy(side_effects=False), "readOnlyHint (trusted)"),
    ({"read_only_hint": False, "destructive_hint": False}, True, None, False, ToolPolicy(), "default"),
    ({"read_only_hint": True}, True, ToolPolicy(side_effects=True), False, ToolPolicy(), "policies="),
    ({}, False, ToolPolicy(side_effects=False, blocks_on_error=True), False,
     ToolPolicy(side_effects=False, blocks_on_error=True), "policies="),
    ({"read_only_hint": True}, True, None, True, ToolPolicy(side_effects=False, requires_approval=True),
     "readOnlyHint (trusted)"),
    ({}, False, ToolPolicy(side_effects=False), True, ToolPolicy(side_effects=False, requires_approval=True),
     "policies="),
])
def test_policy_rule_row_by_row(hints, trust, override, approval, expect, why) -> None:
    from we0nb.mcp.adapter import PolicyOptions, tool_policy

    opts = PolicyOptions(trust_annotations=trust, policies={"t": override} if override else {},
                         requires_approval=frozenset({"t"}) if approval else False)
    assert tool_policy("t", hints, opts) == (expect, why)

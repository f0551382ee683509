"""What an MCP client owes a server beyond tools/call (issue 37), against the SDK test server
(tests/mcp_servers/app.py) as a real process: tools it cannot call are not offered, progress,
elicitation, roots, server logs, and results that keep their detail."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mcpkit import entries, stdio_server
from we0nb import ScriptedModel, We0Agent, text, tool_call, user_message

pytestmark = pytest.mark.timeout(120)


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


async def test_a_task_required_tool_is_not_offered_and_the_reason_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger, prefix="t_")
    model = ScriptedModel([[tool_call("t_echo", {"text": "hi"})], [text("done")]])
    with caplog.at_level(logging.WARNING, logger="we0nb.mcp"):
        async with We0Agent(model, tools=[server]) as agent:
            await agent.invoke(messages=[user_message("go")])
    offered = {s.name for s in model.requests[0].tools}
    assert "t_echo" in offered and "t_report" not in offered
    assert "t_report" not in server.policies()
    assert set(server.hidden_tools) == {"report"} and "called as a task" in server.hidden_tools["report"]
    assert any("tool 'report' is not offered to the model" in r.getMessage() for r in caplog.records)
    assert "not offered: <code>report</code>" in server._repr_html_()
    assert entries(ledger, "report") == []

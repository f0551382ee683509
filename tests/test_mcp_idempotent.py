"""MCP and exactly-once (SPEC §11, issue 33): a trusted ``idempotentHint`` makes a tool idempotent,
and every call sends its idempotency key in ``_meta`` — against a real SDK server over stdio.

Ground truth is the server's ledger: each execution of ``charge`` records the key it received.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mcpkit import await_until, entries, stdio_server
from we0nb import ScriptedModel, ToolPolicy, We0Agent, text, tool_call, user_message
from we0nb.mcp.adapter import IDEMPOTENCY_META_KEY

pytestmark = pytest.mark.timeout(120)


def parts(tr):
    return [p for m in tr.messages for p in m.tool_parts]


async def _abort_mid_charge(agent: We0Agent, ledger: Path, session_id: str) -> None:
    abort = asyncio.Event()
    task = asyncio.create_task(agent.invoke(abort=abort, messages=[user_message("pay")], session_id=session_id))
    await await_until(lambda: entries(ledger, "charge"), what="the charge to start on the server")
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_every_call_sends_its_idempotency_key_in_meta(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    model = ScriptedModel([[tool_call("charge", {"item": "tea"}), tool_call("charge", {"item": "milk"})],
                           [text("paid")]])
    async with We0Agent(model, tools=[stdio_server(ledger)]) as agent:
        r = await agent.invoke(messages=[user_message("pay")])
        tea, milk = parts(await agent.transcript(r.session_id))
    keys = [e["key"] for e in entries(ledger, "charge")]
    assert IDEMPOTENCY_META_KEY == "io.we0nb/idempotency-key"
    assert keys == [tea.state.metadata["idempotency_key"], milk.state.metadata["idempotency_key"]]
    assert keys[0] != keys[1] and all(keys)


async def test_trusted_idempotent_hint_recalls_with_the_same_key(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger, trust_annotations=True)
    model = ScriptedModel([[tool_call("charge", {"item": "block"})], [text("paid")]])
    async with We0Agent(model, tools=[server]) as agent:
        await _abort_mid_charge(agent, ledger, "s-trusted")
        assert server.policies()["charge"] == ToolPolicy(idempotent=True)
        assert {r["tool"]: r["why"] for r in server.policy_table()}["charge"] == "idempotentHint (trusted)"
        r = await agent.invoke(mode="resume", session_id="s-trusted")
        (p,) = parts(await agent.transcript("s-trusted"))
    assert r.result == "stop"
    assert p.state.status == "completed" and p.state.metadata.get("recalled") is True
    runs = entries(ledger, "charge")
    assert len(runs) == 2 and runs[0]["key"] == runs[1]["key"] == p.state.metadata["idempotency_key"]
    assert p.state.output == f'{{"result":"charged block (key {runs[0]["key"]})"}}'


async def test_untrusted_idempotent_hint_is_interrupted_in_doubt(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    server = stdio_server(ledger)
    model = ScriptedModel([[tool_call("charge", {"item": "block"})], [text("paid")]])
    async with We0Agent(model, tools=[server]) as agent:
        await _abort_mid_charge(agent, ledger, "s-untrusted")
        assert server.policies()["charge"] == ToolPolicy()
        assert {r["tool"]: r["why"] for r in server.policy_table()}["charge"] == "default (idempotentHint not trusted)"
        r = await agent.invoke(mode="resume", session_id="s-untrusted")
        (p,) = parts(await agent.transcript("s-untrusted"))
    assert r.result == "stop"
    assert p.state.status == "error" and p.state.metadata.get("interrupted") is True
    assert p.state.metadata.get("in_doubt") is True
    assert [e["key"] for e in entries(ledger, "charge")] == [p.state.metadata["idempotency_key"]]


async def test_policies_override_a_trusted_idempotent_hint(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "ledger", trust_annotations=True,
                          policies={"charge": ToolPolicy(idempotent=False)})
    async with server:
        assert server.policies()["charge"].idempotent is False

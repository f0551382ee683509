"""SPEC §11 in ``tool_calls_df``: the key, attempts, in doubt and reconciled of each call, and the
outcomes ``reconciled`` and ``in_doubt`` — read from what real resumes wrote, on every store."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from we0nb import Reconciled, ScriptedModel, ToolContext, We0Agent, text, tool, tool_call, user_message
from we0nb._ids import call_key
from we0nb.notebook.frames import tool_calls_df

from enginekit import seed, state

STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Ledger:
    """A service that deduplicates on the idempotency key."""

    def __init__(self) -> None:
        self.effects: dict[str, int] = {}

    def charge(self, ctx: ToolContext, amount: int) -> str:
        self.effects.setdefault(ctx.idempotency_key, amount)
        return f"charged {amount}"


async def _history(p: Any) -> dict[str, str]:
    """One session per case, each resumed (or run) for real; returns session → the call's part id."""
    ledger = Ledger()
    tools = [tool(ledger.charge, name="pay_idem", idempotent=True),
             tool(ledger.charge, name="pay_rec", reconcile=lambda ctx, inp: Reconciled.done("found it")),
             tool(ledger.charge, name="pay_unknown", reconcile=lambda ctx, inp: Reconciled.unknown("service down")),
             tool(ledger.charge, name="pay_plain")]
    ids = {}
    for sid, name, status in [("ses_idem", "pay_idem", "running"), ("ses_rec", "pay_rec", "running"),
                              ("ses_unknown", "pay_unknown", "running"), ("ses_doubt", "pay_plain", "running"),
                              ("ses_never", "pay_plain", "pending")]:
        got = await seed(p, sid, [(name, state(status, amount=1))])
        ids[sid] = got[f"0:{name}"]
        await We0Agent(ScriptedModel([[text("ok")]]), tools=tools, persistence=p).invoke(mode="resume", session_id=sid)
    agent = We0Agent(ScriptedModel([[tool_call("pay_plain", {"amount": 2})], [text("done")]]), tools=tools,
                     persistence=p)
    await agent.invoke(session_id="ses_live", messages=[user_message("pay")])
    return ids


async def test_the_exactly_once_columns_and_outcomes(store: Any) -> None:
    ids = await _history(store)
    calls = tool_calls_df(store).set_index("session_id")
    assert calls["in_doubt"].dtype == pd.BooleanDtype() and calls["attempts"].dtype == "int64"
    assert calls["reconciled"].dtype == bool and isinstance(calls["idempotency_key"].dtype, pd.StringDtype)

    def row(sid: str) -> tuple[Any, ...]:
        r = calls.loc[sid]
        return (r["outcome"], r["status"], None if pd.isna(r["in_doubt"]) else bool(r["in_doubt"]),
                bool(r["reconciled"]), int(r["attempts"]))

    assert row("ses_idem") == ("recall", "completed", None, False, 1)
    assert row("ses_rec") == ("reconciled", "completed", None, True, 0)  # (seeded without an attempt written)
    assert row("ses_unknown") == ("in_doubt", "error", True, False, 0)
    assert row("ses_doubt") == ("in_doubt", "error", True, False, 0)
    assert row("ses_never") == ("interrupt", "error", False, False, 0)
    assert row("ses_live") == ("keep", "completed", None, False, 1)
    for sid, pid in ids.items():  # every call has its key, as the engine derived and wrote it
        assert calls.loc[sid, "idempotency_key"] == call_key(sid, pid)
    assert "service down" in calls.loc["ses_unknown", "error"]


async def test_the_frame_reads_the_key_the_engine_wrote(store: Any) -> None:
    """The key shown is the stored one (not re-derived), also while the call is unfinished."""
    from we0nb.messages import ToolStateRunning, ToolTime

    await seed(store, "ses_key", [("pay", ToolStateRunning(input={}, time=ToolTime(start=1.0),
                                                           metadata={"idempotency_key": "ord-42", "attempt": 3}))])
    [r] = tool_calls_df(store).to_dict("records")
    assert (r["idempotency_key"], r["attempts"], r["reconciled"]) == ("ord-42", 3, False)
    assert pd.isna(r["in_doubt"]) and pd.isna(r["outcome"])

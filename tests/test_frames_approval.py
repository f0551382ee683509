"""The approval columns of the frames (issue 11): tool_calls_df's approval, approval_reason,
approved_input and decided, session_summary's requested / approved / denied, and the wait for a
decision in the timeline — identical on memory, SQLite and PostgreSQL (read from the JSON
document on the SQL route: no schema change).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message  # noqa: E402
from we0nb.notebook import frames  # noqa: E402
from we0nb.notebook.frames import session_summary, tool_calls_df  # noqa: E402
from we0nb.notebook.plots import APPROVAL_COLOR, TOOL_COLORS, plot_timeline  # noqa: E402
from we0nb.persistence.sql import columns  # noqa: E402

from test_frames import copy_history  # noqa: E402

PG_URL = os.environ.get("WE0NB_TEST_POSTGRES_URL") or None
NUL_REASON = "too\x00much"


def _tools(ran: list):
    @tool(requires_approval=True)
    def pay(amount: int) -> str:
        ran.append(("pay", amount))
        return f"paid {amount}"

    @tool(requires_approval=lambda input: input["qty"] > 10)
    def order(item: str, qty: int) -> str:
        ran.append(("order", item, qty))
        return f"ordered {qty} {item}"

    @tool(side_effects=False)
    def look(what: str) -> str:
        return f"saw {what}"

    return [pay, order, look]


def build_history(reason: str = "not today") -> tuple[MemoryPersistence, dict]:
    """ses_ap1: four calls that need approval (approved as is, approved with corrected arguments,
    denied with a reason, denied without), decided and resumed; ses_ap2: one call still awaiting;
    ses_ap3: no approval at all."""
    p, ran, ids = MemoryPersistence(), [], {}

    async def go():
        steps = [[text("paying"), tool_call("look", {"what": "bill"}), tool_call("pay", {"amount": 5}),
                  tool_call("pay", {"amount": 500}), tool_call("order", {"item": "tea", "qty": 2}),
                  tool_call("order", {"item": "gold", "qty": 99}), tool_call("pay", {"amount": 1})],
                 [text("done")]]
        agent = We0Agent(ScriptedModel(steps), tools=_tools(ran), persistence=p)
        r = await agent.invoke(session_id="ses_ap1", messages=[user_message("pay")])
        assert r.result == "approval" and len(r.approvals) == 4
        a, b, c, d = (x.call_id for x in r.approvals)
        ids.update(as_is=a, corrected=b, denied=c, denied_silent=d)
        await agent.approve("ses_ap1", a)
        await agent.approve("ses_ap1", b, input={"amount": 50})
        await agent.deny("ses_ap1", c, reason=reason)
        await agent.deny("ses_ap1", d)
        assert (await agent.invoke(mode="resume", session_id="ses_ap1")).result == "stop"

        agent = We0Agent(ScriptedModel([[tool_call("pay", {"amount": 7})], [text("x")]]), tools=_tools(ran),
                         persistence=p)
        r = await agent.invoke(session_id="ses_ap2", messages=[user_message("pay 7")])
        ids["awaiting"] = r.approvals[0].call_id

        agent = We0Agent(ScriptedModel([[tool_call("look", {"what": "sky"})], [text("blue")]]), tools=_tools(ran),
                         persistence=p)
        await agent.invoke(session_id="ses_ap3", messages=[user_message("look")])

    asyncio.run(go())
    assert ran == [("pay", 5), ("pay", 50), ("order", "tea", 2)]
    return p, ids


@pytest.fixture(scope="module")
def history():
    return build_history()


@pytest.fixture(scope="module")
def memory(history):
    return history[0]


@pytest.fixture(scope="module")
def sqlite_db(memory, tmp_path_factory):
    from we0nb import SqlPersistence

    sp = SqlPersistence(f"sqlite:///{tmp_path_factory.mktemp('approval') / 'a.db'}")
    asyncio.run(copy_history(memory, sp))
    yield sp
    asyncio.run(sp.close())


def _pg_store(src):
    from we0nb import SqlPersistence

    schema = f"we0appr_{uuid.uuid4().hex[:10]}"
    sp = SqlPersistence(PG_URL, schema=schema)
    asyncio.run(copy_history(src, sp))
    return sp, schema


def _pg_drop(sp, schema) -> None:
    import psycopg

    asyncio.run(sp.close())
    with psycopg.connect(PG_URL.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="module")
def pg_db(memory):
    if PG_URL is None:
        pytest.skip("WE0NB_TEST_POSTGRES_URL is not set")
    sp, schema = _pg_store(memory)
    yield sp
    _pg_drop(sp, schema)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request):
    return request.getfixturevalue({"memory": "memory", "sqlite": "sqlite_db", "postgres": "pg_db"}[request.param])


# --------------------------------------------------------------------------- tool_calls_df


def test_the_approval_columns_and_their_types(backend, history):
    _, ids = history
    calls = tool_calls_df(backend)
    cols = list(calls.columns)
    assert cols[cols.index("attempts") + 1:cols.index("metadata")] == [  # (after the §11 columns)
        "approval", "approval_reason", "approved_input", "decided"]
    dt = calls["approval"].dtype
    assert isinstance(dt, pd.CategoricalDtype) and list(dt.categories) == ["requested", "approved", "denied"]
    assert isinstance(calls["approval_reason"].dtype, pd.StringDtype)
    assert isinstance(calls["approved_input"].dtype, pd.StringDtype)
    assert str(calls["decided"].dtype) == "datetime64[us, UTC]"
    by = calls.set_index("call_id")

    def row(key):
        r = by.loc[ids[key]]
        return (None if pd.isna(r["approval"]) else r["approval"], None if pd.isna(r["approval_reason"]) else
                r["approval_reason"], None if pd.isna(r["approved_input"]) else json.loads(r["approved_input"]),
                not pd.isna(r["decided"]), r["status"])

    assert row("as_is") == ("approved", "pay requires approval for every call", None, True, "completed")
    assert row("corrected") == ("approved", "pay requires approval for every call", {"amount": 50}, True, "completed")
    assert row("denied") == ("denied", "not today", None, True, "error")
    assert row("denied_silent") == ("denied", None, None, True, "error")
    # a denial was not an interrupt: its reason is the approval's, never interrupt_reason's
    denied = by.loc[[ids["denied"], ids["denied_silent"]]]
    assert not denied["interrupted"].any() and denied["interrupt_reason"].isna().all()
    assert list(calls["interrupt_reason"].dtype.categories) == ["resume", "prompt", "blocked", "fork"]
    assert row("awaiting") == ("requested", "pay requires approval for every call", None, False, "pending")
    # what ran is in input; the model's own arguments in metadata
    corrected = by.loc[ids["corrected"]]
    assert json.loads(corrected["input"]) == {"amount": 50}
    assert json.loads(corrected["metadata"])["original_input"] == {"amount": 500}
    # calls that needed no approval: NA everywhere (the rule said no for 2 teas; look never asks)
    free = calls[calls["tool"].isin(["look"]) | (calls["input"] == '{"item":"tea","qty":2}')]
    assert len(free) == 3
    assert free[["approval", "approval_reason", "approved_input", "decided"]].isna().all().all()
    # the decision came after the request and before the call ran
    assert (by.loc[ids["corrected"], "decided"] <= by.loc[ids["corrected"], "start"])


@pytest.mark.parametrize("other", ["sqlite", "postgres"])
def test_identical_on_every_backend(request, memory, other):
    sql = request.getfixturevalue({"sqlite": "sqlite_db", "postgres": "pg_db"}[other])
    pd.testing.assert_frame_equal(tool_calls_df(memory), tool_calls_df(sql), check_exact=True)
    pd.testing.assert_frame_equal(session_summary(memory), session_summary(sql), check_exact=True)


def test_the_python_json_route_reads_the_same(sqlite_db, monkeypatch):
    """A database whose JSON functions we do not know: every document is read here."""
    expected = tool_calls_df(sqlite_db)
    monkeypatch.setattr(columns, "_extract", lambda *a, **k: None)
    pd.testing.assert_frame_equal(tool_calls_df(sqlite_db), expected, check_exact=True)


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_a_nul_in_the_deny_reason_is_read_whole(where, tmp_path):
    from we0nb import SqlPersistence

    src, ids = build_history(reason=NUL_REASON)
    if where == "sqlite":
        store, schema = SqlPersistence(f"sqlite:///{tmp_path / 'nul.db'}"), None
        asyncio.run(copy_history(src, store))
    else:
        if PG_URL is None:
            pytest.skip("WE0NB_TEST_POSTGRES_URL is not set")
        store, schema = _pg_store(src)
    try:
        got = tool_calls_df(store)
        pd.testing.assert_frame_equal(got, tool_calls_df(src), check_exact=True)
        assert got.set_index("call_id").loc[ids["denied"], "approval_reason"] == NUL_REASON
    finally:
        if schema is None:
            asyncio.run(store.close())
        else:
            _pg_drop(store, schema)


# --------------------------------------------------------------------------- session_summary


def test_summary_counts_requested_approved_denied(backend):
    s = session_summary(backend).set_index("session_id")
    assert list(s.columns[s.columns.get_loc("recalls") + 1:][:3]) == ["requested", "approved", "denied"]
    assert tuple(s.loc["ses_ap1", ["requested", "approved", "denied"]]) == (0, 2, 2)
    assert tuple(s.loc["ses_ap2", ["requested", "approved", "denied"]]) == (1, 0, 0)
    assert tuple(s.loc["ses_ap3", ["requested", "approved", "denied"]]) == (0, 0, 0)
    assert all(s[c].dtype == "int64" for c in ("requested", "approved", "denied"))
    assert list(frames.SUMMARY_COLUMNS)[list(frames.SUMMARY_COLUMNS).index("recalls") + 1:][:3] == [
        "requested", "approved", "denied"]


# --------------------------------------------------------------------------- the timeline


def _bars(ax):
    return [b for b in ax.patches if isinstance(b, matplotlib.patches.Rectangle)]


def test_the_timeline_shows_the_wait_for_each_decision(memory, history):
    _, ids = history
    fig = plot_timeline(memory, "ses_ap1")
    ax = fig.axes[0]
    bars = _bars(ax)
    waits = [b for b in bars if b.get_facecolor() == to_rgba(APPROVAL_COLOR)]
    assert len(waits) == 4  # one per call that needed approval, decided: not hatched
    assert all(b.get_hatch() is None for b in waits)
    calls = tool_calls_df(memory, "ses_ap1").set_index("call_id")
    msgs = frames.messages_df(memory, "ses_ap1")
    t0 = msgs["created"].min()
    decided = sorted((calls.loc[ids[k], "decided"] - t0).total_seconds()
                     for k in ("as_is", "corrected", "denied", "denied_silent"))
    ends = sorted(b.get_x() + b.get_width() for b in waits)
    thinnest = 0.004 * max(ends) + 1e-6  # a bar is never thinner than this (so it shows)
    assert ends == pytest.approx(decided, abs=thinnest)  # each wait ends at its decision
    step_end = (msgs[msgs["role"] == "assistant"]["completed"].iloc[0] - t0).total_seconds()
    assert all(b.get_x() == pytest.approx(step_end, abs=1e-6) for b in waits)  # from when the run stopped
    # the approved calls ran after their decision; the denied ones end as errors
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels.count("  pay") == 3 and labels.count("  order") == 2
    assert "approval wait" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(b.get_facecolor() == to_rgba(TOOL_COLORS["completed"]) for b in bars)
    fig.canvas.draw()


def test_a_call_still_awaiting_waits_to_the_end_of_the_plot(memory):
    fig = plot_timeline(memory, "ses_ap2")
    ax = fig.axes[0]
    bars = _bars(ax)
    waits = [b for b in bars if b.get_facecolor() == to_rgba(APPROVAL_COLOR)]
    assert len(waits) == 1 and waits[0].get_hatch() == "xx"
    # the awaiting call has no other bar (it never started): one step + one wait
    assert len(bars) == 2
    msgs = frames.messages_df(memory, "ses_ap2")
    step_end = (msgs["completed"].max() - msgs["created"].min()).total_seconds()
    assert waits[0].get_x() == pytest.approx(step_end, abs=1e-6)  # from when the run stopped
    right = max(b.get_x() + b.get_width() for b in bars)
    assert waits[0].get_x() + waits[0].get_width() == pytest.approx(right)

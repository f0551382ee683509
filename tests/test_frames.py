"""Transcripts as DataFrames: columns, dtypes, identical frames on every backend, filters.

One scripted history (We0Agent + ScriptedModel into a MemoryPersistence) is copied
object for object into SQLite and PostgreSQL through the port's upserts, so all backends
hold the same ids and times and must give the same frames. PostgreSQL runs when
``WE0NB_TEST_POSTGRES_URL`` is set (each run in its own schema, dropped afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import uuid

import numpy as np
import pandas as pd
import pytest
from sqlalchemy.engine import make_url

from sql_support import put
from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message
from we0nb.testing import reasoning, usage
from we0nb.messages import (
    AssistantMessage, CompactionPart, MessageTime, PartTime, Session, SessionTime, StepFinishPart, StepStartPart,
    TextPart, Usage, UserMessage,
)
from we0nb.notebook import frame_types, frames
from we0nb.persistence.sql import columns, sources
from we0nb.notebook.frames import (
    expand_json, messages_df, parts_df, session_summary, sessions_df, tool_calls_df,
)

PG_ENV = "WE0NB_TEST_POSTGRES_URL"
PG_URL = os.environ.get(PG_ENV) or None
PG_SKIP = f"{PG_ENV} is not set: the PostgreSQL frame tests need a server (e.g. postgresql://postgres@127.0.0.1:5432/test)"

VIEWS = {"sessions": sessions_df, "messages": messages_df, "parts": parts_df, "tool_calls": tool_calls_df}
SPECS = {"sessions": frames.SESSION_COLUMNS, "messages": frames.MESSAGE_COLUMNS, "parts": frames.PART_COLUMNS,
         "tool_calls": frames.TOOL_CALL_COLUMNS}
OLD = 1_600_000_000.0  # 2020-09-13: the hand-written session lives in the past
UNICODE_USER = "première question — 日本語 🌍\nligne 2"


# --------------------------------------------------------------------------- the history


def _manual_session(p: MemoryPersistence) -> None:
    """A compacted session written by hand, long ago (for since/until and the summary text)."""

    async def go():
        sid = "ses_e_manual"
        await p.upsert_session(Session(id=sid, title="old one", time=SessionTime(created=OLD, updated=OLD + 9)))
        u = UserMessage(id="msg_0000000000001", session_id=sid, time=MessageTime(created=OLD + 1))
        await put(p, u)
        await put(p, None, TextPart(id="prt_0000000000001", session_id=sid, message_id=u.id, text="résume",
                                     time=PartTime(start=OLD + 1, end=OLD + 1)))
        a = AssistantMessage(id="msg_0000000000002", session_id=sid, parent_id=u.id, model_id="scripted",
                             time=MessageTime(created=OLD + 2, completed=OLD + 5.5), summary=True,
                             finish_reason="stop", usage=Usage(input_tokens=7, output_tokens=3))
        await put(p, a)
        await put(p, None, *[
            StepStartPart(id="prt_0000000000002", session_id=sid, message_id=a.id, time=OLD + 2),
            CompactionPart(id="prt_0000000000003", session_id=sid, message_id=a.id, summary="Résumé: 3 ✓",
                           time=OLD + 5),
            StepFinishPart(id="prt_0000000000004", session_id=sid, message_id=a.id, reason="stop",
                           usage=Usage(input_tokens=7, output_tokens=3), time=OLD + 5.5),
        ])

    asyncio.run(go())


def build_history() -> MemoryPersistence:
    p = MemoryPersistence()
    box: dict = {"abort": None}

    @tool(side_effects=False)
    def lookup(q: str, n: int = 1, nested: dict | None = None) -> str:
        """Read-only."""
        return f"found {q} ×{n} ✓"

    @tool
    def boom(x: int) -> str:
        raise RuntimeError("kaputt ü")

    @tool
    def send(to: str) -> str:
        """Side effects."""
        return f"sent to {to}"

    @tool(side_effects=False)
    async def slow_read(path: str) -> str:
        """Read-only; the first call aborts its run while it is running."""
        ev = box["abort"]
        if ev is not None and not ev.is_set():
            ev.set()
            await asyncio.sleep(30)
        return f"content of {path}"

    @tool(side_effects=False, blocks_on_error=True)
    def strict(path: str) -> str:
        raise ValueError(f"strict failed on {path}")

    tools = [lookup, boom, send, slow_read, strict]

    async def go():
        # ses_a: unicode text and input, a completed and a failed call, tokens
        m = ScriptedModel([
            [reasoning("réfléchir…"), text("Hello wörld 🌍"),
             tool_call("lookup", {"q": "é日本", "n": 2, "nested": {"k": [1, 2], "deep": {"x": "ÿ"}}}),
             tool_call("boom", {"x": 1}), usage(10, 5, 1, 0)],
            [text("done ✓"), usage(20, 3, 0, 2)],
        ])
        await We0Agent(m, tools, persistence=p).invoke(session_id="ses_a", messages=[user_message(UNICODE_USER)])

        # ses_b: aborted while a read-only call runs, then resumed: recalled + interrupted
        m = ScriptedModel([
            [text("reading then sending"), tool_call("slow_read", {"path": "a.txt"}), tool_call("send", {"to": "bob"})],
            [text("after resume"), usage(1, 1)],
        ])
        agent = We0Agent(m, tools, persistence=p)
        box["abort"] = asyncio.Event()
        with pytest.raises(asyncio.CancelledError):
            await agent.invoke(abort=box["abort"], session_id="ses_b", messages=[user_message("send it")])
        box["abort"] = None
        await agent.invoke(abort=asyncio.Event(), mode="resume", session_id="ses_b")

        # ses_c: a blocking error interrupts the later call of the step ("blocked")
        m = ScriptedModel([[tool_call("strict", {"path": "p"}), tool_call("lookup", {"q": "z"})], [text("ok")]])
        await We0Agent(m, tools, persistence=p).invoke(session_id="ses_c", messages=[user_message("strict")])

        # ses_d: aborted, then a new prompt interrupts the unfinished call ("prompt")
        m = ScriptedModel([[tool_call("slow_read", {"path": "b"})], [text("fine")]])
        agent = We0Agent(m, tools, persistence=p)
        box["abort"] = asyncio.Event()
        with pytest.raises(asyncio.CancelledError):
            await agent.invoke(abort=box["abort"], session_id="ses_d", messages=[user_message("read b")])
        box["abort"] = None
        await agent.invoke(session_id="ses_d", messages=[user_message("never mind")])

    asyncio.run(go())
    _manual_session(p)
    return p


async def copy_history(src, dst) -> None:
    """Copy every session, message and part, object for object (same ids, same times)."""
    for s in await src.list_sessions():
        await dst.upsert_session(s)
        t = await src.load_transcript(s.id)
        for m in t.messages:
            await put(dst, m.info)
            if m.parts:
                await put(dst, None, *m.parts)


# --------------------------------------------------------------------------- backends


def _pg_admin(sql: str) -> None:
    import psycopg

    url = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


@pytest.fixture(scope="module")
def memory() -> MemoryPersistence:
    return build_history()


@pytest.fixture(scope="module")
def sqlite_db(memory, tmp_path_factory):
    from we0nb import SqlPersistence

    path = tmp_path_factory.mktemp("frames") / "history.db"
    sp = SqlPersistence(f"sqlite:///{path}")
    try:
        asyncio.run(copy_history(memory, sp))
        yield sp
    finally:
        asyncio.run(sp.close())


@pytest.fixture(scope="module")
def pg_db(memory):
    if PG_URL is None:
        pytest.skip(PG_SKIP)
    from we0nb import SqlPersistence

    schema = f"we0frames_{uuid.uuid4().hex[:10]}"
    sp = SqlPersistence(PG_URL, schema=schema)
    try:
        asyncio.run(copy_history(memory, sp))
        yield sp
    finally:
        asyncio.run(sp.close())
        _pg_admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request):
    name = {"memory": "memory", "sqlite": "sqlite_db", "postgres": "pg_db"}[request.param]
    return request.getfixturevalue(name)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def empty_backend(request, tmp_path):
    from we0nb import SqlPersistence

    if request.param == "memory":
        yield MemoryPersistence()
    elif request.param == "sqlite":
        sp = SqlPersistence(f"sqlite:///{tmp_path / 'empty.db'}")
        try:
            yield sp
        finally:
            asyncio.run(sp.close())
    else:
        if PG_URL is None:
            pytest.skip(PG_SKIP)
        schema = f"we0frames_{uuid.uuid4().hex[:10]}"
        sp = SqlPersistence(PG_URL, schema=schema)
        try:
            yield sp
        finally:
            asyncio.run(sp.close())
            _pg_admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --------------------------------------------------------------------------- dtype checks


def check_dtypes(df: pd.DataFrame, view: str) -> None:
    spec = SPECS[view]
    assert list(df.columns) == list(spec), (list(df.columns), list(spec))
    for name, kind in spec.items():
        dt = df[name].dtype
        if kind == ("outcome",):
            assert isinstance(dt, pd.CategoricalDtype)
            assert list(dt.categories) == ["keep", "recall", "interrupt", "reconciled", "in_doubt"]
        elif isinstance(kind, tuple):
            assert dt == np.dtype("timedelta64[us]"), (name, dt)
        elif kind in ("id", "str", "json"):
            assert isinstance(dt, pd.StringDtype) and dt.na_value is pd.NA, (name, dt)
        elif kind == "time":
            assert isinstance(dt, pd.DatetimeTZDtype) and str(dt.tz) == "UTC" and dt.unit == "us", (name, dt)
        elif kind == "int":
            assert dt == pd.Int64Dtype(), (name, dt)
        elif kind in ("count", "order"):
            assert dt == np.dtype("int64"), (name, dt)
        elif kind == "bool":
            assert dt == np.dtype(bool), (name, dt)
        elif kind == "nbool":
            assert dt == pd.BooleanDtype(), (name, dt)
        elif kind == "usd":
            assert dt == np.dtype("float64"), (name, dt)
        elif kind.startswith("cat:"):
            assert isinstance(dt, pd.CategoricalDtype), (name, dt)
            assert isinstance(dt.categories.dtype, pd.StringDtype), (name, dt.categories.dtype)
            fixed = frame_types.FIXED_CATEGORIES.get(name)
            if fixed is not None:
                assert list(dt.categories[: len(fixed)]) == list(fixed)
        else:  # pragma: no cover
            raise AssertionError(kind)


@pytest.mark.parametrize("view", list(VIEWS))
def test_columns_and_dtypes(backend, view):
    df = VIEWS[view](backend)
    assert len(df) > 0
    check_dtypes(df, view)
    for id_col in ("session_id", "message_id", "part_id"):
        if id_col in df:
            assert df[id_col].notna().all()


def test_minimum_columns(memory):
    assert {"session_id", "message_id", "role"} <= set(messages_df(memory).columns)
    assert {"session_id", "message_id", "part_id", "tool", "status", "interrupted", "interrupt_reason", "error",
            "recalled", "output", "duration", "input", "metadata", "outcome"} <= set(tool_calls_df(memory).columns)
    assert {"session_id", "message_id", "part_id", "order", "type"} <= set(parts_df(memory).columns)


@pytest.mark.parametrize("view", list(VIEWS) + ["summary"])
def test_empty_persistence(empty_backend, memory, view):
    fn = session_summary if view == "summary" else VIEWS[view]
    empty = fn(empty_backend)
    full = fn(memory)
    assert len(empty) == 0
    assert list(empty.columns) == list(full.columns)
    assert dict(empty.dtypes) == dict(full.dtypes) or all(
        str(a) == str(b) for a, b in zip(empty.dtypes, full.dtypes))
    if view != "summary":
        check_dtypes(empty, view)


# --------------------------------------------------------------------------- identical frames


@pytest.mark.parametrize("view", list(VIEWS) + ["summary"])
@pytest.mark.parametrize("other", ["sqlite", "postgres"])
def test_identical_frames_across_backends(request, memory, view, other):
    sql = request.getfixturevalue({"sqlite": "sqlite_db", "postgres": "pg_db"}[other])
    fn = session_summary if view == "summary" else VIEWS[view]
    a, b = fn(memory), fn(sql)
    assert len(a) > 0
    pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_identical_with_filters_across_backends(memory, sqlite_db):
    since = pd.Timestamp("2021-01-01", tz="UTC")
    for fn in VIEWS.values():
        for kw in ({"session_id": ["ses_b", "ses_e_manual"]}, {"since": since}, {"until": since},
                   {"session_id": "ses_a", "since": since}):
            pd.testing.assert_frame_equal(fn(memory, **kw), fn(sqlite_db, **kw), check_exact=True)


def test_python_json_fallback_matches(sqlite_db, monkeypatch):
    """A database whose JSON functions we do not know: ``data`` is read and parsed here."""
    expected = {name: fn(sqlite_db) for name, fn in VIEWS.items()}
    monkeypatch.setattr(columns, "_extract", lambda *a, **k: None)
    for name, fn in VIEWS.items():
        pd.testing.assert_frame_equal(fn(sqlite_db), expected[name], check_exact=True)


def test_inputs_agent_engine_url(memory, sqlite_db):
    agent = We0Agent(ScriptedModel([]), persistence=memory)
    pd.testing.assert_frame_equal(tool_calls_df(agent), tool_calls_df(memory))
    assert columns.open_reader(memory) is None  # read through its port
    with columns.open_reader(sqlite_db) as reader:  # SqlPersistence: read in bulk, never through the port
        assert reader.dialect == "sqlite" and not reader.owned
    expected = parts_df(sqlite_db)
    pd.testing.assert_frame_equal(parts_df(We0Agent(ScriptedModel([]), persistence=sqlite_db)), expected)
    pd.testing.assert_frame_equal(parts_df(sqlite_db.url), expected)
    pd.testing.assert_frame_equal(parts_df(sqlite_db.url.replace("sqlite://", "sqlite+aiosqlite://")), expected)
    pd.testing.assert_frame_equal(parts_df(sqlite_db.sync_engine()), expected)
    from sqlalchemy.engine import make_url

    pd.testing.assert_frame_equal(parts_df(make_url(sqlite_db.url)), expected)


def test_bad_arguments(memory):
    with pytest.raises(TypeError, match="session_id"):
        parts_df(memory, 5)
    with pytest.raises(TypeError, match="session_id"):
        parts_df(memory, ["ses_a", 3])
    with pytest.raises(ValueError, match="since"):
        parts_df(memory, since="not a time")
    with pytest.raises(TypeError, match="until"):
        parts_df(memory, until=object())
    with pytest.raises(TypeError, match="We0Agent"):
        parts_df(42)
    with pytest.raises(ValueError, match="URL"):
        parts_df("we0.db")


# --------------------------------------------------------------------------- content


def test_one_row_per_entity_and_order(backend):
    msgs = messages_df(backend)
    parts = parts_df(backend)
    calls = tool_calls_df(backend)
    assert msgs["message_id"].is_unique and parts["part_id"].is_unique and calls["part_id"].is_unique
    assert set(parts["message_id"]) <= set(msgs["message_id"])
    # order: 1-based, consecutive within the group, following the ids (history order)
    for df, group, key in ((msgs, "session_id", "message_id"), (parts, "message_id", "part_id"),
                           (calls, "session_id", "part_id")):
        for _, g in df.groupby(group, observed=True):
            assert g["order"].tolist() == list(range(1, len(g) + 1))
            assert g[key].tolist() == sorted(g[key].tolist())
    # tool calls are exactly the tool parts; joined on part_id they agree
    tool_parts = parts[parts["type"] == "tool"]
    assert sorted(tool_parts["part_id"]) == sorted(calls["part_id"])
    j = calls.merge(tool_parts[["part_id", "tool", "status", "start", "end"]], on="part_id", suffixes=("", "_p"))
    assert (j["tool"].astype(str) == j["tool_p"].astype(str)).all()
    assert (j["status"].astype(str) == j["status_p"].astype(str)).all()
    assert sessions_df(backend)["session_id"].tolist() == ["ses_a", "ses_b", "ses_c", "ses_d", "ses_e_manual"]


def test_durations_and_times(memory):
    calls = tool_calls_df(memory)
    finished = calls[calls["start"].notna() & calls["end"].notna()]
    assert len(finished) >= 3
    assert (finished["duration"] == finished["end"] - finished["start"]).all()
    assert (finished["duration"] >= pd.Timedelta(0)).all()
    msgs = messages_df(memory)
    e = msgs[msgs["session_id"] == "ses_e_manual"]
    assert e["created"].iloc[0] == pd.Timestamp(OLD + 1, unit="s", tz="UTC")
    assert e["duration"].iloc[1] == pd.Timedelta(seconds=3.5)
    assert e["completed"].iloc[0] is pd.NaT  # a user message is never "completed"
    s = sessions_df(memory, "ses_e_manual")
    assert s["duration"].iloc[0] == pd.Timedelta(seconds=9)


def test_unicode_round_trip(backend):
    parts = parts_df(backend, "ses_a")
    texts = parts["text"].dropna().tolist()
    assert UNICODE_USER in texts
    assert "Hello wörld 🌍" in texts and "réfléchir…" in texts and "done ✓" in texts
    calls = tool_calls_df(backend, "ses_a")
    look = calls[calls["tool"] == "lookup"].iloc[0]
    assert json.loads(look["input"]) == {"q": "é日本", "n": 2, "nested": {"k": [1, 2], "deep": {"x": "ÿ"}}}
    assert "é日本" in look["input"]  # compact JSON, not \\u-escaped
    assert look["output"] == "found é日本 ×2 ✓"
    boom = calls[calls["tool"] == "boom"].iloc[0]
    assert boom["status"] == "error" and "kaputt ü" in boom["error"] and pd.isna(boom["output"])
    assert sessions_df(backend, "ses_a")["title"].iloc[0] == "première question — 日本語 🌍"
    comp = parts_df(backend, "ses_e_manual")
    assert comp.loc[comp["type"] == "compaction", "text"].tolist() == ["Résumé: 3 ✓"]


def test_abort_then_resume_shows_interrupted_and_recalled(backend):
    calls = tool_calls_df(backend, "ses_b").set_index("tool")
    read, send = calls.loc["slow_read"], calls.loc["send"]
    assert read["status"] == "completed" and bool(read["recalled"]) and not read["interrupted"]
    assert read["output"] == "content of a.txt"
    assert json.loads(read["metadata"]).items() >= {"recalled": True}.items()
    assert send["status"] == "error" and bool(send["interrupted"]) and not send["recalled"]
    assert send["interrupt_reason"] == "resume"
    assert "Interrupted" in send["error"]
    assert pd.isna(send["start"]) and pd.notna(send["end"])  # never started
    assert pd.isna(send["duration"])
    msgs = messages_df(backend, "ses_b")
    first_step = msgs[msgs["role"] == "assistant"].iloc[0]
    assert first_step["error_reason"] == "UnfinishedAssistantMessage"
    assert first_step["finish_reason"] is pd.NA
    summ = session_summary(backend, "ses_b").iloc[0]
    assert (summ["interrupts"], summ["recalls"], summ["errors"], summ["tool_calls"]) == (1, 1, 0, 2)
    assert (summ["completed"], summ["error"], summ["steps"], summ["step_errors"]) == (1, 1, 2, 1)


def test_interrupt_reasons_blocked_and_prompt(backend):
    calls = tool_calls_df(backend)
    by = {(r.session_id, r.tool): r for r in calls.itertuples()}
    strict = by[("ses_c", "strict")]
    assert strict.status == "error" and not strict.interrupted and "strict failed" in strict.error
    blocked = by[("ses_c", "lookup")]
    assert blocked.interrupted and blocked.interrupt_reason == "blocked"
    prompt = by[("ses_d", "slow_read")]
    assert prompt.interrupted and prompt.interrupt_reason == "prompt" and not prompt.recalled
    assert pd.notna(prompt.start)  # it was running when the run was aborted
    assert sorted(calls["interrupt_reason"].dropna().astype(str)) == ["blocked", "prompt", "resume"]


def test_tokens_nullable(backend):
    msgs = messages_df(backend, "ses_a")
    user = msgs[msgs["role"] == "user"]
    asst = msgs[msgs["role"] == "assistant"]
    assert user["input_tokens"].isna().all() and user["model_id"].isna().all()
    assert asst["input_tokens"].tolist() == [10, 20]
    assert asst["cached_tokens"].tolist() == [0, 2]
    assert asst["finish_reason"].tolist() == ["tool-calls", "stop"]
    assert asst["model_id"].tolist() == ["scripted", "scripted"]
    assert (asst["parent_id"] == user["message_id"].iloc[0]).all()


def test_session_summary_values(backend):
    s = session_summary(backend).set_index("session_id")
    a = s.loc["ses_a"]
    assert (a["steps"], a["tool_calls"], a["completed"], a["errors"], a["interrupts"], a["recalls"]) == (2, 2, 1, 1, 0, 0)
    assert (a["input_tokens"], a["output_tokens"], a["reasoning_tokens"], a["cached_tokens"]) == (30, 8, 1, 2)
    assert a["messages"] == 3 and a["pending"] == 0 and a["running"] == 0
    c = s.loc["ses_c"]
    assert (c["errors"], c["interrupts"]) == (1, 1)
    e = s.loc["ses_e_manual"]
    assert (e["steps"], e["tool_calls"], e["tool_time"]) == (1, 0, pd.Timedelta(0))
    assert e["wall_time"] == pd.Timedelta(seconds=4.5) and e["step_time"] == pd.Timedelta(seconds=3.5)
    calls = tool_calls_df(backend)
    assert s["tool_calls"].sum() == len(calls)
    assert s["tool_time"].sum() == calls["duration"].sum()


# --------------------------------------------------------------------------- filters


def test_filter_by_session_ids(backend):
    for fn in VIEWS.values():
        one = fn(backend, "ses_b")
        assert set(one["session_id"]) == {"ses_b"}
        two = fn(backend, ["ses_b", "ses_a", "ses_b"])
        assert set(two["session_id"]) == {"ses_a", "ses_b"}
        assert two["session_id"].tolist() == sorted(two["session_id"].tolist())
        assert len(fn(backend, pd.Series(["ses_a"]))) == len(fn(backend, "ses_a"))
        assert len(fn(backend, [])) == 0 and len(fn(backend, "nope")) == 0
        full = fn(backend)
        sub = full[full["session_id"].isin(["ses_a", "ses_b"])].reset_index(drop=True)
        pd.testing.assert_frame_equal(two, sub, check_categorical=False)


def test_filter_since_until(backend):
    cut = "2021-01-01"  # the hand-written session is older
    for name, fn in VIEWS.items():
        new, old = fn(backend, since=cut), fn(backend, until=cut)
        assert "ses_e_manual" not in set(new["session_id"]) and len(new) > 0
        assert set(old["session_id"]) == (set() if name == "tool_calls" else {"ses_e_manual"})
        assert len(new) + len(old) == len(fn(backend))
    msgs = messages_df(backend, "ses_b")
    t = msgs["created"].iloc[2]  # the step written by the resume
    later = messages_df(backend, "ses_b", since=t)
    assert later["message_id"].tolist() == msgs["message_id"].iloc[2:].tolist()
    assert later["order"].tolist() == list(range(1, len(later) + 1))
    # parts follow their message's creation time; every accepted time form agrees
    ids = set(later["message_id"])
    for since in (t, t.to_pydatetime(), t.isoformat(), t.timestamp(), t.tz_localize(None)):
        got = parts_df(backend, "ses_b", since=since)
        assert set(got["message_id"]) == ids, since
    before = parts_df(backend, "ses_b", until=t)
    assert ids.isdisjoint(before["message_id"]) and len(before) > 0
    # epoch seconds far out of any store's integers: the same answer everywhere (was an OverflowError
    # on SQLite, "bigint out of range" on PostgreSQL)
    for name, fn in VIEWS.items():
        everything = len(fn(backend))
        assert [len(fn(backend, since=x)) for x in (1e20, -1e20, 1e300)] == [0, everything, 0], name
        assert [len(fn(backend, until=x)) for x in (1e20, -1e20)] == [everything, 0], name


def test_views_work_inside_a_running_loop(memory):
    async def in_cell():
        return tool_calls_df(memory), session_summary(memory)

    calls, summ = asyncio.run(in_cell())
    pd.testing.assert_frame_equal(calls, tool_calls_df(memory))
    assert len(summ) == 5


# --------------------------------------------------------------------------- expand_json


def test_expand_json_tool_input(memory):
    calls = tool_calls_df(memory, "ses_a")
    wide = expand_json(calls, "input")
    cols = list(wide.columns)
    assert "input" not in cols
    pos = list(calls.columns).index("input")
    assert cols[:pos] == list(calls.columns)[:pos]
    new = [c for c in cols if c.startswith("input.")]
    assert set(new) == {"input.q", "input.n", "input.nested.k", "input.nested.deep.x", "input.x"}
    look = wide[wide["tool"] == "lookup"].iloc[0]
    assert look["input.q"] == "é日本" and look["input.n"] == 2 and look["input.nested.deep.x"] == "ÿ"
    assert look["input.nested.k"] == [1, 2]
    boom = wide[wide["tool"] == "boom"].iloc[0]
    assert boom["input.x"] == 1 and pd.isna(boom["input.q"])
    assert wide.index.equals(calls.index)


def test_expand_json_options(memory):
    calls = tool_calls_df(memory, "ses_a")
    kept = expand_json(calls, "input", prefix="in_", max_level=0, keep=True)
    assert "input" in kept.columns and "in_nested" in kept.columns and "in_nested.k" not in kept.columns
    df = pd.DataFrame({"a": pd.array(['{"k": 1}', None, "[1, 2]", "3"], dtype="string")}, index=[5, 6, 7, 8])
    out = expand_json(df, "a")
    assert list(out.columns) == ["a.k", "a.value"]
    assert out.loc[5, "a.k"] == 1 and pd.isna(out.loc[6, "a.k"]) and out.loc[7, "a.value"] == [1, 2]
    assert out.loc[8, "a.value"] == 3
    empty = expand_json(df.iloc[:0], "a")
    assert len(empty) == 0 and "a" not in empty.columns
    with pytest.raises(KeyError, match="nope"):
        expand_json(df, "nope")
    with pytest.raises(ValueError, match="not JSON"):
        expand_json(pd.DataFrame({"a": ["{bad"]}), "a")
    with pytest.raises(ValueError, match="already exist"):
        expand_json(pd.DataFrame({"a": ['{"k": 1}'], "a.k": [0]}), "a")
    with pytest.raises(TypeError):
        expand_json([1], "a")


def test_frames_serialize(memory, tmp_path):
    """JSON strings (not dicts) keep frames writable to parquet and printable deterministically."""
    for name, fn in VIEWS.items():
        df = fn(memory)
        path = tmp_path / f"{name}.parquet"
        df.to_parquet(path)
        back = pd.read_parquet(path)
        assert len(back) == len(df) and list(back.columns) == list(df.columns)


def test_time_read_off_a_frame_selects_its_own_row(backend):
    """since/until compare whole microseconds, as the frames show times (no float surprises)."""
    msgs = messages_df(backend)
    for row in msgs.itertuples():
        got = messages_df(backend, row.session_id, since=row.created)
        assert got["message_id"].iloc[0] == row.message_id
        before = messages_df(backend, row.session_id, until=row.created)
        assert row.message_id not in set(before["message_id"])
        assert len(got) + len(before) == int((msgs["session_id"] == row.session_id).sum())
    calls = tool_calls_df(backend)
    t = messages_df(backend, "ses_a")["created"].iloc[1]
    assert set(tool_calls_df(backend, since=t, until=t + pd.Timedelta(microseconds=1))["session_id"]) == {"ses_a"}
    assert len(tool_calls_df(backend, since=t, until=t)) == 0 and len(calls) > 0


def test_long_id_lists_are_filtered_after_the_query(memory, sqlite_db, monkeypatch):
    monkeypatch.setattr(columns, "_MAX_SQL_IDS", 1)
    ids = ["ses_b", "ses_a", "nope"]
    for name, fn in VIEWS.items():
        pd.testing.assert_frame_equal(fn(sqlite_db, ids), fn(memory, ids), check_exact=True)
        assert set(fn(sqlite_db, ids)["session_id"]) == {"ses_a", "ses_b"}
    pd.testing.assert_frame_equal(session_summary(sqlite_db, ids), session_summary(memory, ids))


def test_rows_sorted_by_code_point_on_every_backend(empty_backend):
    """Session ids a collation would sort differently come out in Python's order everywhere."""
    src = MemoryPersistence()
    ids = ["alpha", "Zeta", "_x", "é", "ab", "a-b", "B"]

    async def fill():
        for i, sid in enumerate(ids):
            t = OLD + i
            await src.upsert_session(Session(id=sid, title=sid, time=SessionTime(created=t, updated=t)))
            u = UserMessage(id=f"msg_{i:04d}", session_id=sid, time=MessageTime(created=t))
            await put(src, u)
            await put(src, None, TextPart(id=f"prt_{i:04d}", session_id=sid, message_id=u.id, text=sid))
        await copy_history(src, empty_backend) if empty_backend is not src else None

    asyncio.run(fill())
    for fn in (sessions_df, messages_df, parts_df):
        got = fn(empty_backend)["session_id"].tolist()
        assert got == sorted(ids)
        pd.testing.assert_frame_equal(fn(empty_backend), fn(src), check_exact=True)


def test_urls_and_engines_must_hold_we0nb_tables(tmp_path):
    import sqlalchemy as sa

    other = tmp_path / "other.db"
    eng = sa.create_engine(f"sqlite:///{other}")
    try:
        with eng.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with pytest.raises(ValueError, match="no we0nb tables"):
            tool_calls_df(eng)
        with pytest.raises(ValueError, match="no we0nb tables"):
            sessions_df(f"sqlite:///{other}")
    finally:
        eng.dispose()


def test_sync_url_mapping():
    assert str(sources.sync_url("sqlite+aiosqlite:///x.db")) == "sqlite:///x.db"
    assert sources.sync_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert sources.sync_url("postgresql+asyncpg://u@h/db").drivername == "postgresql+psycopg"
    assert sources.sync_url("postgresql+psycopg_async://u@h/db").drivername == "postgresql+psycopg"
    assert sources.sync_url("sqlite:///x.db").drivername == "sqlite"


def test_in_memory_sqlite_persistence(memory):
    from we0nb import SqlPersistence

    sp = SqlPersistence("sqlite://")
    try:
        asyncio.run(copy_history(memory, sp))
        for fn in VIEWS.values():
            pd.testing.assert_frame_equal(fn(sp), fn(memory), check_exact=True)
    finally:
        asyncio.run(sp.close())


def test_async_engine_input(memory, sqlite_db):
    from sqlalchemy.ext.asyncio import create_async_engine

    eng = create_async_engine(sqlite_db.url.replace("sqlite://", "sqlite+aiosqlite://"))
    try:
        pd.testing.assert_frame_equal(tool_calls_df(eng), tool_calls_df(memory), check_exact=True)
    finally:
        asyncio.run(eng.dispose())


@pytest.mark.parametrize("chunk", [None, 2])
def test_categories_outside_the_fixed_ones_from_sqlite(memory, tmp_path, monkeypatch, chunk):
    """A stored value outside the fixed categories becomes a category of its own (the fixed
    ones first), also when it arrives in one fetched chunk and not in the others."""
    if chunk is not None:
        monkeypatch.setattr(columns, "_CHUNK", chunk)
    import sqlite3

    from we0nb import SqlPersistence

    path = tmp_path / "odd.db"
    sp = SqlPersistence(f"sqlite:///{path}")
    asyncio.run(copy_history(memory, sp))
    asyncio.run(sp.close())
    calls = tool_calls_df(memory)
    part, other = calls["part_id"].iloc[0], calls["part_id"].iloc[1]
    text_part = parts_df(memory).query("type == 'text'")["part_id"].iloc[0]
    with contextlib.closing(sqlite3.connect(path)) as c, c:
        c.execute("UPDATE we0_parts SET status = 'zzz', interrupted = 1, interrupt_reason = '7' WHERE id = ?", (part,))
        c.execute("UPDATE we0_parts SET status = '2', interrupt_reason = NULL WHERE id = ?", (other,))
        c.execute("UPDATE we0_parts SET type = '0' WHERE id = ?", (text_part,))
    url = f"sqlite:///{path}"
    for sid in (None, list(set(calls["session_id"]))):
        got = tool_calls_df(url, sid).set_index("part_id")
        assert got.loc[part, "status"] == "zzz" and got.loc[part, "interrupt_reason"] == "7"
        assert got.loc[other, "status"] == "2" and pd.isna(got.loc[other, "interrupt_reason"])
        assert pd.isna(got.loc[part, "outcome"])  # not a status we know to be finished
        assert list(got["status"].cat.categories) == [*frame_types.STATUSES, "2", "zzz"]
        assert list(got["interrupt_reason"].cat.categories) == [*frame_types.INTERRUPT_REASONS, "7"]
        parts = parts_df(url, sid).set_index("part_id")
        assert parts.loc[text_part, "type"] == "0"
        assert list(parts["type"].cat.categories) == [*frame_types.PART_TYPES, "0"]
        assert parts["status"].isna().sum() == parts_df(memory, sid)["status"].isna().sum()


# --------------------------------------------------------------------------- tool calls: order and outcome


def test_tool_calls_columns_read_first_ids_last(memory):
    cols = list(tool_calls_df(memory).columns)
    assert cols[:7] == ["tool", "status", "outcome", "input", "output", "error", "duration"]
    assert cols[-6:] == ["session_id", "order", "message_id", "part_id", "call_id", "idempotency_key"]
    assert cols.index("start") < cols.index("session_id")
    assert list(parts_df(memory).columns)[:3] == ["session_id", "message_id", "part_id"]  # the others: ids first


def _states_session(p) -> None:
    """One call in each state and with each flag, written by hand."""
    from we0nb.messages import ToolPart, ToolStateCompleted, ToolStateError, ToolStatePending, ToolStateRunning, ToolTime

    sid, t = "ses_states", OLD + 100
    tt = ToolTime(start=t, end=t + 1)
    states = {
        "kept": ToolStateCompleted(output="ok", time=tt),
        "failed": ToolStateError(error="boom", time=tt),
        "recalled": ToolStateCompleted(output="again", metadata={"recalled": True}, time=tt),
        "recalled_failed": ToolStateError(error="again failed", metadata={"recalled": True}, time=tt),
        "interrupted": ToolStateError(error="Interrupted", metadata={"interrupted": True, "reason": "resume"},
                                      time=ToolTime(end=t)),
        "pending": ToolStatePending(),
        "running": ToolStateRunning(time=ToolTime(start=t)),
        "running_recall": ToolStateRunning(time=ToolTime(start=t)),
    }

    async def go():
        await p.upsert_session(Session(id=sid, title="states", time=SessionTime(created=t, updated=t)))
        a = AssistantMessage(id="msg_s1", session_id=sid, parent_id="msg_s0", model_id="m", time=MessageTime(created=t))
        await put(p, a)
        await put(p, None, *[ToolPart(id=f"prt_s{i}", session_id=sid, message_id=a.id, call_id=f"c{i}", tool=name,
                                       state=st) for i, (name, st) in enumerate(states.items())])

    asyncio.run(go())


@pytest.mark.parametrize("where", ["memory", "sqlite"])
def test_outcome_keep_recall_interrupt_and_na_while_unfinished(where, tmp_path):
    from we0nb import SqlPersistence

    p = MemoryPersistence()
    _states_session(p)
    if where == "sqlite":
        sp = SqlPersistence(f"sqlite:///{tmp_path / 'states.db'}")
        asyncio.run(copy_history(p, sp))
        asyncio.run(sp.close())
        p = f"sqlite:///{tmp_path / 'states.db'}"
    calls = tool_calls_df(p).set_index("tool")
    got = {k: (None if pd.isna(v) else v) for k, v in calls["outcome"].astype(object).items()}
    assert got == {"kept": "keep", "failed": "keep", "recalled": "recall", "recalled_failed": "recall",
                   "interrupted": "interrupt", "pending": None, "running": None, "running_recall": None}
    assert list(calls["outcome"].cat.categories) == ["keep", "recall", "interrupt", "reconciled", "in_doubt"]


def test_outcome_of_the_scripted_runs(backend):
    calls = tool_calls_df(backend)
    by = {(r.session_id, r.tool): r.outcome for r in calls.itertuples()}
    assert by[("ses_b", "slow_read")] == "recall" and by[("ses_b", "send")] == "interrupt"
    assert by[("ses_c", "strict")] == "keep" and by[("ses_c", "lookup")] == "interrupt"
    assert by[("ses_a", "boom")] == "keep"
    assert by[("ses_d", "slow_read")] == "in_doubt"  # (interrupted by a new prompt while it was running)


# --------------------------------------------------------------------------- NUL characters


NUL = {"title": "ti\x00tle", "user": "a\x00b", "reasoning": "r\x00", "text": "\x00lead", "error": "err\x00or",
       "input": {"q": "x\x00y"}, "output": "o\x00ut", "tool_error": "e\x00rr", "meta": {"note": "m\x00d"},
       "summary": "s\x00um"}


def _nul_history() -> MemoryPersistence:
    """Every free-text value a frame shows, holding a NUL character."""
    from we0nb.messages import MessageError, ReasoningPart, ToolPart, ToolStateCompleted, ToolStateError, ToolTime

    p, sid, t = MemoryPersistence(), "ses_nul", OLD + 200

    async def go():
        await p.upsert_session(Session(id=sid, title=NUL["title"], time=SessionTime(created=t, updated=t + 5)))
        u = UserMessage(id="msg_n0", session_id=sid, time=MessageTime(created=t))
        await put(p, u)
        await put(p, None, TextPart(id="prt_n0", session_id=sid, message_id=u.id, text=NUL["user"]))
        a = AssistantMessage(id="msg_n1", session_id=sid, parent_id=u.id, model_id="m", summary=True,
                             time=MessageTime(created=t + 1, completed=t + 4),
                             error=MessageError(reason="ModelError", message=NUL["error"]))
        await put(p, a)
        tt = ToolTime(start=t + 2, end=t + 3)
        await put(p, None, *[
            ReasoningPart(id="prt_n1", session_id=sid, message_id=a.id, text=NUL["reasoning"]),
            TextPart(id="prt_n2", session_id=sid, message_id=a.id, text=NUL["text"]),
            ToolPart(id="prt_n3", session_id=sid, message_id=a.id, call_id="c1", tool="look",
                     state=ToolStateCompleted(input=NUL["input"], output=NUL["output"], metadata=NUL["meta"], time=tt)),
            ToolPart(id="prt_n4", session_id=sid, message_id=a.id, call_id="c2", tool="look",
                     state=ToolStateError(input={}, error=NUL["tool_error"], time=tt)),
            CompactionPart(id="prt_n5", session_id=sid, message_id=a.id, summary=NUL["summary"], time=t + 4),
            TextPart(id="prt_n6", session_id=sid, message_id=a.id, text="plain"),
        ])

    asyncio.run(go())
    return p


def _write_rows(engine, src: MemoryPersistence) -> None:
    """Rows as SqlPersistence lays them out, but with the flat text columns stripped of NUL (as a
    NUL-safe flattening for PostgreSQL may store them): the frames must read the document."""
    from we0nb.persistence.sql import tables as S

    def flat(row):
        return {k: v.replace("\x00", "") if isinstance(v, str) else v for k, v in row.items()}

    async def rows():
        out = []
        for s in await src.list_sessions():
            out.append((S.sessions, flat({"id": s.id, "title": s.title, "created": s.time.created,
                                          "updated": s.time.updated, "revert_message_id": None}) | {
                "data": s.model_dump_json()}))
            for m in (await src.load_transcript(s.id)).messages:
                out.append((S.messages, flat(S.message_columns(m.info)) | {"data": m.info.model_dump_json()}))
                out += [(S.parts, flat(S.part_columns(pt)) | {"data": pt.model_dump_json()}) for pt in m.parts]
        return out

    with engine.begin() as conn:
        for table, row in asyncio.run(rows()):
            conn.execute(table.insert().values(**row))


@pytest.fixture
def pg_schema():
    if PG_URL is None:
        pytest.skip(PG_SKIP)
    from we0nb import SqlPersistence

    schema = f"we0frames_{uuid.uuid4().hex[:10]}"
    sp = SqlPersistence(PG_URL, schema=schema)
    try:
        yield sp
    finally:
        asyncio.run(sp.close())
        _pg_admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("where", ["sqlite_store", "sqlite_rows", "postgres_rows"])
def test_nul_characters_read_whole_on_every_backend(where, tmp_path, request):
    from we0nb import SqlPersistence

    src = _nul_history()
    if where == "sqlite_store":  # written by SqlPersistence itself
        store = SqlPersistence(f"sqlite:///{tmp_path / 'nul.db'}")
        asyncio.run(copy_history(src, store))
    elif where == "sqlite_rows":
        store = SqlPersistence(f"sqlite:///{tmp_path / 'nul.db'}")
        _write_rows(store.sync_engine(), src)
    else:
        store = request.getfixturevalue("pg_schema")
        _write_rows(store.sync_engine(), src)
    try:
        for name, fn in VIEWS.items():
            pd.testing.assert_frame_equal(fn(store), fn(src), check_exact=True, obj=name)
        pd.testing.assert_frame_equal(session_summary(store), session_summary(src), check_exact=True)
    finally:
        if where != "postgres_rows":
            asyncio.run(store.close())
    texts = parts_df(src)["text"].dropna().tolist()
    assert [NUL["user"], NUL["reasoning"], NUL["text"]] == texts[:3] and NUL["summary"] in texts
    calls = tool_calls_df(src)
    assert calls["output"].iloc[0] == NUL["output"] and calls["error"].iloc[1] == NUL["tool_error"]
    assert json.loads(calls["input"].iloc[0]) == NUL["input"] and json.loads(calls["metadata"].iloc[0]) == NUL["meta"]
    assert sessions_df(src)["title"].iloc[0] == NUL["title"]
    assert messages_df(src)["error_message"].iloc[1] == NUL["error"]


# --------------------------------------------------------------------------- corrupt rows


def _corrupt(engine, part_ids: list[str]) -> None:
    import sqlalchemy as sa

    from we0nb.persistence.sql import tables as S

    with engine.begin() as conn:
        conn.execute(sa.update(S.parts).where(S.parts.c.id.in_(part_ids)).values(data='{"id": "broken'))
        conn.execute(sa.update(S.messages).values(data="not json"))  # only a message's cost is read off it


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_a_corrupt_row_is_named_and_the_rest_is_read(where, memory, tmp_path, request):
    from we0nb import SqlPersistence

    if where == "sqlite":
        store = SqlPersistence(f"sqlite:///{tmp_path / 'corrupt.db'}")
    else:
        store = request.getfixturevalue("pg_schema")
    asyncio.run(copy_history(memory, store))
    parts, calls = parts_df(memory), tool_calls_df(memory)
    text_id = parts.loc[parts["text"] == "Hello wörld 🌍", "part_id"].iloc[0]
    call = calls[calls["tool"] == "lookup"].iloc[0]
    _corrupt(store.sync_engine(), [text_id, call["part_id"]])
    try:
        with pytest.warns(RuntimeWarning) as got:
            p2 = parts_df(store)
        (w,) = got
        msg = str(w.message)
        assert "parts_df: 1 corrupt record in" in msg and repr(text_id) in msg and "'ses_a'" in msg
        assert repr(parts.loc[parts["part_id"] == text_id, "message_id"].iloc[0]) in msg
        assert "we0_parts: its JSON does not parse" in msg and w.filename == __file__
        expected = parts.copy()
        expected.loc[expected["part_id"] == text_id, "text"] = pd.NA
        pd.testing.assert_frame_equal(p2, expected, check_exact=True)

        with pytest.warns(RuntimeWarning, match=f"tool_calls_df: 1 corrupt record in .*{call['part_id']}"):
            c2 = tool_calls_df(store)
        expected = calls.copy()
        for col in ("input", "output", "error", "metadata"):
            expected.loc[expected["part_id"] == call["part_id"], col] = pd.NA
        expected.loc[expected["part_id"] == call["part_id"], "attempts"] = 0  # (its metadata is unreadable)
        pd.testing.assert_frame_equal(c2, expected, check_exact=True)
        with pytest.warns(RuntimeWarning):
            pd.testing.assert_frame_equal(session_summary(store), session_summary(memory), check_exact=True)
        # a message's flat columns are read whole; only its cost is in its (corrupt) document: NaN, and named
        with pytest.warns(RuntimeWarning, match="messages_df: 15 corrupt records in .*we0_messages: its JSON does not"):
            m2 = messages_df(store)
        pd.testing.assert_frame_equal(m2, messages_df(memory).assign(cost=float("nan")), check_exact=True)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pd.testing.assert_frame_equal(tool_calls_df(store, "ses_b"), tool_calls_df(memory, "ses_b"))
    finally:
        if where == "sqlite":
            asyncio.run(store.close())


# --------------------------------------------------------------------------- databases that cannot be read


def _engine_error(url: str) -> str:
    """What SqlPersistence itself raises on ``url`` (the wording the frames must match)."""
    from we0nb import PersistenceError, SqlPersistence

    sp = SqlPersistence(url)
    try:
        with pytest.raises(PersistenceError) as e:
            asyncio.run(sp.list_sessions())
        return str(e.value)
    finally:
        asyncio.run(sp.close())


def test_unreadable_sqlite_files_raise_the_engines_persistence_error(tmp_path):
    import sqlalchemy as sa

    from we0nb import PersistenceError, SqlPersistence

    notdb = tmp_path / "notes.db"
    notdb.write_text("these are notes, not a database\n" * 200)
    cases = {
        "not a database": f"sqlite:///{notdb}",
        "a folder": f"sqlite:///{tmp_path}",
        "missing folder": f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}",
    }
    for cause, url in cases.items():
        expected = _engine_error(url)
        for source in (url, SqlPersistence(url)):
            with pytest.raises(PersistenceError) as e:
                tool_calls_df(source)
            assert str(e.value) == expected, cause
            if cause != "missing folder":
                assert isinstance(e.value.__cause__, (sqlite3.Error, sa.exc.DBAPIError)), cause
            if not isinstance(source, str):
                asyncio.run(source.close())
    eng = sa.create_engine(f"sqlite:///{notdb}")
    try:
        with pytest.raises(PersistenceError, match="file is not a database"):
            sessions_df(eng)
    finally:
        eng.dispose()


def test_a_missing_sqlite_file_is_refused_never_created(tmp_path):
    from we0nb import PersistenceError

    missing = tmp_path / "missing.db"
    for url in (f"sqlite:///{missing}", f"sqlite:///file:{missing}?mode=ro&uri=true",
                f"sqlite+aiosqlite:///{missing}"):
        with pytest.raises(PersistenceError, match=f"Cannot open the SQLite database .*there is no file '{missing}'"):
            parts_df(url)
    assert list(tmp_path.iterdir()) == []


def test_a_url_of_another_database_or_none_at_all_is_refused_as_sqlpersistence_refuses_it():
    from we0nb import PersistenceError, SqlPersistence

    for url in ("notaurl://x", "mysql://u@localhost/db", "mysql+aiomysql://u@h/db"):  # (no driver error leaks)
        for read in (sessions_df, tool_calls_df, parts_df, lambda u: SqlPersistence(u)):
            with pytest.raises(PersistenceError, match="supports SQLite and PostgreSQL, not 'm?[a-z]+'"):
                read(url)
    for read in (sessions_df, lambda u: SqlPersistence(u)):  # a URL that does not parse: its password hidden
        with pytest.raises(ValueError, match="is not a database URL") as e:
            read("postgresql://me:s3cret@h:notaport/db")
        assert "s3cret" not in str(e.value) and "me:***@h" in str(e.value)


def test_a_read_only_database_is_read(sqlite_db, memory, tmp_path):
    """``mode=ro`` opens the file read-only whoever runs the test (root too): reading needs no write."""
    from we0nb import PersistenceError, SqlPersistence

    path = make_url(sqlite_db.url).database
    ro = f"sqlite:///file:{path}?mode=ro&uri=true"
    ro_store = SqlPersistence(ro)
    try:
        for fn in VIEWS.values():
            pd.testing.assert_frame_equal(fn(ro), fn(memory), check_exact=True)
            pd.testing.assert_frame_equal(fn(ro_store), fn(memory), check_exact=True)
    finally:
        asyncio.run(ro_store.close())
    empty = tmp_path / "empty.db"  # a database file without tables: SqlPersistence must write to use it
    empty.touch()
    ro_empty = f"sqlite:///file:{empty}?mode=ro&uri=true"
    expected = _engine_error(ro_empty)
    assert "read-only" in expected
    store = SqlPersistence(ro_empty)
    try:
        with pytest.raises(PersistenceError) as e:
            sessions_df(store)
        assert str(e.value) == expected and e.value.__cause__ is not None
    finally:
        asyncio.run(store.close())
    with pytest.raises(ValueError, match="no we0nb tables"):
        sessions_df(ro_empty)  # a URL is read as it is: nothing to read there


def test_postgres_connection_failure_is_a_persistence_error():
    if PG_URL is None:
        pytest.skip(PG_SKIP)
    from we0nb import PersistenceError

    url = make_url(PG_URL).set(database=f"we0nb_missing_{uuid.uuid4().hex[:8]}", password="s3cret")
    with pytest.raises(PersistenceError, match="Cannot reach the database") as e:  # the engine's words
        tool_calls_df(url.render_as_string(hide_password=False))
    assert "s3cret" not in str(e.value) and e.value.__cause__ is not None


def test_a_lone_surrogate_escape_edited_into_a_document_shows_as_a_replacement(pg):
    """The engine repairs lone surrogates before it writes (we0nb._text); a row edited by hand can
    still hold the escape ``\\udc00``: PostgreSQL hands it over as is, and the frame shows U+FFFD
    (it raised UnicodeEncodeError from pyarrow)."""
    import asyncio

    @tool(side_effects=False)
    def look(q: str) -> str:
        return "seen"

    store = pg.fresh()
    agent = We0Agent(ScriptedModel([[tool_call("look", {"q": "x"})], [text("done")]]), tools=[look],
                     persistence=store)
    asyncio.run(agent.invoke(session_id="s", messages=[user_message("hi")]))
    pg.raw("UPDATE we0_parts SET data = replace(data, '\"seen\"', '\"\\udc00!\"') WHERE type = 'tool'")
    df = tool_calls_df(store, session_id="s")
    assert df["output"].tolist() == ["\ufffd!"]

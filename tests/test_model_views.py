"""Stored model views: a cold start reads the older messages as views, never a stale one.

The invariants: every non-NULL ``model_view`` equals the view made from the message's
rows as they are now; a run that starts from ``load_recent`` sends the model exactly
the history a run from the full transcript would; writing a part or the message again
drops the view; databases of schema versions 1 and 2 are upgraded and still load.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sql_support import backend_for, put, sqlite_raw
from we0nb import (
    MemoryPersistence, ScriptedModel, SqlPersistence, TextPart, We0Agent, text, tool, tool_call, tool_calls_df,
    user_message,
)
from we0nb.errors import We0Error
from we0nb.engine.history import HistoryCache, convert, to_model_messages
from we0nb.models.base import AssistantTurn, ReasoningBlock, ToolCall, ToolResult, UserTurn
from we0nb.models.view import dump_view, load_views
from we0nb.persistence.sql import tables as S
from we0nb.persistence.base import recent_start
from we0nb.testing import reasoning, usage


# --------------------------------------------------------------------------- the codec and the rule


def test_views_round_trip_every_item_kind() -> None:
    items = [UserTurn("hé ✓"), AssistantTurn("a", "think", [ToolCall("c1", "read", {"p": [1, {"q": None}]})]),
             ToolResult("c1", "read", "out", False), ToolResult("c2", "x", "boom", True), AssistantTurn("only text")]
    one, two = dump_view(items[:2]), dump_view(items[2:])
    assert load_views([one, two]) == items
    assert load_views([]) == []
    for bad in (["{not json"], ['[["z", 1]]'], ['[["a"]]']):
        with pytest.raises(ValueError, match="model view"):
            load_views(bad)


def test_a_view_is_the_compact_json_text_and_keeps_what_json_keeps() -> None:
    """The view's text is what ``json.dumps(ensure_ascii=False, separators=(",", ":"))`` writes
    (views stored by either encoder read alike), NaN and infinities included."""
    import json
    import math

    args = {"x": float("nan"), "y": float("inf"), "big": 10**20, "f": 1e300, "s": 'é\u2028"\\\n日本', "n": None}
    items = [UserTurn('q "é"\n'), AssistantTurn("", "", [ToolCall("c1", "f", args)]), ToolResult("c1", "f", "", True)]
    view = dump_view(items)
    expected = [["u", 'q "é"\n'], ["a", "", "", [["c1", "f", args]]], ["t", "c1", "f", "", 1]]
    assert view == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    back = load_views([view])
    got = back[1].tool_calls[0].input  # type: ignore[union-attr]
    assert math.isnan(got["x"]) and got["y"] == math.inf and got["big"] == 10**20 and got["s"] == args["s"]


def test_views_keep_reasoning_blocks_and_read_views_written_before_them() -> None:
    turn = AssistantTurn("t", "ab", [ToolCall("c1", "read", {})],
                         reasoning_blocks=[ReasoningBlock("ab", "S1"), ReasoningBlock("", None, "R")])
    view = dump_view([turn])
    assert load_views([view]) == [turn]
    assert dump_view([AssistantTurn("t", "ab")]) == '[["a","t","ab",[]]]'  # no blocks: the old format
    old = '[["a","t","think",[["c1","read",{}]]]]'  # a view stored before reasoning blocks existed
    assert load_views([old]) == [AssistantTurn("t", "think", [ToolCall("c1", "read", {})])]


@pytest.mark.parametrize("roles,summary,views,expected", [
    ([], [], [], (0, 0)),
    (["user"], [0], [1], (0, 0)),
    (["user", "assistant"], [0, 0], [1, 1], (0, 0)),
    # the previous answer (index 1) and everything after it load as objects
    (["user", "assistant", "user", "assistant"], [0] * 4, [1] * 4, (0, 1)),
    (["user", "assistant", "user", "assistant", "assistant"], [0] * 5, [1, 1, 1, 1, 0], (0, 1)),
    # a summary between the previous answer and the last user message stays an object too
    (["user", "assistant", "assistant", "user", "assistant"], [0, 0, 1, 0, 0], [1] * 5, (0, 1)),
    # a summary before the recent messages: the model sees from it on
    (["user", "assistant", "assistant", "user", "assistant", "user"], [0, 0, 1, 0, 0, 0], [1] * 6, (2, 4)),
    # a message without a view moves the start back to it
    (["user", "assistant", "user", "assistant", "user", "assistant"], [0] * 6, [1, 0, 1, 1, 1, 1], (0, 1)),
    (["user", "assistant", "user", "assistant", "user", "assistant"], [0] * 6, [0] * 6, (0, 0)),
])
def test_recent_start(roles, summary, views, expected) -> None:
    assert recent_start(roles, [bool(x) for x in summary], [bool(x) for x in views]) == expected


async def test_memory_has_no_views_and_loads_everything() -> None:
    p = MemoryPersistence()
    agent = We0Agent(ScriptedModel([[text("one")], [text("two")]]), persistence=p)
    for q in ("a", "b"):
        await agent.invoke(mode="prompt", session_id="s", messages=[user_message(q)])
    recent = await p.load_recent("s")
    assert recent.earlier == [] and len(recent.messages) == 4
    assert (await p.load_recent("missing")).session is None


# --------------------------------------------------------------------------- backends


@pytest.fixture(params=["sqlite", "sqlite-aiosqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any, str]]:
    """(make a persistence, run raw SQL, backend name) on one fresh database."""
    for b in backend_for(request.param, tmp_path):
        yield b.fresh, b.raw, b.name


def _views(raw, sid: str) -> dict[str, Any]:
    return dict(raw(f"SELECT id, model_view FROM we0_messages WHERE session_id = '{sid}' ORDER BY id"))


async def _assert_views_exact(p: SqlPersistence, raw, sid: str) -> None:
    """Every stored view is the view of the message as its rows are now."""
    tr = await p.load_transcript(sid)
    views = _views(raw, sid)
    for m in tr.messages:
        stored = views[m.info.id]
        if stored is not None:
            assert stored == dump_view(convert(m)), m.info.id


async def _assert_cold_start_equal(p: SqlPersistence, sid: str) -> Any:
    recent = await p.load_recent(sid)
    full = await p.load_transcript(sid)
    assert recent.session == full.session
    assert HistoryCache(recent.earlier).build(recent.messages) == to_model_messages(full.messages)
    assert [m.info.id for m in recent.messages] == [m.info.id for m in full.messages[-len(recent.messages):]] \
        if recent.messages else True
    return recent


def _fetch_tool(log: list):
    @tool(side_effects=False)
    async def fetch(url: str) -> str:
        log.append(url)
        return f"page of {url}"
    return fetch


async def test_final_messages_carry_views_and_a_cold_start_uses_them(db) -> None:
    make, raw, _ = db
    p = make()
    log: list = []
    steps = []
    for i in range(5):
        steps += [[reasoning("hm"), text(f"fetching {i}"), tool_call("fetch", {"url": f"u{i}"})], [text(f"done {i}")]]
    agent = We0Agent(ScriptedModel(steps), tools=[_fetch_tool(log)], persistence=p)
    for i in range(5):
        await agent.invoke(mode="prompt", session_id="s", messages=[user_message(f"q{i}")])
    views = _views(raw, "s")
    assert len(views) == 15 and all(v is not None for v in views.values())
    await _assert_views_exact(p, raw, "s")

    q = make()  # a cold start: a new persistence on the same database
    recent = await _assert_cold_start_equal(q, "s")
    assert len(recent.messages) == 4  # previous answer, the last user message, its two steps
    assert len(recent.earlier) == 3 * 4 + 3  # turns 0-2 (user, call, result, answer), then q3 and its call
    model = ScriptedModel([[text("more")]])
    cold = We0Agent(model, tools=[_fetch_tool(log)], persistence=q)
    await cold.invoke(mode="prompt", session_id="s", messages=[user_message("q5")])
    full = await q.load_transcript("s")
    assert model.requests[0].messages == to_model_messages(full.messages[:-1])


async def test_writing_a_part_or_the_message_again_drops_its_view(db) -> None:
    make, raw, _ = db
    p = make()
    agent = We0Agent(ScriptedModel([[text("hello")], [text("again")]]), persistence=p)
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("hi")])
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("and?")])
    tr = await p.load_transcript("s")
    first_user, first_answer = tr.messages[0], tr.messages[1]
    assert _views(raw, "s")[first_answer.info.id] is not None
    text_part = first_answer.parts[1]
    text_part.text = "edited behind the engine's back"
    await put(p, None, text_part)  # a part of a final message rewritten: its view goes
    views = _views(raw, "s")
    assert views[first_answer.info.id] is None and views[first_user.info.id] is not None
    await put(p, first_user.info)  # the message rewritten without a view: gone too
    assert _views(raw, "s")[first_user.info.id] is None
    # a cold start now loads those messages as objects: the edit reaches the model
    recent = await _assert_cold_start_equal(make(), "s")
    assert recent.earlier == [] and len(recent.messages) == 4
    assert any(getattr(x, "text", "") == "edited behind the engine's back"
               for x in HistoryCache(recent.earlier).build(recent.messages))


async def test_a_damaged_view_is_ignored_with_a_warning(db, caplog: pytest.LogCaptureFixture) -> None:
    make, raw, _ = db
    p = make()
    agent = We0Agent(ScriptedModel([[text("a")], [text("b")], [text("c")]]), persistence=p)
    for q in ("1", "2", "3"):
        await agent.invoke(mode="prompt", session_id="s", messages=[user_message(q)])
    first = next(iter(_views(raw, "s")))
    raw(f"UPDATE we0_messages SET model_view = '[[\"u\"' WHERE id = '{first}'")
    with caplog.at_level(logging.WARNING, logger="we0nb.persistence.sql"):
        recent = await _assert_cold_start_equal(make(), "s")
    assert recent.earlier == [] and len(recent.messages) == 6
    assert "ignoring the stored model views of session 's'" in caplog.text


async def test_schema_version_1_is_upgraded_in_place_and_still_loads(db) -> None:
    make, raw, name = db
    p = make()
    agent = We0Agent(ScriptedModel([[text("a")], [text("b")]]), persistence=p)
    for q in ("1", "2"):
        await agent.invoke(mode="prompt", session_id="s", messages=[user_message(q)])
    await p.close()
    # turn the database back into what version 1 wrote: no column, no trigger, a full tool index
    raw("CREATE INDEX ix_we0_parts_tool ON we0_parts (type, tool, status)")
    if name == "postgres":
        raw("DROP TRIGGER we0_parts_view ON we0_parts")
        raw("DROP FUNCTION we0_parts_view_stale()")
    else:
        raw("DROP TRIGGER we0_parts_view_insert")
        raw("DROP TRIGGER we0_parts_view_update")
    raw("ALTER TABLE we0_messages DROP COLUMN model_view")
    _as_version_2_session_ids(raw, name)
    raw("UPDATE we0_meta SET value = '1' WHERE key = 'schema_version'")

    q = make()
    recent = await _assert_cold_start_equal(q, "s")  # opens, upgrades, loads every message as an object
    assert raw("SELECT value FROM we0_meta WHERE key = 'schema_version'") == [(str(S.SCHEMA_VERSION),)]
    assert _index_names(raw, name) == PARTS_INDEXES  # (2 made the tool index partial, 9 dropped it)
    assert recent.earlier == [] and len(recent.messages) == 4
    agent = We0Agent(ScriptedModel([[text("c")]]), persistence=q)
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("3")])
    views = list(_views(raw, "s").values())
    assert views[:4] == [None] * 4 and None not in views[4:]  # new final messages have views again
    await _assert_views_exact(q, raw, "s")
    # the trigger is back too
    tr = await q.load_transcript("s")
    await put(q, None, tr.messages[-1].parts[-1])
    assert _views(raw, "s")[tr.messages[-1].info.id] is None
    await _assert_long_session_ids_work(q, raw, name)
    await q.close()


_SESSION_ID_COLUMNS = [("we0_sessions", "id"), ("we0_messages", "session_id"), ("we0_parts", "session_id"),
                       ("we0_leases", "session_id")]


def _as_version_2_session_ids(raw, name: str) -> None:
    """Session-id columns as versions 1 and 2 made them: varchar(64) (SQLite does not enforce lengths)."""
    if name == "postgres":
        for table, column in _SESSION_ID_COLUMNS:
            raw(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE VARCHAR(64)")


async def _assert_long_session_ids_work(p: SqlPersistence, raw, name: str) -> None:
    if name == "postgres":
        widths = raw("SELECT table_name, column_name, character_maximum_length FROM information_schema.columns "
                     "WHERE table_schema = current_schema() AND (column_name = 'session_id' OR "
                     "(table_name = 'we0_sessions' AND column_name = 'id'))")
        # (schema 4: the batch items too; 7: the scores)
        every = [*_SESSION_ID_COLUMNS, ("we0_batch_items", "session_id"), ("we0_scores", "session_id")]
        assert sorted(widths) == sorted((t, c, S.SESSION_ID_MAX) for t, c in every)
    long_id = "s" * S.SESSION_ID_MAX
    agent = We0Agent(ScriptedModel([[text("long")]]), persistence=p)
    await agent.invoke(mode="prompt", session_id=long_id, messages=[user_message("hi")])
    assert len((await p.load_transcript(long_id)).messages) == 2


async def test_schema_version_2_is_upgraded_in_place_and_takes_long_session_ids(db) -> None:
    make, raw, name = db
    p = make()
    agent = We0Agent(ScriptedModel([[text("a")], [text("b")]]), persistence=p)
    for q in ("1", "2"):
        await agent.invoke(mode="prompt", session_id="s", messages=[user_message(q)])
    await p.close()
    _as_version_2_session_ids(raw, name)  # what version 2 wrote
    raw("UPDATE we0_meta SET value = '2' WHERE key = 'schema_version'")

    q = make()
    assert [s.id for s in await q.list_sessions()] == ["s"]  # opens and upgrades
    assert raw("SELECT value FROM we0_meta WHERE key = 'schema_version'") == [(str(S.SCHEMA_VERSION),)]
    assert S.SCHEMA_VERSION == 9  # (4: the batch tables; 5: PostgreSQL's static part trigger; 6: the claim index;
    # 7: the claim token; 8: the scores table; 9: no tool index)
    assert len((await q.load_recent("s")).earlier) == 1  # the views of version 2 are still used
    await _assert_long_session_ids_work(q, raw, name)
    await q.close()


#: the indexes of we0_parts since schema 9: its key, and the session's
PARTS_INDEXES = ["ix_we0_parts_session"]


def _index_names(raw, name: str) -> list[str]:
    """The named indexes of we0_parts (not the key's own)."""
    if name == "postgres":
        rows = raw("SELECT indexname FROM pg_indexes WHERE tablename = 'we0_parts' AND schemaname = current_schema()")
    else:
        rows = raw("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'we0_parts'")
    return sorted(r[0] for r in rows if r[0].startswith("ix_"))


@tool(side_effects=False)
def echo(x: int) -> str:
    return str(x)


async def test_schema_version_8_loses_its_tool_index_and_its_tool_calls_still_read(db) -> None:
    """Schema 9: a tool part write no longer maintains a tool index (no query used it); a
    database of schema 8 has its index dropped on opening, and reads and writes on."""
    make, raw, name = db
    p = make()
    agent = We0Agent(ScriptedModel([[tool_call("echo", {"x": 1})], [text("a")]]), tools=[echo], persistence=p)
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("1")])
    await p.close()
    assert _index_names(raw, name) == PARTS_INDEXES  # a new database never has it
    raw("CREATE INDEX ix_we0_parts_tool ON we0_parts (tool, status) WHERE type = 'tool'")  # what 8 had
    raw("UPDATE we0_meta SET value = '8' WHERE key = 'schema_version'")

    q = make()
    assert [s.id for s in await q.list_sessions()] == ["s"]  # opens and upgrades
    assert _index_names(raw, name) == PARTS_INDEXES
    assert raw("SELECT value FROM we0_meta WHERE key = 'schema_version'") == [(str(S.SCHEMA_VERSION),)]
    agent = We0Agent(ScriptedModel([[tool_call("echo", {"x": 2})], [text("b")]]), tools=[echo], persistence=q)
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("2")])
    calls = await asyncio.to_thread(tool_calls_df, q, "s")  # (a blocking read, off the loop)
    assert list(calls["tool"]) == ["echo", "echo"] and list(calls["status"]) == ["completed", "completed"]
    assert list(calls["output"]) == ["1", "2"]
    await q.close()


# --------------------------------------------------------------------------- any history


def _turn_steps(draw_turn: list[list[int]]) -> list[list]:
    """A turn's steps; from the second step on, usage crosses a 0.5 × 200-token threshold."""
    steps = []
    n = 0
    for k, calls in enumerate(draw_turn):
        items: list = [text("t ")]
        for c in calls:
            items.append(tool_call("fetch" if c < 2 else "flaky", {"url": f"x{n}"}))
            n += 1
        items.append(usage(input_tokens=60 * (k + 1), output_tokens=5))
        steps.append(items)
    return steps


turns = st.lists(st.lists(st.lists(st.integers(0, 3), max_size=2), min_size=1, max_size=3), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                HealthCheck.function_scoped_fixture])
@given(script=turns, abort_at=st.one_of(st.none(), st.integers(0, 30)), compact=st.booleans(),
       resume_first=st.booleans())
def test_any_history_cold_starts_to_the_same_model_request(script, abort_at, compact, resume_first) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_any_history(Path(tmp), script, abort_at, compact, resume_first))


async def _any_history(tmp: Path, script, abort_at, compact, resume_first) -> None:
    url = f"sqlite:///{tmp / 'we0.db'}"
    raw = sqlite_raw(tmp / "we0.db")
    log: list = []

    @tool(side_effects=False)
    def flaky(url: str) -> str:
        raise RuntimeError(f"cannot fetch {url}")

    tools = [_fetch_tool(log), flaky]
    p = SqlPersistence(url)
    kw: dict[str, Any] = {"compaction_threshold": 0.5} if compact else {}
    events = 0
    for i, turn in enumerate(script):
        steps = _turn_steps(turn) + [[text("summary of it all"), usage(input_tokens=5, output_tokens=3)]]
        steps += [[text(f"answer {i}"), usage(input_tokens=5, output_tokens=2)]] * 3
        agent = We0Agent(ScriptedModel(steps, context_window=200), tools=tools, persistence=p, **kw)
        abort = asyncio.Event()
        try:  # any outcome: what matters is what was stored
            async for _ in agent.stream(mode="prompt", session_id="s", messages=[user_message(f"turn {i}")],
                                        abort=abort):
                events += 1
                if abort_at is not None and events == abort_at:
                    abort.set()
        except (asyncio.CancelledError, We0Error):
            pass
        if compact:
            event("compacted" if any(m.info.role == "assistant" and m.info.summary
                                     for m in (await p.load_transcript("s")).messages) else "not compacted")
        if resume_first and i % 2:
            agent = We0Agent(ScriptedModel([[text("resumed")]] * 3), tools=tools, persistence=p, **kw)
            try:
                await agent.invoke(mode="resume", session_id="s")
            except We0Error:
                pass
        await _assert_views_exact(p, raw, "s")
        cold = SqlPersistence(url)
        await _assert_cold_start_equal(cold, "s")
        await cold.close()
    await p.close()


_DYNAMIC_V4_TRIGGER = (
    "CREATE OR REPLACE FUNCTION we0_parts_view_stale() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "EXECUTE 'UPDATE ' || quote_ident(TG_TABLE_SCHEMA) || '.we0_messages SET model_view = NULL "
    "WHERE id = $1 AND model_view IS NOT NULL' USING NEW.message_id; RETURN NULL; END $$")


@pytest.fixture
def pg_backend(tmp_path: Path) -> Iterator[Any]:
    yield from backend_for("postgres", tmp_path)


@pytest.mark.postgres
async def test_schema_version_4_on_postgresql_gets_the_static_part_trigger(pg_backend: Any) -> None:
    """Version 5: the part trigger's UPDATE is a static statement (planned once per connection),
    named in the trigger's own schema; a version 4 database (dynamic SQL) is upgraded in place."""
    b = pg_backend
    p = b.fresh()
    agent = We0Agent(ScriptedModel([[text("hello")]]), persistence=p)
    await agent.invoke(mode="prompt", session_id="s", messages=[user_message("hi")])
    await p.close()
    source = ("SELECT prosrc FROM pg_proc WHERE proname = 'we0_parts_view_stale' "
              "AND pronamespace = current_schema()::regnamespace")
    assert "EXECUTE" not in b.raw(source)[0][0] and ".we0_messages" in b.raw(source)[0][0]
    b.raw(_DYNAMIC_V4_TRIGGER)  # what version 4 made
    b.raw("UPDATE we0_meta SET value = '4' WHERE key = 'schema_version'")

    q = b.fresh()
    tr = await q.load_transcript("s")  # opens and upgrades
    assert b.raw("SELECT value FROM we0_meta WHERE key = 'schema_version'") == [(str(S.SCHEMA_VERSION),)]
    assert "EXECUTE" not in b.raw(source)[0][0]
    answer = tr.messages[1]
    assert _views(b.raw, "s")[answer.info.id] is not None
    part = next(x for x in answer.parts if isinstance(x, TextPart))
    part.text = "edited"
    await put(q, None, part)  # the static trigger still drops the view
    assert _views(b.raw, "s")[answer.info.id] is None
    await q.close()

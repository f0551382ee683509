"""SqlPersistence: an agent's runs on every store, SQL specifics, clear errors. The port's own
contract is the conformance suite's (test_store_conformance.py, we0nb.persistence.conformance).

Backends: memory (the reference), SQLite inline (default), SQLite through aiosqlite
(``inline_sqlite=False``), SQLite through an AsyncEngine passed in, PostgreSQL (psycopg 3,
``WE0NB_TEST_POSTGRES_URL``, a throw-away schema per test).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text as sql_text

from sql_support import PG_URL, Backend, backend_for, pg_execute, pg_schema, put  # noqa: F401
from we0nb import (
    AssistantMessage,
    CompactionPart,
    CorruptRecordError,
    PersistenceError,
    ReasoningPart,
    SchemaVersionError,
    ScriptedModel,
    Session,
    SessionBusyError,
    SqlPersistence,
    StepFinishPart,
    StepStartPart,
    TextPart,
    ToolPart,
    ToolStateCompleted,
    ToolStateError,
    ToolStatePending,
    ToolStateRunning,
    Usage,
    UserMessage,
    We0Agent,
    text,
    tool,
    tool_call,
    user_message,
)
from we0nb._ids import new_id
from we0nb.messages import MessageError, MessageTime, PartTime, SessionTime, ToolTime
from we0nb.persistence.sql import tables as S
from we0nb.persistence.sql.inline import InlineSqlite


# --------------------------------------------------------------------------- backends


STORES = ["memory", "sqlite", "sqlite-aiosqlite", "sqlite-engine", pytest.param("postgres", marks=pytest.mark.postgres)]
SQL_STORES = STORES[1:]


# --------------------------------------------------------------------------- fixtures of data


def _session(sid: str, title: str = "t") -> Session:
    return Session(id=sid, title=title, time=SessionTime(created=1.5, updated=2.25))


def _history(sid: str) -> tuple[list[Any], list[Any]]:
    """A user message and an assistant message with one part of every kind and tool state."""
    u = UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=10.0))
    a = AssistantMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=11.0, completed=19.0),
                         parent_id=u.id, model_id="m-1", finish_reason="tool-calls",
                         usage=Usage(input_tokens=10, output_tokens=5, reasoning_tokens=2, cached_tokens=1),
                         error=MessageError(reason="R", message="why", metadata={"k": [1, 2]}))
    mk = dict(session_id=sid, message_id=a.id)
    parts = [
        TextPart(id=new_id("prt"), session_id=sid, message_id=u.id, text="hi ünïcode ✓", time=PartTime(start=10.0, end=10.0)),
        StepStartPart(id=new_id("prt"), time=11.0, **mk),
        ReasoningPart(id=new_id("prt"), text="hmm", time=PartTime(start=11.1), **mk),
        TextPart(id=new_id("prt"), text="let me look", time=PartTime(start=11.2, end=11.3), **mk),
        ToolPart(id=new_id("prt"), call_id="c1", tool="read", state=ToolStatePending(input={"p": "x"}), **mk),
        ToolPart(id=new_id("prt"), call_id="c2", tool="read", state=ToolStateRunning(input={"p": "y"}, time=ToolTime(start=12.0)), **mk),
        ToolPart(id=new_id("prt"), call_id="c3", tool="read",
                 state=ToolStateCompleted(input={"p": "z"}, output="Z", metadata={"recalled": True},
                                          time=ToolTime(start=12.0, end=12.5)), **mk),
        ToolPart(id=new_id("prt"), call_id="c4", tool="write",
                 state=ToolStateError(input={"p": "w"}, error="stopped", metadata={"interrupted": True, "reason": "resume"},
                                      time=ToolTime(start=13.0, end=13.5)), **mk),
        ToolPart(id=new_id("prt"), call_id="c5", tool="x", state=ToolStatePending(input={}, raw="{not json"), **mk),
        StepFinishPart(id=new_id("prt"), reason="tool-calls", usage=Usage(input_tokens=10), time=19.0, **mk),
        CompactionPart(id=new_id("prt"), summary="so far", time=19.5, **mk),
    ]
    return [u, a], parts


async def _write(p: Any, sid: str) -> tuple[list[Any], list[Any]]:
    await p.upsert_session(_session(sid))
    msgs, parts = _history(sid)
    for m in msgs:
        await put(p, m)
    await put(p, None, parts[0])
    await put(p, None, *parts[1:])
    return msgs, parts


def _dump(tr: Any) -> Any:
    return tr.model_dump(mode="json")


# --------------------------------------------------------------------------- runs on every store


async def test_agent_run_persists_and_a_fresh_instance_sees_it(backend: Backend) -> None:
    @tool(side_effects=False)
    def add(a: int, b: int) -> int:
        return a + b

    p = backend.fresh()
    model = ScriptedModel([[text("Adding now."), tool_call("add", {"a": 2, "b": 3})], [text("It is 5.")]])
    agent = We0Agent(model, tools=[add], persistence=p)
    result = await agent.invoke(mode="prompt", session_id="ses_run", messages=[user_message("2+3?")])
    assert result.result == "stop" and result.text == "It is 5."
    live = await agent.transcript("ses_run")
    again = await backend.fresh().load_transcript("ses_run")
    assert _dump(again) == _dump(live)
    tools = [x for m in again.messages for x in m.tool_parts]
    assert [(x.tool, x.state.status, x.state.output) for x in tools] == [("add", "completed", "5")]
    # resuming a finished session calls no model and writes nothing
    agent2 = We0Agent(ScriptedModel([]), tools=[add], persistence=backend.fresh())
    r2 = await agent2.invoke(mode="resume", session_id="ses_run")
    assert r2.result == "stop" and agent2.model.calls == 0


async def test_abort_then_resume_in_a_new_instance(backend: Backend) -> None:
    ran: list[str] = []
    started = asyncio.Event()

    @tool
    async def slow(x: str) -> str:
        ran.append(x)
        started.set()
        await asyncio.Event().wait()
        return "never"

    abort = asyncio.Event()
    agent = We0Agent(ScriptedModel([[text("Working."), tool_call("slow", {"x": "a"})]]), tools=[slow],
                     persistence=backend.fresh())
    task = asyncio.ensure_future(agent.invoke(abort=abort, mode="prompt", session_id="ses_ab",
                                              messages=[user_message("go")]))
    await started.wait()
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    tr = await backend.fresh().load_transcript("ses_ab")
    assert [x.state.status for m in tr.messages for x in m.tool_parts] == ["running"]
    agent2 = We0Agent(ScriptedModel([[text("Stopped.")]]), tools=[slow], persistence=backend.fresh())
    r = await agent2.invoke(mode="resume", session_id="ses_ab")
    assert r.result == "stop" and ran == ["a"]
    tr = await backend.fresh().load_transcript("ses_ab")
    (tp,) = [x for m in tr.messages for x in m.tool_parts]
    assert tp.state.status == "error" and tp.state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()


# --------------------------------------------------------------------------- SQL specifics


async def test_flattened_columns(sql: Backend) -> None:
    p = sql.fresh()
    sid = new_id("ses")
    msgs, parts = await _write(p, sid)
    assert sql.raw is not None
    m = {r[0]: r[1:] for r in sql.raw(
        "SELECT id, role, created, completed, parent_id, model_id, finish_reason, error_reason, error_message, "
        "input_tokens, output_tokens, reasoning_tokens, cached_tokens, summary FROM we0_messages")}
    u, a = msgs
    assert m[u.id][:2] == ("user", 10.0) and m[u.id][8:12] == (None, None, None, None)
    assert m[a.id][:12] == ("assistant", 11.0, 19.0, u.id, "m-1", "tool-calls", "R", "why", 10, 5, 2, 1)
    rows = {r[0]: r[1:] for r in sql.raw(
        "SELECT id, session_id, message_id, type, tool, call_id, status, time_start, time_end, interrupted, "
        "interrupt_reason, recalled FROM we0_parts")}
    norm = lambda r: tuple(bool(v) if i in (8, 10) else v for i, v in enumerate(r))  # noqa: E731
    by = {x.id: norm(rows[x.id]) for x in parts}
    assert by[parts[1].id][2:] == ("step-start", None, None, None, 11.0, 11.0, False, None, False)
    assert by[parts[2].id][2:] == ("reasoning", None, None, None, 11.1, None, False, None, False)
    assert by[parts[4].id][2:] == ("tool", "read", "c1", "pending", None, None, False, None, False)
    assert by[parts[5].id][2:] == ("tool", "read", "c2", "running", 12.0, None, False, None, False)
    assert by[parts[6].id][2:] == ("tool", "read", "c3", "completed", 12.0, 12.5, False, None, True)
    assert by[parts[7].id][2:] == ("tool", "write", "c4", "error", 13.0, 13.5, True, "resume", False)
    assert by[parts[10].id][2:] == ("compaction", None, None, None, 19.5, 19.5, False, None, False)
    assert {r[0:2] for r in rows.values()} == {(sid, u.id), (sid, a.id)}
    (srow,) = sql.raw(f"SELECT title, created, updated, revert_message_id FROM we0_sessions WHERE id = '{sid}'")
    assert tuple(srow) == ("t", 1.5, 2.25, None)


def test_two_successive_event_loops(sql: Backend) -> None:
    p = sql.fresh()

    @tool(side_effects=False)
    def echo(x: str) -> str:
        return x

    async def run(i: int) -> str:
        model = ScriptedModel([[tool_call("echo", {"x": f"v{i}"})], [text(f"done {i}")]])
        agent = We0Agent(model, tools=[echo], persistence=p)
        r = await agent.invoke(mode="prompt", session_id="ses_loops", messages=[user_message(f"go {i}")])
        return r.text

    assert asyncio.run(run(1)) == "done 1"
    assert asyncio.run(run(2)) == "done 2"

    async def count() -> int:
        tr = await p.load_transcript("ses_loops")
        return len(tr.messages)

    assert asyncio.run(count()) == 6
    asyncio.run(p.close())
    assert asyncio.run(count()) == 6  # reopens after close


async def test_url_and_sync_engine_see_the_same_tables(sql: Backend) -> None:
    p = sql.fresh()
    sid = new_id("ses")
    await _write(p, sid)
    url = p.url
    assert url.startswith("sqlite:///") if sql.name.startswith("sqlite") else url.startswith("postgresql+psycopg://")

    def check() -> None:  # the synchronous engine is for code off the event loop (the frames)
        eng = p.sync_engine()
        assert p.sync_engine() is eng
        with eng.connect() as conn:
            assert conn.execute(sql_text("SELECT count(*) FROM we0_messages WHERE session_id = :s"),
                                {"s": sid}).scalar() == 2
            assert conn.execute(sql_text("SELECT value FROM we0_meta WHERE key = 'schema_version'")).scalar() \
                == str(S.SCHEMA_VERSION)

    await asyncio.to_thread(check)


def test_sync_engine_first_creates_the_tables(tmp_path: Path) -> None:
    p = SqlPersistence(f"sqlite:///{tmp_path / 'frames.db'}")
    with p.sync_engine().connect() as conn:
        assert conn.execute(sql_text("SELECT count(*) FROM we0_parts")).scalar() == 0
    asyncio.run(p.close())


async def test_bad_rows_name_the_record_and_other_sessions_still_load(sql: Backend) -> None:
    p = sql.fresh()
    good, bad_part, bad_msg, bad_json = (new_id("ses") for _ in range(4))
    await _write(p, good)
    _, parts = await _write(p, bad_part)
    msgs, _ = await _write(p, bad_msg)
    _, parts3 = await _write(p, bad_json)
    assert sql.raw is not None
    victim = parts[6]
    sql.raw("UPDATE we0_parts SET data = '{\"id\": \"' || id || '\", \"type\": \"tool\"}' "
            f"WHERE id = '{victim.id}'")
    sql.raw(f"UPDATE we0_messages SET data = 'not json at all' WHERE id = '{msgs[1].id}'")
    sql.raw(f"UPDATE we0_parts SET data = '{{\"truncated' WHERE id = '{parts3[2].id}'")
    q = sql.fresh()
    with pytest.raises(CorruptRecordError) as e1:
        await q.load_transcript(bad_part)
    assert bad_part in str(e1.value) and victim.message_id in str(e1.value) and victim.id in str(e1.value)
    with pytest.raises(CorruptRecordError) as e2:
        await q.load_transcript(bad_msg)
    assert bad_msg in str(e2.value) and msgs[1].id in str(e2.value)
    with pytest.raises(CorruptRecordError) as e3:
        await q.load_transcript(bad_json)
    assert parts3[2].id in str(e3.value) and bad_json in str(e3.value)
    tr = await q.load_transcript(good)
    assert len(tr.messages) == 2
    assert isinstance(e1.value, PersistenceError)


async def test_a_row_whose_json_disagrees_with_its_columns_is_corrupt(sql: Backend) -> None:
    p = sql.fresh()
    sid = new_id("ses")
    _, parts = await _write(p, sid)
    assert sql.raw is not None
    # valid JSON of another part under this row's id: not silently accepted
    sql.raw(f"UPDATE we0_parts SET data = (SELECT data FROM we0_parts WHERE id = '{parts[2].id}') "
            f"WHERE id = '{parts[3].id}'")
    with pytest.raises(CorruptRecordError, match=parts[3].id):
        await sql.fresh().load_transcript(sid)


async def test_newer_schema_version_is_refused(sql: Backend) -> None:
    p = sql.fresh()
    await p.upsert_session(_session(new_id("ses")))
    assert sql.raw is not None
    sql.raw("UPDATE we0_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError, match=r"newer we0nb \(schema version 99"):
        await sql.fresh().list_sessions()
    with pytest.raises(SchemaVersionError):
        await asyncio.to_thread(sql.fresh().sync_engine)


async def test_a_table_of_another_program_under_our_name_is_refused_and_nothing_is_created(sql: Backend) -> None:
    """A database with a ``we0_sessions`` of its own: creating "if not exists" left it, and the first
    read failed with "no such column: we0_sessions.id". Now refused at once, twice alike (nothing made)."""
    assert sql.raw is not None
    sql.raw("CREATE TABLE we0_sessions (x INTEGER)")
    for _ in range(2):
        with pytest.raises(PersistenceError, match="already has a table named we0_sessions that we0nb did not make"):
            await sql.fresh().list_sessions()
    with pytest.raises(PersistenceError, match="we0_sessions that we0nb did not make"):
        await asyncio.to_thread(sql.fresh().sync_engine)


async def test_lease_takeover_rules(sql: Backend) -> None:
    """Dead local owner: taken at once. Remote owner: busy until it expires."""
    p = sql.fresh()
    await p.list_sessions()  # creates the tables
    assert sql.raw is not None
    host = __import__("socket").gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    future, past = time.time() + 600, time.time() - 1
    cases = {
        "dead_local": (host, dead.pid, future, True),
        "alive_remote": ("elsewhere.example", os.getpid(), future, False),
        "expired_remote": ("elsewhere.example", 1, past, True),
        "alive_local_other_process": (host, os.getppid(), future, False),
        # our own PID, but no live run of this process holds it: a crashed process whose PID we
        # reuse (containers restart with the same PIDs)
        "reused_pid": (host, os.getpid(), future, True),
    }
    for name, (h, pid, expires, takeable) in cases.items():
        sid = f"ses_{name}"
        sql.raw("INSERT INTO we0_leases (session_id, owner, host, pid, run_id, expires) "
                f"VALUES ('{sid}', '{h}:{pid}:run_old', '{h}', {pid}, 'run_old', {expires})")
        if takeable:
            lease = await p.acquire_lease(sid, "run_new")
            assert sql.raw(f"SELECT run_id FROM we0_leases WHERE session_id = '{sid}'") == [("run_new",)]
            await lease.release()
            assert sql.raw(f"SELECT count(*) FROM we0_leases WHERE session_id = '{sid}'")[0][0] == 0
        else:
            with pytest.raises(SessionBusyError, match="run_old"):
                await p.acquire_lease(sid, "run_new")


async def test_lease_is_renewed_while_the_run_goes_on(sql: Backend) -> None:
    p = sql.fresh()
    p.lease_ttl, p.lease_renew = 30.0, 0.05
    sid = new_id("ses")
    lease = await p.acquire_lease(sid, "run_long")
    assert sql.raw is not None

    def expires() -> float:
        return sql.raw(f"SELECT expires FROM we0_leases WHERE session_id = '{sid}'")[0][0]  # type: ignore[misc]

    seen = [expires()]
    for _ in range(1000):  # a bounded wait (up to ~10 s) for three renewals: a long tool call
        await asyncio.sleep(0.01)
        if expires() != seen[-1]:
            seen.append(expires())
            if len(seen) == 4:
                break
    assert len(seen) == 4 and seen == sorted(seen)  # renewed again and again, each time later
    # a process on another host still sees it busy
    sql.raw(f"UPDATE we0_leases SET host = 'elsewhere.example' WHERE session_id = '{sid}'")
    other = sql.fresh()
    with pytest.raises(SessionBusyError):
        await other.acquire_lease(sid, "run_other")
    await lease.release()
    assert not p._leases.heartbeats and not lease.lost
    assert sql.raw(f"SELECT count(*) FROM we0_leases WHERE session_id = '{sid}'")[0][0] == 0


async def test_a_commit_renews_the_lease_once_it_is_due_and_the_heartbeat_always(sql: Backend) -> None:
    """A commit's guard keeps the lease: on SQLite it renews the row only once the lease expires
    within ``lease_ttl - lease_renew`` seconds (a fresh one is left as it was, so the commit writes
    no page for it); PostgreSQL renews it with every commit. The heartbeat renews it in full."""
    p = sql.fresh()
    p.lease_ttl, p.lease_renew = 600.0, 500.0  # no tick of the heartbeat itself during the test
    assert sql.raw is not None
    sid = new_id("ses")
    lease = await p.acquire_lease(sid, "run_guard")

    def expires() -> float:
        return sql.raw(f"SELECT expires FROM we0_leases WHERE session_id = '{sid}'")[0][0]  # type: ignore[misc]

    def user(i: int) -> UserMessage:
        return UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=10.0 + i))

    first = expires()
    await asyncio.sleep(0.05)
    await p.commit([(user(0), (), None)], lease=lease)
    if sql.name.startswith("sqlite"):
        assert expires() == first  # fresh: 600 s left, more than 600 - 500
    else:
        assert expires() > first
    due = time.time() + 50.0  # less than lease_ttl - lease_renew left: the next commit renews it
    sql.raw(f"UPDATE we0_leases SET expires = {due} WHERE session_id = '{sid}'")
    await p.commit([(user(1), (), None)], lease=lease)
    assert expires() > time.time() + 500.0
    sql.raw(f"UPDATE we0_leases SET expires = {due} WHERE session_id = '{sid}'")
    held = p._leases.heartbeats[asyncio.get_running_loop()].leases
    assert await p._leases.renew(lease, held) is True
    assert expires() > time.time() + 500.0
    assert sql.raw(f"SELECT count(*) FROM we0_messages WHERE session_id = '{sid}'")[0][0] == 2
    assert not lease.lost
    await lease.release()


async def test_the_leases_of_one_store_share_one_heartbeat_task(sql: Backend) -> None:
    """A batch holds a hundred leases at once: one task renews them all, and it stops with the last."""
    p = sql.fresh()
    p.lease_ttl, p.lease_renew = 30.0, 0.05
    assert sql.raw is not None
    before = len(asyncio.all_tasks())
    sids = [new_id("ses") for _ in range(3)]
    leases = [await p.acquire_lease(sid, f"run_{i}") for i, sid in enumerate(sids)]
    assert len(asyncio.all_tasks()) == before + 1 and len(p._leases.heartbeats) == 1

    def expires() -> list[float]:
        return [sql.raw(f"SELECT expires FROM we0_leases WHERE session_id = '{sid}'")[0][0]  # type: ignore[misc]
                for sid in sids]

    first = expires()
    for _ in range(1000):  # a bounded wait (up to ~10 s) for a renewal of each
        await asyncio.sleep(0.01)
        if all(b > a for a, b in zip(first, expires())):
            break
    assert all(b > a for a, b in zip(first, expires()))
    await leases[0].release()
    assert len(p._leases.heartbeats) == 1  # two left
    for lease in leases[1:]:
        await lease.release()
    assert not p._leases.heartbeats
    for _ in range(100):  # (the cancelled task, and any renewal it had under way, end)
        if len(asyncio.all_tasks()) == before:
            break
        await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == before
    assert not any(lease.lost for lease in leases)


async def test_a_renewal_on_the_way_when_its_lease_is_released_is_not_a_loss(
        sql: Backend, caplog: pytest.LogCaptureFixture) -> None:
    """A batch releases leases while the heartbeat renews them all at once: a renewal that then
    finds no row lost nothing (no warning, the lease not marked lost); a row gone while the lease
    is still held is a loss."""
    from we0nb.persistence.sql import statements as q

    p = sql.fresh()
    p.lease_ttl, p.lease_renew = 600.0, 500.0  # no tick of the heartbeat itself during the test
    done, kept = await p.acquire_lease(new_id("ses"), "run_done"), await p.acquire_lease(new_id("ses"), "run_kept")
    held = p._leases.heartbeats[asyncio.get_running_loop()].leases
    execute = p._db.execute

    async def released_on_the_way(stmt: Any, params: dict[str, Any]) -> int:
        if stmt is q.LEASE_RENEW and params["sid"] == done.session_id:
            await done.release()  # the run ends while the renewal of its lease is on the way
        return await execute(stmt, params)

    p._db.execute = released_on_the_way
    with caplog.at_level("WARNING", logger="we0nb.persistence.sql"):
        assert await p._leases.renew(done, held) is False
        assert not done.lost and "taken over" not in caplog.text
        await execute(q.LEASE_RELEASE, {"sid": kept.session_id, "holder": kept.owner})  # not by its run
        assert await p._leases.renew(kept, held) is False
    assert kept.lost and "taken over by another run, which has released it since (no one holds it now)" in caplog.text
    await kept.release()


async def test_every_write_is_committed_at_once(sql: Backend) -> None:
    """No flush needed: another connection sees each write as soon as it returns."""
    p = sql.fresh()
    assert sql.raw is not None
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    assert sql.raw(f"SELECT count(*) FROM we0_sessions WHERE id = '{sid}'")[0][0] == 1
    msgs, parts = _history(sid)
    await put(p, msgs[1])
    assert sql.raw(f"SELECT completed FROM we0_messages WHERE id = '{msgs[1].id}'")[0][0] == 19.0
    tp = parts[5]  # a running tool part: the write-ahead record
    await put(p, None, tp)
    assert sql.raw(f"SELECT status FROM we0_parts WHERE id = '{tp.id}'")[0][0] == "running"
    await put(p, None, *parts[6:9])
    assert sql.raw(f"SELECT count(*) FROM we0_parts WHERE session_id = '{sid}'")[0][0] == 4


# --------------------------------------------------------------------------- SQLite specifics


async def test_sqlite_wal_synchronous_and_busy_timeout(tmp_path: Path) -> None:
    db = tmp_path / "tuned.db"
    p = SqlPersistence(f"sqlite:///{db}", synchronous="FULL", busy_timeout=2.5)
    await p.upsert_session(_session("ses_1"))
    conn = p._db.conn  # type: ignore[attr-defined]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    # the inline connection never waits on the event loop: a locked database is retried with an
    # async back-off for up to busy_timeout (test_sql_reliability checks the behaviour)
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    assert p._db.busy_timeout == 2.5  # type: ignore[attr-defined]
    q = SqlPersistence(f"sqlite:///{db}")
    await q.list_sessions()
    assert q._db.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # type: ignore[attr-defined]

    def frames_busy_timeout() -> int:  # the frames' engine (off the loop) gets the configured wait
        with q.sync_engine().connect() as c:
            return c.exec_driver_sql("PRAGMA busy_timeout").scalar()

    assert await asyncio.to_thread(frames_busy_timeout) == 5000
    await p.close()
    await q.close()


async def test_wal_checkpoints_run_off_the_loop_and_close_stops_them(tmp_path: Path) -> None:
    db = tmp_path / "ckpt.db"
    p = SqlPersistence(f"sqlite:///{db}")
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    inline = p._db
    assert isinstance(inline, InlineSqlite)
    assert inline.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0  # type: ignore[union-attr]
    inline.WAL_LIMIT = inline.wal_limit = 64 * 1024  # (a small limit: checkpoints come soon)
    msgs, parts = _history(sid)
    await put(p, msgs[1])
    for i in range(300):
        await put(p, None, parts[1].model_copy(update={"id": new_id("prt")}))
    thread = inline.ckpt_thread
    assert inline.checkpoints > 0 and thread is not None and thread.is_alive()
    assert thread is not threading.current_thread()
    await p.close()
    assert not thread.is_alive()
    assert not (tmp_path / "ckpt.db-wal").exists()  # the last connection checkpointed and removed it
    q = SqlPersistence(f"sqlite:///{db}")
    tr = await q.load_transcript(sid)
    assert len(tr.messages[0].parts) == 300
    await q.close()


async def test_the_wal_size_is_looked_at_once_per_stride_of_bytes_written_not_per_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small commits add up to the stride before the WAL's size is looked at (a stat); a commit
    whose text alone passes the stride has it looked at right after it."""
    db = tmp_path / "stride.db"
    p = SqlPersistence(f"sqlite:///{db}")
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    inline = p._db
    assert isinstance(inline, InlineSqlite)
    looks: list[str] = []

    class CountingOs:
        """The module's ``os``, counting the WAL's stats. (Patching ``os.stat`` itself would leave
        the blocking-call guard's wrapper of it installed after the test: that broke later tests.)"""

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def stat(path: Any, *a: Any, **kw: Any) -> Any:
            if str(path).endswith("-wal"):
                looks.append(str(path))
            return os.stat(path, *a, **kw)

    monkeypatch.setattr("we0nb.persistence.sql.inline.os", CountingOs())
    msgs, parts = _history(sid)
    await put(p, msgs[1])
    for _ in range(100):
        await put(p, None, parts[3].model_copy(update={"id": new_id("prt")}))
    assert 0 < len(looks) <= 100 // 4, looks  # (a small part: well under a stride each)
    assert inline.unseen < inline.WAL_STRIDE
    looks.clear()
    big = parts[3].model_copy(update={"id": new_id("prt"), "text": "x" * (inline.WAL_STRIDE // 4 + 1)})
    await put(p, None, big)
    assert len(looks) == 1  # (its text alone is a stride: the WAL is looked at at once)
    await p.close()


def test_the_backoff_while_our_own_checkpoint_holds_the_lock_stays_short(tmp_path: Path) -> None:
    """Another process's lock: sleeps doubling up to MAX_BACKOFF. This connection's own TRUNCATE
    checkpoint (a few milliseconds): CKPT_BACKOFF each time, so the writer goes on right after it
    instead of up to a doubled sleep later."""
    inline = InlineSqlite(str(tmp_path / "b.db"), False, "NORMAL", 5.0, "b.db")
    d, seen = 0.0005, []
    for _ in range(8):
        d = inline.next_backoff(d)
        seen.append(d)
    assert seen[:3] == [0.001, 0.002, 0.004] and seen[-1] == inline.MAX_BACKOFF
    inline.ckpt_locking = True
    assert [inline.next_backoff(x) for x in (0.0005, 0.004, inline.MAX_BACKOFF)] == [inline.CKPT_BACKOFF] * 3


async def test_a_writer_waits_for_our_checkpoint_in_short_sleeps(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While the checkpoint thread holds the write lock, a commit retries every CKPT_BACKOFF and
    lands once the lock is free (the lock is held here by another connection, flagged as ours)."""
    import sqlite3

    import we0nb.persistence.sql.inline as inline_module

    db = tmp_path / "w.db"
    p = SqlPersistence(f"sqlite:///{db}")
    await p.upsert_session(_session("ses_1"))
    inline = p._db
    assert isinstance(inline, InlineSqlite)
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) == 12:
            await off_loop(other.execute, "COMMIT")  # (the "checkpoint" ends)
            inline.ckpt_locking = False
        await real_sleep(0)

    off_loop = asyncio.to_thread  # (the other connection: off the loop, as a checkpoint is)
    other = await asyncio.to_thread(sqlite3.connect, str(db), isolation_level=None, check_same_thread=False)
    await asyncio.to_thread(other.execute, "BEGIN IMMEDIATE")
    inline.ckpt_locking = True
    monkeypatch.setattr(inline_module.asyncio, "sleep", sleep)
    await p.upsert_session(_session("ses_2"))
    monkeypatch.undo()
    assert sleeps[1:12] == [inline.CKPT_BACKOFF] * 11 and len(sleeps) == 12
    assert {s.id for s in await p.list_sessions()} == {"ses_1", "ses_2"}
    await asyncio.to_thread(other.close)
    await p.close()


@pytest.mark.parametrize("inline", [True, False])
async def test_read_only_database_file_is_a_clear_error(tmp_path: Path, inline: bool) -> None:
    """A database the process may not write (a read-only SQLite URI: this holds as root too,
    where a chmod would not stop the write) fails at once, with what to do."""
    db = tmp_path / "ro.db"
    p = SqlPersistence(f"sqlite:///{db}")
    await p.upsert_session(_session("ses_1"))
    await p.close()
    ro = SqlPersistence(f"sqlite:///file:{db}?mode=ro&uri=true", inline_sqlite=inline)
    with pytest.raises(PersistenceError, match="read-only") as err:
        await ro.upsert_session(_session("ses_2"))
    assert err.value.__cause__ is not None and "\n" not in str(err.value)
    await ro.close()
    check = SqlPersistence(f"sqlite:///{db}")
    assert [s.id for s in await check.list_sessions()] == ["ses_1"]
    await check.close()


async def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    p = SqlPersistence(f"sqlite:///{tmp_path / 'nope' / 'we0.db'}")
    with pytest.raises(PersistenceError, match="does not exist"):
        await p.list_sessions()
    await p.close()


def test_options_are_validated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ValueError, match="synchronous"):
        SqlPersistence(url, synchronous="SOMETIMES")
    with pytest.raises(ValueError, match="lease_renew"):
        SqlPersistence(url, lease_ttl=1, lease_renew=2)
    with pytest.raises(ValueError, match="schema"):
        SqlPersistence(url, schema="s")
    with pytest.raises(PersistenceError, match="SQLite and PostgreSQL"):
        SqlPersistence("mysql://u@h/db")
    with pytest.raises(TypeError):
        SqlPersistence(42)  # type: ignore[arg-type]


def test_writer_process_is_accepted_with_a_deprecation_warning_and_changes_nothing(tmp_path: Path) -> None:
    """SQLite's opt-in writer process was removed (W7 measured it slower): the argument still works."""
    with pytest.warns(DeprecationWarning, match="writer_process"):
        p = SqlPersistence(f"sqlite:///{tmp_path / 'x.db'}", writer_process=True)
    assert isinstance(p._db, InlineSqlite)


def test_urls_map_to_drivers(tmp_path: Path) -> None:
    assert SqlPersistence("sqlite+aiosqlite:///a/b.db").url == "sqlite:///a/b.db"
    assert SqlPersistence("sqlite:///a/b.db")._database.async_url.drivername == "sqlite+aiosqlite"
    pg = SqlPersistence("postgresql://u:pw@h:5/db", schema="s1")
    assert pg.url == "postgresql+psycopg://u:pw@h:5/db" and pg.schema == "s1"
    assert "pw" not in repr(pg)
    assert SqlPersistence("postgresql+asyncpg://u@h/db").url == "postgresql+psycopg://u@h/db"
    assert SqlPersistence("postgres://u@h/db").url == "postgresql+psycopg://u@h/db"


def test_top_level_export() -> None:
    import we0nb

    assert we0nb.SqlPersistence is SqlPersistence


async def test_in_memory_sqlite_is_shared_with_the_sync_engine() -> None:
    p = SqlPersistence("sqlite://")
    agent = We0Agent(ScriptedModel([[text("hello")]]), persistence=p)
    r = await agent.invoke(mode="prompt", session_id="ses_mem", messages=[user_message("hi")])
    assert r.result == "stop"

    def count() -> int:
        with p.sync_engine().connect() as conn:
            return conn.execute(sql_text("SELECT count(*) FROM we0_messages")).scalar()

    assert await asyncio.to_thread(count) == 2
    other = SqlPersistence("sqlite:///:memory:")  # another in-memory database: empty
    assert await other.list_sessions() == []
    assert [s.id for s in await p.list_sessions()] == ["ses_mem"]
    await other.close()
    await p.close()


async def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "notes.db"
    junk.write_bytes(b"these are my notes, not a database" * 100)
    p = SqlPersistence(f"sqlite:///{junk}")
    with pytest.raises(PersistenceError, match="not a database"):
        await p.list_sessions()
    await p.close()


@pytest.mark.postgres
async def test_a_postgres_url_with_several_settings_in_options_keeps_each(pg_schema: str) -> None:  # noqa: F811
    await SqlPersistence(PG_URL, schema=pg_schema).upsert_session(_session("ses_opts"))
    url = f"{PG_URL}?options=-csearch_path%3D{pg_schema}%20-capplication_name%3Dwe0nb_opts"
    p = SqlPersistence(url)
    try:  # (the store's own connections read "a+b" as one setting: no such table)
        assert [s.id for s in await p.list_sessions()] == ["ses_opts"]
        assert (await p.load_transcript("ses_opts")).session.id == "ses_opts"
        names = pg_execute(pg_schema, "SELECT DISTINCT application_name FROM pg_stat_activity "
                                      "WHERE application_name = 'we0nb_opts'")
        assert names == [("we0nb_opts",)]
    finally:
        await p.close()


@pytest.mark.postgres
async def test_postgres_schema_and_synchronous_settings(pg_schema: str) -> None:  # noqa: F811
    p = SqlPersistence(PG_URL, schema=pg_schema)
    await p.upsert_session(_session("ses_pg"))
    assert pg_execute(pg_schema, "SELECT id FROM we0_sessions") == [("ses_pg",)]  # in that schema
    q = SqlPersistence(PG_URL, schema=pg_schema, synchronous="FULL")

    def settings(store: SqlPersistence) -> tuple[str, str]:  # the synchronous engine, off the loop
        with store.sync_engine().connect() as c:
            return c.exec_driver_sql("SHOW search_path").scalar(), c.exec_driver_sql("SHOW synchronous_commit").scalar()

    # NORMAL: a killed client loses nothing; only a server crash may lose the last commits
    assert await asyncio.to_thread(settings, p) == (pg_schema, "off")
    assert await asyncio.to_thread(settings, q) == (pg_schema, "on")
    await p.close()
    await q.close()

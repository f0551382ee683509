"""SqlPersistence under adversity: lost leases, NUL and long ids, driver failures, corrupt
session rows, a locked database. Each test here failed on the code before Core v2 (issue 13);
the store-level rules of lost leases and NUL went into the conformance suite (we0nb.persistence.conformance).

Backends as in test_sql_persistence: memory (the reference), SQLite inline, SQLite through
aiosqlite, PostgreSQL (``WE0NB_TEST_POSTGRES_URL``, a throw-away schema per test).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from sql_support import PG_URL, Backend, sqlite_raw
from we0nb import (
    CorruptRecordError, PersistenceError, ScriptedModel, Session,
    SqlPersistence, TextPart, UserMessage, We0Agent, text, tool, tool_call, user_message,
)
from we0nb._ids import new_id
from we0nb.errors import LeaseLostError
from we0nb.messages import MessageTime, PartTime, SessionTime
from we0nb.persistence.conformance.history import NUL, nul_history
from we0nb.persistence.sql import tables as S

STORES = ["memory", "sqlite", "sqlite-aiosqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _session(sid: str, title: str = "t") -> Session:
    return Session(id=sid, title=title, time=SessionTime(created=1.0, updated=2.0))


def _user(sid: str, body: str = "hi") -> tuple[UserMessage, TextPart]:
    u = UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=3.0))
    return u, TextPart(id=new_id("prt"), session_id=sid, message_id=u.id, text=body, time=PartTime(start=3.0, end=3.0))


async def _count(p: Any, sid: str) -> int:
    tr = await p.load_transcript(sid)
    return sum(1 + len(m.parts) for m in tr.messages)


# --------------------------------------------------------------------------- defect 1: a lost lease


async def test_the_heartbeat_marks_a_lease_lost_when_another_run_took_it(sql: Backend) -> None:
    p = sql.fresh()
    p.lease_ttl, p.lease_renew = 5.0, 0.02
    sid = new_id("ses")
    lease = await p.acquire_lease(sid, "run_first")
    assert sql.raw is not None
    # what a run on another host does once the lease expired: one compare-and-swap of the row
    other = "elsewhere.example:1:run_second"
    sql.raw(f"UPDATE we0_leases SET owner = '{other}', host = 'elsewhere.example', pid = 1, "
            f"run_id = 'run_second', expires = 1e12 WHERE session_id = '{sid}'")
    for _ in range(500):  # a bounded wait for the next renewals
        if lease.lost:
            break
        await asyncio.sleep(0.01)
    assert lease.lost and lease.taken_by == other
    with pytest.raises(LeaseLostError):
        lease.check()
    await lease.release()
    assert sql.raw(f"SELECT owner FROM we0_leases WHERE session_id = '{sid}'") == [(other,)]


# --------------------------------------------------------------------------- defects 7 and 8: NUL, long ids

async def test_flattened_columns_hold_u_fffd_for_nul_on_every_sql_backend(sql: Backend) -> None:
    """The round trip of NUL is the conformance suite's; here the flattened columns (PostgreSQL text
    cannot hold NUL, and every backend stores the same)."""
    p = sql.fresh()
    sid = new_id("ses")
    session, (u, a), parts = nul_history(sid)
    await p.upsert_session(session)
    await p.commit([(u, parts[:1], None), (a, parts[1:], None)])
    rows = sql.raw(f"SELECT model_id, error_reason, error_message FROM we0_messages WHERE id = '{a.id}'")
    assert tuple(rows[0]) == ("modela\ufffdb", "Reasona\ufffdb", "failed: a\ufffdb")
    assert sql.raw(f"SELECT title FROM we0_sessions WHERE id = '{sid}'") == [("title a\ufffdb",)]
    rows = sql.raw(f"SELECT tool, call_id, interrupt_reason FROM we0_parts WHERE session_id = '{sid}' "
                   "AND type = 'tool' ORDER BY id")
    assert [tuple(r) for r in rows] == [("toola\ufffdb", "calla\ufffdb", None), ("t2", "c2", "ra\ufffdb")]


def test_flattened_columns_replace_nul_in_one_place() -> None:
    session, (u, a), parts = nul_history("ses_x")
    assert S.cut(NUL) == "a\ufffdb" and S.cut(NUL, 2) == "a\ufffd" and S.cut(None) is None
    assert S.session_columns(session)["title"] == "title a\ufffdb"
    cols = S.message_columns(a)
    assert (cols["model_id"], cols["error_message"]) == ("modela\ufffdb", "failed: a\ufffdb")
    assert S.part_columns(parts[3])["tool"] == "toola\ufffdb"
    assert not any("\x00" in v for c in [S.message_columns(u), cols] + [S.part_columns(x) for x in parts]
                   for v in c.values() if isinstance(v, str))


async def test_an_agent_run_with_nul_everywhere_round_trips(backend: Backend) -> None:
    @tool(side_effects=False)
    def echo(x: str) -> str:
        return "echo " + x

    p = backend.fresh()
    model = ScriptedModel([[text("calling " + NUL), tool_call("echo", {"x": NUL})], [text("done " + NUL)]])
    agent = We0Agent(model, tools=[echo], persistence=p)
    r = await agent.invoke(mode="prompt", session_id="ses_nul", messages=[user_message("say " + NUL)])
    assert r.result == "stop" and r.text == "done " + NUL
    live = await agent.transcript("ses_nul")
    again = await backend.fresh().load_transcript("ses_nul")
    assert again.model_dump(mode="json") == live.model_dump(mode="json")
    outputs = [x.state.output for m in again.messages for x in m.tool_parts]
    assert outputs == ["echo " + NUL]


LONG_ID = "ses_" + "x" * 251  # the limit: 255 characters


async def test_session_ids_up_to_the_limit_work_on_every_backend(backend: Backend) -> None:
    assert len(LONG_ID) == 255
    p = backend.fresh()
    agent = We0Agent(ScriptedModel([[text("one")], [text("two")]]), persistence=p)
    await agent.invoke(mode="prompt", session_id=LONG_ID, messages=[user_message("a")])
    await agent.invoke(mode="prompt", session_id=LONG_ID, messages=[user_message("b")])
    q = backend.fresh()
    assert (await q.get_session(LONG_ID)) is not None
    assert len((await q.load_transcript(LONG_ID)).messages) == 4
    lease = await q.acquire_lease(LONG_ID, "run_x")
    await q.commit([(_user(LONG_ID)[0], [], None)], lease=lease)
    await lease.release()
    assert len((await q.load_recent(LONG_ID)).messages) >= 1


# --------------------------------------------------------------------------- driver errors are PersistenceErrors


def _fill(p: SqlPersistence, conn: Any) -> None:
    """Cap the SQLite file at its current size (SQLITE_FULL on the next page it needs)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")


async def _write_until_full(p: Any, sid: str) -> PersistenceError:
    u, t = _user(sid)
    await p.commit([(u, [], None)])
    big = "x" * 200_000
    with pytest.raises(PersistenceError) as err:
        for i in range(50):
            await p.commit([(None, [t.model_copy(update={"id": new_id("prt"), "text": big})], None)])
    return err.value


async def test_a_full_disk_is_a_persistence_error_inline(tmp_path: Path) -> None:
    p = SqlPersistence(f"sqlite:///{tmp_path / 'full.db'}")
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    _fill(p, p._db.conn)  # type: ignore[attr-defined]  # private on purpose: simulate SQLITE_FULL
    e = await _write_until_full(p, sid)
    assert "full" in str(e) and "\n" not in str(e) and isinstance(e.__cause__, sqlite3.Error)
    with pytest.raises(PersistenceError, match="full"):  # a single-statement write too
        await p.upsert_session(_session(sid, "y" * 200_000))
    assert await _count(p, sid) == 1  # what was committed before is intact
    await p.close()


async def test_a_full_disk_is_a_persistence_error_through_an_async_engine(tmp_path: Path) -> None:
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    db = tmp_path / "full.db"
    setup = SqlPersistence(f"sqlite:///{db}")
    await setup.list_sessions()  # create the tables
    await setup.close()
    pages = sqlite_raw(db)("PRAGMA page_count")[0][0]
    eng = create_async_engine(f"sqlite+aiosqlite:///{db}")

    @event.listens_for(eng.sync_engine, "connect")
    def cap(dbapi_conn: Any, record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA max_page_count = {pages + 2}")
        cur.close()

    p = SqlPersistence(eng)
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    e = await _write_until_full(p, sid)
    assert "full" in str(e) and e.__cause__ is not None
    await p.close()


@pytest.mark.postgres
async def test_an_unreachable_postgres_is_a_persistence_error() -> None:
    if PG_URL is None:
        pytest.skip("needs psycopg and WE0NB_TEST_POSTGRES_URL")
    p = SqlPersistence("postgresql://postgres@127.0.0.1:1/test", engine_options={"connect_args": {"connect_timeout": 2}})
    with pytest.raises(PersistenceError, match="Cannot reach the database") as err:
        await p.list_sessions()
    assert err.value.__cause__ is not None and "\n" not in str(err.value)
    with pytest.raises(PersistenceError, match="Cannot reach"):
        await p.acquire_lease("ses_x", "run_x")
    with pytest.raises(PersistenceError, match="Cannot reach"):
        await asyncio.to_thread(p.sync_engine)
    await p.close()


def test_os_and_driver_errors_map_to_one_line_with_advice() -> None:
    """The mapping itself (private on purpose): what each kind of failure tells the user."""
    from we0nb.persistence.sql.errors import wrap

    full = wrap(OSError(errno.ENOSPC, "No space left on device"), "'db'")
    assert "full" in str(full) and "Free some space" in str(full)
    locked = wrap(sqlite3.OperationalError("database is locked"), "'db'")
    assert "busy_timeout" in str(locked)
    other = wrap(sqlite3.IntegrityError("something\nelse"), "'db'")
    assert str(other).startswith("The database 'db' failed") and "\n" not in str(other)
    assert isinstance(other, PersistenceError)


async def test_a_read_only_database_is_a_clear_error_on_the_lease_path(tmp_path: Path) -> None:
    db = tmp_path / "ro.db"
    p = SqlPersistence(f"sqlite:///{db}")
    await p.upsert_session(_session("ses_1"))
    await p.close()
    ro = SqlPersistence(f"sqlite:///file:{db}?mode=ro&uri=true")
    with pytest.raises(PersistenceError, match="read-only") as err:
        await ro.acquire_lease("ses_1", "run_x")
    assert isinstance(err.value.__cause__, sqlite3.Error)
    await ro.close()


# --------------------------------------------------------------------------- defect 10: a corrupt session row


async def test_a_corrupt_session_row_is_skipped_by_list_sessions(sql: Backend, caplog: pytest.LogCaptureFixture) -> None:
    p = sql.fresh()
    good, bad, wrong = new_id("ses"), new_id("ses"), new_id("ses")
    for sid in (good, bad, wrong):
        await p.upsert_session(_session(sid))
    assert sql.raw is not None
    sql.raw(f"UPDATE we0_sessions SET data = '{{not json' WHERE id = '{bad}'")
    sql.raw(f"UPDATE we0_sessions SET data = (SELECT data FROM we0_sessions WHERE id = '{good}') WHERE id = '{wrong}'")
    q = sql.fresh()
    with caplog.at_level(logging.WARNING, logger="we0nb.persistence.sql"):
        assert [s.id for s in await q.list_sessions()] == [good]
    assert bad in caplog.text and wrong in caplog.text
    with pytest.raises(CorruptRecordError, match=bad):
        await q.get_session(bad)
    with pytest.raises(CorruptRecordError, match=wrong):
        await q.load_transcript(wrong)
    with pytest.raises(CorruptRecordError, match=bad):
        await q.load_recent(bad)


# --------------------------------------------------------------------------- defect 12: a locked database


class _WriteLockHolder:
    """Another connection (on its own thread) holding SQLite's write lock until released."""

    def __init__(self, db: Path):
        self.db, self.held, self.done = db, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            self.held.set()
            self.done.wait(30)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    async def __aenter__(self) -> "_WriteLockHolder":
        self.thread.start()
        await asyncio.to_thread(self.held.wait, 10)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.done.set()
        await asyncio.to_thread(self.thread.join, 10)


async def test_a_locked_database_does_not_block_the_event_loop(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    p = SqlPersistence(f"sqlite:///{db}")
    sid = new_id("ses")
    await p.upsert_session(_session(sid))
    u, t = _user(sid)
    async with _WriteLockHolder(db) as holder:
        write = asyncio.ensure_future(p.commit([(u, [t], None)]))
        ticks = 0
        for _ in range(20):  # the loop keeps running while the write waits for the lock
            await asyncio.sleep(0.01)
            ticks += 1
        assert not write.done() and ticks == 20
        holder.done.set()
        await asyncio.wait_for(write, 10)  # then it goes through
    assert await _count(p, sid) == 2
    await p.close()


async def test_a_lock_held_past_busy_timeout_is_a_persistence_error(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    p = SqlPersistence(f"sqlite:///{db}", busy_timeout=0.2)
    await p.list_sessions()
    async with _WriteLockHolder(db):
        with pytest.raises(PersistenceError, match="busy_timeout") as err:
            await p.upsert_session(_session("ses_1"))
    assert isinstance(err.value.__cause__, sqlite3.OperationalError)
    await p.upsert_session(_session("ses_1"))  # free again
    await p.close()


async def test_a_run_on_a_locked_database_waits_busy_timeout_once(tmp_path: Path, monkeypatch) -> None:
    """The lease's commit went through the group commit, which waited out busy_timeout and then tried
    each commit alone — waiting as long again (a run failed after twice its busy_timeout)."""
    from we0nb.persistence.sql.inline import InlineSqlite

    db = tmp_path / "busy.db"
    p = SqlPersistence(f"sqlite:///{db}", busy_timeout=0.2)
    await p.list_sessions()
    waits = []
    retry = InlineSqlite._retry

    async def counted(self: Any, fn: Any, *args: Any) -> Any:
        try:
            return await retry(self, fn, *args)
        except PersistenceError:
            waits.append(fn.__name__)  # a wait that ran out
            raise

    monkeypatch.setattr(InlineSqlite, "_retry", counted)
    agent = We0Agent(ScriptedModel([[text("hi")]]), persistence=p)
    async with _WriteLockHolder(db):
        with pytest.raises(PersistenceError, match="stayed locked"):
            await agent.invoke(messages=[user_message("hi")])
    assert len(waits) == 1, waits
    await p.close()


async def test_a_nul_in_a_session_id_is_a_persistence_error_on_postgres(sql: Backend) -> None:
    """build_request refuses such ids up front; at the port, PostgreSQL's refusal is a clear error."""
    p = sql.fresh()
    if sql.name != "postgres":
        assert await p.get_session("ses_" + NUL) is None
        return
    with pytest.raises(PersistenceError, match="NUL") as err:
        await p.get_session("ses_" + NUL)
    assert err.value.__cause__ is not None


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/no_such_folder/we0.db",
                                 pytest.param("postgresql://postgres@127.0.0.1:1/test", marks=pytest.mark.postgres)])
def test_a_database_that_cannot_be_reached_is_one_error_and_no_warning(url, tmp_path, caplog) -> None:
    # a run that could not take its lease (nothing was written) tried to delete the lease row
    # anyway, and logged that this failed too: the same failure twice
    if url.startswith("postgresql"):
        pytest.importorskip("psycopg")  # (imported here, off the loop: the guard would see the import)
    agent = We0Agent(ScriptedModel([[text("hi")]]), persistence=SqlPersistence(url.format(tmp=tmp_path)))
    with caplog.at_level(logging.WARNING, logger="we0nb"):
        with pytest.raises(PersistenceError, match="Cannot (open|reach) the"):
            asyncio.run(agent.invoke(messages=[user_message("hi")]))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_locked_database_says_what_to_do_from_a_terminal_and_from_python() -> None:
    import sqlite3

    from we0nb.persistence.sql.errors import wrap

    said = str(wrap(sqlite3.OperationalError("database is locked"), "sqlite:///x.db"))
    assert "stayed locked by another connection" in said
    # a command-line user cannot pass busy_timeout=: waiting for the other writer is what they can do
    assert "Try again once the other writer is done; from Python, a longer wait is SqlPersistence(busy_timeout=...)" in said

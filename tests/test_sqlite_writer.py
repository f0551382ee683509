"""SQLite's writer process (``persistence/sql/sqlite_writer.py``).

While several runs of one loop write to a SQLite file, every write goes to one writer process
(SQLite's work on another core). It must store exactly what the loop's own connection would,
answer errors as the same PersistenceError, never cut a statement in half on a cancel, end with
the loop's last lease, and — when it dies — fail what it had and let the store write inline again.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pandas  # noqa: F401  (imported here, not on the loop under the blocking guard)
import pytest

from sql_support import user_write
from we0nb import FunctionModel, PersistenceError, SqlPersistence, We0Agent, text, tool, tool_call
from we0nb._ids import new_id
from we0nb.models.base import ToolResult, UserTurn
from we0nb.persistence.sql import sqlite_writer
from we0nb.persistence.sql.sqlite_writer import SqliteWriter, outcome
from we0nb.persistence.sql.statements import message_row, part_row

pytestmark = pytest.mark.skipif(not sqlite_writer.writer_possible(), reason="the writer process needs POSIX and 2 cores")


def _agent(store: Any) -> We0Agent:
    @tool(side_effects=False)
    async def lookup(n: int) -> str:
        """A trivial tool."""
        return f"ok {n}"

    async def reply(request: Any) -> list:
        key = next(m.text for m in request.messages if isinstance(m, UserTurn))
        n = sum(1 for m in request.messages if isinstance(m, ToolResult))
        await asyncio.sleep(0.002)
        return [tool_call("lookup", {"n": n})] if n < 2 else [text(f"done {key}")]

    return We0Agent(FunctionModel(reply), tools=[lookup], persistence=store)


async def _shape(store: Any, sids: list[str]) -> list[list[tuple]]:
    """What each session stored: per message its role and per part its type, state and text."""
    out = []
    for sid in sids:
        tr = await store.load_transcript(sid)
        out.append([(m.info.role, [(p.type, getattr(getattr(p, "state", None), "status", None),
                                    getattr(p, "text", None)) for p in m.parts]) for m in tr.messages])
    return out


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[SqliteWriter]:
    """Every writer process started."""
    started: list[SqliteWriter] = []
    real = SqliteWriter.start.__func__  # type: ignore[attr-defined]

    async def spy(cls: Any, config: Any, where: str) -> SqliteWriter:
        w = await real(cls, config, where)
        started.append(w)
        return w

    monkeypatch.setattr(SqliteWriter, "start", classmethod(spy))
    return started


async def test_a_batch_writes_through_one_writer_process_and_stores_what_inline_writes(
        tmp_path: Path, starts: list[SqliteWriter]) -> None:
    prompts = [f"p{i}" for i in range(24)]
    results = {}
    for mode in (True, None):
        options = {"writer_process": True} if mode else {}  # the default keeps the writes on the loop
        store = SqlPersistence(f"sqlite:///{tmp_path / f'w{mode}.db'}", **options)
        batch = await _agent(store).batch(prompts, concurrency=6, progress=False)
        assert batch.counts == {"stop": len(prompts)}
        results[mode] = (await _shape(store, list(batch.df["session_id"])), list(batch.df["tool_calls"]))
        assert store._inline is not None and store._inline.writers == {}  # ended with the batch's last lease
        await store.close()
    assert len(starts) == 1  # the writer-process store, once for the whole batch
    assert starts[0].proc.poll() == 0  # it exited on its own, at the end of its input
    assert results[True] == results[None]


async def _running_writer(store: SqlPersistence) -> SqliteWriter:
    inline = store._inline
    assert inline is not None
    await store.list_sessions()  # (the schema exists)
    inline.want_writer()
    await inline.wanted[asyncio.get_running_loop()]
    w = inline.writer()
    assert w is not None
    return w


async def test_an_error_at_the_writer_is_the_same_persistence_error_and_writes_nothing(tmp_path: Path) -> None:
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}", writer_process=True)
    await _running_writer(store)
    sid = new_id("ses")
    u, t = user_write(sid, "body")
    bad = t.model_copy(update={"message_id": None})  # NOT NULL
    with pytest.raises(PersistenceError) as e:
        await store._inline.transaction([("upsert_message", [message_row(u)]), ("upsert_part", [part_row(bad)])])
    assert "\n" not in str(e.value) and "NOT NULL" in str(e.value)
    assert (await store.load_transcript(sid)).messages == []  # all or nothing
    assert await store._inline.transaction([("upsert_message", [message_row(u)]), ("upsert_part", [part_row(t)])])
    assert [p.text for m in (await store.load_transcript(sid)).messages for p in m.parts] == []  # (no session row)
    rows = await store._inline.fetchall("load_parts", {"sid": sid})
    assert len(rows) == 1
    await store.close()


async def test_a_writer_that_dies_fails_its_statements_and_the_store_writes_inline_again(tmp_path: Path) -> None:
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}", writer_process=True)
    w = await _running_writer(store)
    os.kill(w.proc.pid, signal.SIGKILL)
    await asyncio.wait_for(asyncio.shield(w.ended), 10)
    with pytest.raises(PersistenceError, match="writer process .* ended"):
        await w.call([([("upsert_part", [part_row(user_write(new_id("ses"), "x")[1])])], None)])
    assert store._inline.writer() is None
    sid = new_id("ses")
    u, t = user_write(sid, "after")
    assert await store._inline.transaction([("upsert_message", [message_row(u)]), ("upsert_part", [part_row(t)])])
    assert len(await store._inline.fetchall("load_parts", {"sid": sid})) == 1
    await store.close()


async def test_a_cancel_while_a_statement_is_at_the_writer_comes_after_its_outcome() -> None:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    seen: list[Any] = []

    async def caller() -> None:
        seen.append(await outcome(fut))
        await asyncio.sleep(0)  # the held-back cancel lands here, at the caller's next await
        seen.append("not reached")

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0.01)
    assert not task.done()  # still waiting for the answer: the statement is not cut in half
    fut.set_result(7)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [7]


async def test_a_lease_taken_and_released_through_the_writer(tmp_path: Path) -> None:
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}", writer_process=True)
    await _running_writer(store)
    lease = await store.acquire_lease("s1", "run_1")
    assert (await store._inline.fetchall("lease_get", {"sid": "s1"}))[0][0] == lease.owner
    await store.release_lease(lease)  # the loop's last lease: the writer ends too
    assert await store._inline.fetchall("lease_get", {"sid": "s1"}) == []
    assert store._inline.writers == {}
    await store.close()


async def test_an_in_memory_database_keeps_its_writes_on_the_loop() -> None:
    store = SqlPersistence("sqlite://", writer_process=True)
    await store.list_sessions()
    store._inline.want_writer()
    await store._inline.wanted[asyncio.get_running_loop()]
    assert store._inline.writer() is None and not store._inline.offload  # another process could not see it
    await store.close()


async def test_a_writer_still_starting_when_the_last_lease_is_released_is_stopped(
        tmp_path: Path, starts: list[SqliteWriter]) -> None:
    """A grouped commit asks for the writer; the loop's last lease goes before it has started:
    the release must stop it too (it used to look only at the writers already running)."""
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}", writer_process=True)
    inline = store._inline
    assert inline is not None
    await store.list_sessions()  # (the schema exists)
    lease = await store.acquire_lease(new_id("ses"), "run_a")
    inline.want_writer()  # (what a commit does while several runs hold leases)
    assert inline.writers == {}  # still starting
    await lease.release()  # the loop's last lease
    assert inline.writers == {} and inline.wanted == {}
    assert len(starts) == 1 and starts[0].proc.wait(10) == 0  # it was stopped, and exited
    await store.close()

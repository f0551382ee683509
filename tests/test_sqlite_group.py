"""SQLite's group commit (``persistence/sql/sqlite_group.py``).

While several runs of one event loop hold leases on a store, their commits of one pass go
in one transaction; each must still get its own outcome — written, refused for a lost lease
(writing nothing), or its own error — and a group must write what the same commits one by
one would have written. A run alone commits at once, without waiting for a pass.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from sql_support import Backend, backend_for, user_write
from we0nb import FunctionModel, PersistenceError, Session, SqlPersistence, We0Agent
from we0nb import text, tool, tool_call, user_message
from we0nb._ids import new_id
from we0nb.errors import LeaseLostError
from we0nb.messages import SessionTime
from we0nb.models.base import ToolResult
from we0nb.persistence.sql import inline, sqlite_group


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[Backend]:
    yield from backend_for("sqlite", tmp_path)


@pytest.fixture
def group_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group written (the commits of one transaction), however it was tried."""
    sizes: list[int] = []
    now, later = inline.InlineSqlite.together_now, inline.InlineSqlite.together

    def recording_now(self: Any, commits: Any) -> list[bool]:
        sizes.append(len(commits))
        return now(self, commits)

    async def recording_later(self: Any, commits: Any) -> list[bool]:
        sizes.append(len(commits))
        return await later(self, commits)

    monkeypatch.setattr(inline.InlineSqlite, "together_now", recording_now)
    monkeypatch.setattr(inline.InlineSqlite, "together", recording_later)
    return sizes


async def _texts(p: Any, sid: str) -> list[str]:
    tr = await p.load_transcript(sid)
    return [part.text for m in tr.messages for part in m.parts]


async def _leases(p: Any, n: int) -> tuple[list[str], list[Any]]:
    p.lease_ttl, p.lease_renew = 600.0, 500.0
    sids = [new_id("ses") for _ in range(n)]
    return sids, [await p.acquire_lease(sid, f"run_{i}") for i, sid in enumerate(sids)]


def _session(sid: str) -> Session:
    return Session(id=sid, title="t", time=SessionTime(created=1.0, updated=2.0))


async def test_concurrent_commits_go_together_and_each_gets_its_own_outcome(lite: Backend, group_sizes: list) -> None:
    p = lite.fresh()
    sids, leases = await _leases(p, 30)
    lost = sids[7]
    assert lite.raw is not None
    lite.raw(f"UPDATE we0_leases SET owner = 'elsewhere:1:run_x', host = 'elsewhere' WHERE session_id = '{lost}'")
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    outcomes = await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease, session=_session(sid))
                                      for (u, t), lease, sid in zip(writes, leases, sids)), return_exceptions=True)
    assert group_sizes == [30]  # one transaction for the pass
    for sid, outcome in zip(sids, outcomes):
        if sid == lost:
            assert isinstance(outcome, LeaseLostError) and outcome.session_id == sid
        else:
            assert outcome is None
    reader = lite.fresh()
    for i, sid in enumerate(sids):
        assert await _texts(reader, sid) == ([] if sid == lost else [f"body {i}"])
    assert lite.raw(f"SELECT count(*) FROM we0_sessions WHERE id = '{lost}'") == [(0,)]
    renewed = lite.raw("SELECT count(*) FROM we0_leases WHERE expires > 1000 AND owner <> 'elsewhere:1:run_x'")
    assert renewed == [(29,)]


async def test_a_group_waits_for_the_commits_of_callbacks_already_ready(lite: Backend, group_sizes: list) -> None:
    """A commit made one and two passes after the first still joins its group while the loop had
    work ready; a commit made once the loop has nothing else ready goes in a group of its own."""
    p = lite.fresh()
    sids, leases = await _leases(p, 4)
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]

    async def commit_after(i: int, passes: int) -> None:
        for _ in range(passes):
            await asyncio.sleep(0)
        (u, t), lease, sid = writes[i], leases[i], sids[i]
        await p.commit([(u, [t], None)], lease=lease, session=_session(sid))

    await asyncio.gather(commit_after(0, 0), commit_after(1, 1), commit_after(2, 2))
    assert group_sizes == [3]
    await commit_after(3, 0)  # (nothing else ready: written alone, without waiting for MAX_PASSES)
    assert group_sizes == [3, 1]
    reader = lite.fresh()
    for i, sid in enumerate(sids):
        assert await _texts(reader, sid) == [f"body {i}"]


def test_a_group_waits_at_most_its_passes_on_a_loop_that_is_never_idle(lite: Backend, group_sizes: list) -> None:
    """A loop that always has a callback ready (here one that re-queues itself) delays a group by
    at most MAX_PASSES passes: its commits are written, not starved."""
    async def main() -> None:
        p = lite.fresh()
        sids, leases = await _leases(p, 2)
        loop = asyncio.get_running_loop()
        spinning = True

        def spin() -> None:
            if spinning:
                loop.call_soon(spin)

        spin()
        writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.commit([(u, [t], None)], lease=lease, session=_session(sid))
                                                    for (u, t), lease, sid in zip(writes, leases, sids))), 5)
        finally:
            spinning = False
        assert group_sizes == [2]
    asyncio.run(main())


async def test_a_group_keeps_each_commits_order_of_parts_and_messages(lite: Backend, group_sizes: list) -> None:
    """A group is written one statement at a time (every commit's parts, then every message) only
    when no commit writes a part of a message it wrote before: such a part drops the message's
    stored view (a trigger), and the commit keeps its order, as alone."""
    p = lite.fresh()
    sids, leases = await _leases(p, 4)
    commits = []
    for i, sid in enumerate(sids):
        u, t = user_write(sid, f"body {i}")
        if i % 2:  # the message (with a view) first, then its part: the part drops the view
            commits.append([(u, [], f"view {i}"), (None, [t], None)])
        else:  # the part, then the message with its view: the view stays
            commits.append([(u, [t], f"view {i}")])
    outcomes = await asyncio.gather(*(p.commit(c, lease=lease, session=_session(sid))
                                      for c, lease, sid in zip(commits, leases, sids)))
    assert outcomes == [None] * 4 and group_sizes == [4]
    assert lite.raw is not None
    views = dict(lite.raw("SELECT session_id, model_view FROM we0_messages"))
    assert [views[sid] for sid in sids] == ["view 0", None, "view 2", None]
    reader = lite.fresh()
    for i, sid in enumerate(sids):
        assert await _texts(reader, sid) == [f"body {i}"]


async def test_a_commit_that_fails_fails_alone_and_the_others_are_written(lite: Backend, group_sizes: list) -> None:
    p = lite.fresh()
    sids, leases = await _leases(p, 8)
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    bad = writes[3][1].model_copy(update={"message_id": None})  # a row SQLite refuses (NOT NULL)
    writes[3] = (writes[3][0], bad)
    outcomes = await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease, session=_session(sid))
                                      for (u, t), lease, sid in zip(writes, leases, sids)), return_exceptions=True)
    assert group_sizes == [8]  # tried together first: nothing of it was written
    assert isinstance(outcomes[3], PersistenceError)
    assert [o for i, o in enumerate(outcomes) if i != 3] == [None] * 7
    reader = lite.fresh()
    for i, sid in enumerate(sids):
        got = await _texts(reader, sid)
        assert got == ([] if i == 3 else [f"body {i}"]), (i, got)
    assert lite.raw is not None
    # all or nothing: neither its message nor its session row
    assert lite.raw(f"SELECT count(*) FROM we0_messages WHERE session_id = '{sids[3]}'") == [(0,)]
    assert lite.raw(f"SELECT count(*) FROM we0_sessions WHERE id = '{sids[3]}'") == [(0,)]


async def test_a_group_that_finds_the_database_locked_waits_and_then_writes(lite: Backend, tmp_path: Path,
                                                                             group_sizes: list) -> None:
    p = lite.fresh()
    sids, leases = await _leases(p, 5)
    other = sqlite3.connect(tmp_path / "we0.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    pending = asyncio.gather(*(p.commit([(u, [t], None)], lease=lease, session=_session(sid))
                               for (u, t), lease, sid in zip(writes, leases, sids)))
    await asyncio.sleep(0.05)
    assert not pending.done() and group_sizes  # it tried, found the lock, and waits without blocking the loop
    other.execute("COMMIT")
    other.close()
    assert await asyncio.wait_for(pending, 10) == [None] * 5
    reader = lite.fresh()
    assert [await _texts(reader, sid) for sid in sids] == [[f"body {i}"] for i in range(5)]


async def test_a_run_alone_commits_without_waiting_for_a_pass(lite: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    grouped: list[int] = []
    commit = sqlite_group.SqliteGroup.commit

    async def recording(self: Any, ops: Any, guard: Any) -> bool:
        grouped.append(1)
        return await commit(self, ops, guard)

    monkeypatch.setattr(sqlite_group.SqliteGroup, "commit", recording)
    p = lite.fresh()
    sids, leases = await _leases(p, 1)
    u, t = user_write(sids[0], "alone")
    await p.commit([(u, [t], None)], lease=leases[0])
    assert grouped == []
    sids2, leases2 = await _leases(p, 1)  # a second run holds a lease now
    u, t = user_write(sids2[0], "two")
    await p.commit([(u, [t], None)], lease=leases2[0])
    assert grouped == [1]


def test_runs_at_once_store_what_the_same_runs_one_by_one_store(tmp_path: Path, group_sizes: list) -> None:
    """Eight runs at once on one SQLite store (their commits grouped) end with the same
    transcripts as the same runs one after another (each commit alone)."""

    @tool(side_effects=True)
    async def note(n: int) -> str:
        """Side effects: its write-ahead must be durable before it runs."""
        return f"noted {n}"

    async def reply(request: Any) -> list:
        await asyncio.sleep(0.001)
        n = sum(1 for m in request.messages if isinstance(m, ToolResult))
        return [tool_call("note", {"n": n})] if n < 3 else [text("done")]

    def shape(tr: Any) -> list[Any]:
        return [(m.info.role, [(type(pt).__name__, getattr(pt, "text", None),
                                getattr(getattr(pt, "state", None), "status", None),
                                getattr(getattr(pt, "state", None), "output", None)) for pt in m.parts])
                for m in tr.messages]

    async def go(db: str, together: bool) -> list[Any]:
        p = SqlPersistence(f"sqlite:///{tmp_path / db}")
        agent = We0Agent(FunctionModel(reply), tools=[note], persistence=p)
        sids = [f"s{i}" for i in range(8)]
        calls = [agent.invoke(session_id=sid, messages=[user_message(f"hi {sid}")]) for sid in sids]
        if together:
            await asyncio.gather(*calls)
        else:
            for c in calls:
                await c
        out = [shape(await p.load_transcript(sid)) for sid in sids]
        await p.close()
        conn = sqlite3.connect(tmp_path / db)  # the stored model views (a cache a part write drops) too
        out.append(conn.execute("SELECT session_id, role, model_view IS NOT NULL FROM we0_messages "
                                "ORDER BY session_id, id").fetchall())
        conn.close()
        return out

    together = asyncio.run(go("a.db", True))
    assert group_sizes and max(group_sizes) > 1
    del group_sizes[:]
    alone = asyncio.run(go("b.db", False))
    assert all(n == 1 for n in group_sizes)  # (one run at a time: a lease write may go through a group, alone in it)
    assert together == alone
    assert any(has_view for _, _, has_view in together[-1])
    tools = [pt for m in together[0] for pt in m[1] if pt[0] == "ToolPart"]
    assert [(status, output) for _, _, status, output in tools] == [("completed", f"noted {n}") for n in range(3)]

"""SQLite: a batch's own writes go with the pass's group commit, and writers behind the store's own
checkpoint retry at once (W7 of shared/BENCH.md, issue 32).

A batch's lease inserts and releases and its items' ends were each a transaction of their own
(a third of a W7 batch's transactions, a fifth of its WAL); they are now commits of the loop
pass's group (:func:`we0nb.persistence.sql.driver.write_together`), with the same outcomes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from batchkit import Ledger, make_agent
from we0nb import SqlPersistence
from we0nb.persistence.batches import ItemEnd
from we0nb.persistence.sql import inline
from we0nb.persistence.sql import statements as q
from we0nb.persistence.sql.errors import Busy

BATCH_WRITES = {q.LEASE_INSERT, q.LEASE_RELEASE, q.BATCH_END}


async def test_a_batchs_lease_inserts_releases_and_ends_go_with_the_group_commit(tmp_path: Path,
                                                                                 monkeypatch: Any) -> None:
    alone: list[Any] = []  # batch writes sent as transactions of their own
    grouped: list[Any] = []  # batch writes sent with a pass's group
    with_claims: list[Any] = []  # ends sent with the claim of their slot's next item (one transaction)
    execute, statements, together = (inline.InlineSqlite._execute, inline.InlineSqlite._statements,
                                     inline.InlineSqlite._together)

    def spy_execute(self: Any, conn: Any, stmt: Any, params: Any) -> int:
        if stmt in BATCH_WRITES:
            alone.append(stmt)
        return execute(self, conn, stmt, params)

    def spy_statements(self: Any, conn: Any, calls: Any) -> list[Any]:
        if any(stmt is q.BATCH_CLAIM for stmt, _, _ in calls):  # an end with the slot's next claim: one
            with_claims.extend(stmt for stmt, _, _ in calls if stmt is q.BATCH_END)
        else:
            alone.extend(stmt for stmt, _, _ in calls if stmt in BATCH_WRITES)
        return statements(self, conn, calls)

    def spy_together(self: Any, conn: Any, commits: Any) -> list[bool]:
        grouped.extend(guard[0] for _, guard in commits if guard is not None and guard[0] in BATCH_WRITES)
        grouped.extend(stmt for ops, _ in commits for stmt, _ in ops if stmt in BATCH_WRITES)
        return together(self, conn, commits)

    monkeypatch.setattr(inline.InlineSqlite, "_execute", spy_execute)
    monkeypatch.setattr(inline.InlineSqlite, "_statements", spy_statements)
    monkeypatch.setattr(inline.InlineSqlite, "_together", spy_together)
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=2)
    result = await agent.batch([f"p{i}" for i in range(24)], name="grouped", concurrency=8, progress=False)
    await store.close()
    assert result.counts == {"stop": 24}
    assert alone == []
    for stmt in (q.LEASE_INSERT, q.LEASE_RELEASE):  # every item's lease taken and given back in the groups
        assert grouped.count(stmt) >= 24, (stmt, grouped.count(stmt))
    assert grouped.count(q.BATCH_END) + len(with_claims) == 24 and grouped.count(q.BATCH_END) > 0


async def test_an_end_through_the_group_is_recorded_only_by_the_claims_holder(tmp_path: Path) -> None:
    store = SqlPersistence(f"sqlite:///{tmp_path / 'we0.db'}")
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=1)
    await agent.batch(["a", "b"], name="b", progress=False)
    from we0nb.persistence.batches import NewItem

    await store.open_batch("c", [NewItem(prompt='["x"]', session_id="ses_c0")], session_ids_given=True, now=0.0)
    [it] = await store.claim_batch_items("c", "host:1:mine", 1, now=1.0, expires=1e12)
    end = ItemEnd(status="stop", finished=2.0, attempts=1, started=1.0)
    assert not await store.end_batch_item("c", it.item, "host:1:other", end)  # not its holder: nothing written
    assert (await store.batch_items("c"))[0].status == "running"
    assert await store.end_batch_item("c", it.item, "host:1:mine", end)
    assert (await store.batch_items("c"))[0].status == "stop"
    await store.close()


@pytest.mark.parametrize("own_checkpoint", [True, False])
async def test_a_writer_behind_the_stores_own_checkpoint_retries_within_a_millisecond(monkeypatch: Any,
                                                                                   own_checkpoint: bool) -> None:
    db = inline.InlineSqlite(":memory:", False, "NORMAL", 5.0, "test")
    db.ckpt_locking = own_checkpoint
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(inline.asyncio, "sleep", sleep)
    tries = iter(range(8))

    def locked(conn: Any) -> str:
        if next(tries) < 7:
            raise sqlite3.OperationalError("database is locked")
        return "written"

    assert await db._retry(locked) == "written"
    db.close_now()
    assert len(delays) == 7
    if own_checkpoint:  # (its TRUNCATE ends within milliseconds: no back-off grown past its end)
        assert max(delays) <= inline.InlineSqlite.CKPT_BACKOFF
    else:  # another process's lock: the usual back-off, doubling up to MAX_BACKOFF
        assert delays == sorted(delays) and delays[-1] == inline.InlineSqlite.MAX_BACKOFF


def test_busy_is_what_a_locked_database_raises() -> None:  # (the test above relies on it)
    db = inline.InlineSqlite(":memory:", False, "NORMAL", 5.0, "test")

    def locked(conn: Any) -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(Busy):
        db._call(locked)
    db.close_now()

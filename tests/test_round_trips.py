"""What a run and a batch item send to the store together (one round trip on PostgreSQL).

A run takes its session's lease and reads the session in one send, the read after the
insert (an insert that wins means nobody held the session, so the read is current); when the
insert does not win at once (a lease to take over), the session is read again once the lease
is held. A batch item's lease release goes with its end.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from batchkit import Ledger, make_agent
from sql_support import Backend
from we0nb import FunctionModel, SessionBusyError, We0Agent, text, user_message
from we0nb.persistence.sql import pg_group
from we0nb.persistence.sql import statements as q

SQL_STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every send to PostgreSQL, as its entries: a statement's name, or ``commit``."""
    out: list[list[str]] = []
    send = pg_group.GroupCommit._send

    async def recording(self: Any, group: list) -> None:
        out.append([e.stmt.name if isinstance(e, pg_group._Statement) else "commit" for e in group])
        await send(self, group)

    monkeypatch.setattr(pg_group.GroupCommit, "_send", recording)
    return out


def _agent(store: Any) -> We0Agent:
    return We0Agent(FunctionModel(lambda request: [text("hi")]), persistence=store)


@pytest.mark.postgres
async def test_the_lease_and_the_session_go_to_postgresql_in_one_round_trip(pg: Backend, sends: list) -> None:
    store = pg.fresh()
    agent = _agent(store)
    await store.list_sessions()  # (the schema made first)
    for _ in range(2):  # a new session, then the same one again
        sends.clear()
        await agent.invoke(session_id="ses_rt", messages=[user_message("hello")])
        assert sends[0] == ["lease_insert", "get_session"]
        assert "lease_insert" not in [k for s in sends[1:] for k in s]
    tr = await store.load_transcript("ses_rt")
    assert [m.info.role for m in tr.messages] == ["user", "assistant"] * 2  # the second run saw the first


async def test_a_lease_taken_over_reads_the_session_again_once_held(sql: Backend,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    store = sql.fresh()
    await _agent(store).invoke(session_id="ses_t", messages=[user_message("one")])
    # a lease left by a run on another machine, expired: taken over, not inserted
    sql.raw("INSERT INTO we0_leases (session_id, owner, host, pid, run_id, expires) "
            "VALUES ('ses_t', 'elsewhere:1:run_x', 'elsewhere', 1, 'run_x', 1)")
    reads: list[str] = []
    get, run = store._db.fetchall, store._db.run

    def seen(stmt: Any) -> None:  # the lease's holder when the session is read
        if stmt is q.GET_SESSION:
            reads.append(sql.raw("SELECT owner FROM we0_leases WHERE session_id = 'ses_t'")[0][0])

    async def counting(stmt: Any, params: dict) -> list:
        seen(stmt)
        return await get(stmt, params)

    async def counting_run(calls: list) -> list:  # (sent with the lease's insert: read after it)
        out = await run(calls)
        for stmt, _, _ in calls:
            seen(stmt)
        return out

    monkeypatch.setattr(store._db, "fetchall", counting)
    monkeypatch.setattr(store._db, "run", counting_run)
    lease, session = await store.lease_and_session("ses_t", "run_mine")
    try:
        assert session is not None and session.id == "ses_t"
        # the session is read (again) once this run holds the lease: on PostgreSQL a first read went
        # with the insert that lost; on SQLite the insert goes with the pass's group commit, alone
        assert reads and reads[-1] == lease.owner and len(reads) <= 2
    finally:
        await lease.release()


async def test_a_busy_session_is_refused_and_leaves_its_lease_alone(sql: Backend) -> None:
    store = sql.fresh()
    held = await store.acquire_lease("ses_b", "run_one")
    try:
        with pytest.raises(SessionBusyError):
            await store.lease_and_session("ses_b", "run_two")
        assert sql.raw("SELECT owner FROM we0_leases WHERE session_id = 'ses_b'") == [(held.owner,)]
    finally:
        await held.release()


async def test_a_session_that_cannot_be_read_gives_its_lease_back(sql: Backend) -> None:
    store = sql.fresh()
    await _agent(store).invoke(session_id="ses_c", messages=[user_message("one")])
    sql.raw("UPDATE we0_sessions SET data = '{not json' WHERE id = 'ses_c'")
    with pytest.raises(Exception, match="ses_c"):
        await _agent(store).invoke(session_id="ses_c", messages=[user_message("two")])
    assert sql.raw("SELECT count(*) FROM we0_leases") == [(0,)]
    assert store._leases.held_here() == 0


@pytest.mark.postgres
async def test_a_batch_items_lease_release_goes_with_its_end(pg: Backend, sends: list, tmp_path: Path) -> None:
    store = pg.fresh()
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=1)
    batch = await agent.batch(["a", "b", "c"], concurrency=1, progress=False)
    assert batch.counts == {"stop": 3}
    ends = [s for s in sends if "batch_end" in s]
    assert len(ends) == 3
    for s in ends:  # one round trip each (the next item was claimed before, once the model was done)
        assert "lease_release" in s
    assert pg.raw("SELECT count(*) FROM we0_leases") == [(0,)]


async def test_no_lease_is_left_once_a_batch_returns(sql: Backend, tmp_path: Path) -> None:
    store = sql.fresh()
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=2)
    batch = await agent.batch([f"p{i}" for i in range(12)], concurrency=4, progress=False)
    assert batch.counts == {"stop": 12}
    assert sql.raw("SELECT count(*) FROM we0_leases") == [(0,)]
    assert store._leases.held_here() == 0
    # and the next batch call on the same sessions (a continuation) is not refused
    again = await agent.batch([f"p{i}" for i in range(12)], name=batch.name, progress=False)
    assert again.counts == {"stop": 12}


async def test_a_lease_release_that_fails_is_logged_and_the_batch_goes_on(sql: Backend, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from we0nb import PersistenceError

    store = sql.fresh()
    execute = store._db.execute
    failed: list[str] = []

    async def flaky(stmt: Any, params: dict) -> int:
        if stmt is q.LEASE_RELEASE and not failed:
            failed.append(params["sid"])
            raise PersistenceError("the database went away (on purpose)")
        return await execute(stmt, params)

    commit = store._db.commit

    async def flaky_commit(ops: Any, guard: Any, **kw: Any) -> Any:  # (SQLite: a release goes with the group)
        if guard is not None and guard[0] is q.LEASE_RELEASE and not failed:
            failed.append(guard[1]["sid"])
            raise PersistenceError("the database went away (on purpose)")
        return await commit(ops, guard, **kw)

    monkeypatch.setattr(store._db, "execute", flaky)
    monkeypatch.setattr(store._db, "commit", flaky_commit)
    agent = make_agent(store, Ledger(tmp_path / "ledger.jsonl"), steps=1)
    with caplog.at_level("WARNING", logger="we0nb.batch"):
        batch = await agent.batch(["a", "b", "c"], concurrency=1, progress=False)
    assert batch.counts == {"stop": 3}  # the item whose release failed had ended: it stays ended
    assert "could not release the lease" in caplog.text and "went away" in caplog.text
    # its lease row is left to expire (this process's own runs take it over at once)
    assert sql.raw("SELECT session_id FROM we0_leases") == [(failed[0],)]
    assert store._leases.held_here() == 0  # (no longer renewed)
    await asyncio.wait_for(_agent(store).invoke(session_id=failed[0], mode="resume"), 10)


def _plan_nodes(plan: dict) -> list[dict]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_plan_nodes(child))
    return out


@pytest.mark.postgres
async def test_a_claim_and_an_end_read_a_handful_of_rows_of_a_large_batch_without_statistics(pg: Backend) -> None:
    """Two of them per item: each must be a lookup, never a scan of the batch — also before the
    planner has any statistics of the table (a new schema, a batch just made), when a join or a
    condition it can read with another index used to scan every item of the batch."""
    import json
    import time

    import psycopg

    from sql_support import PG_URL, _libpq
    from we0nb.persistence.batches import ItemEnd, NewItem
    from we0nb.persistence.sql.statements import BATCH_CLAIM, BATCH_END, compiled

    store = pg.fresh()
    n = 3000
    await store.open_batch("big", [NewItem(prompt=json.dumps([f"p{i}"]), session_id=f"ses_{i}") for i in range(n)],
                           session_ids_given=True, now=time.time())
    t = time.time()
    done = await store.claim_batch_items("big", "h:1:w", n // 2, now=t, expires=t + 60)
    for it in done:  # half the batch ended: the claim passes over nothing of it
        assert await store.end_batch_item("big", it.item, "h:1:w", ItemEnd(status="stop", finished=t, attempts=1))
    running = await store.claim_batch_items("big", "h:1:w", 5, now=t, expires=t + 60)
    assert [it.item for it in running] == list(range(n // 2, n // 2 + 5))
    pg.raw("DELETE FROM pg_statistic WHERE starelid = 'we0_batch_items'::regclass")  # (none, as in a new schema)

    sql = compiled("postgresql")
    claim = {"b": "big", "owner": "h:1:w2", "host": "h", "pid": 1, "n": 1, "now": t, "expires": t + 60, "ttl": 60.0,
             "now_ofs": 0.0, "token": "clm_1"}
    end = {"b": "big", "holder": "h:1:w", "item": running[0].item, "run_time": 0.1, "status": "stop",
           "queued": False, "expires": 0.0, "attempts": 1, "started": t, "finished": t, "text": None, "output": None,
           "error": None, "steps": 1, "tool_calls": 0, "input_tokens": 0, "output_tokens": 0, "delay": None}
    for key, params in ((BATCH_CLAIM, claim), (BATCH_END, end)):
        with psycopg.connect(_libpq(PG_URL)) as conn:
            conn.execute(f'SET search_path TO "{store.schema}"')
            (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql[key], params).fetchone()
            conn.rollback()
        nodes = _plan_nodes(plan["Plan"])
        read = sum(node.get("Actual Rows", 0) * node.get("Actual Loops", 1) + node.get("Rows Removed by Filter", 0)
                   for node in nodes if "Scan" in node["Node Type"])
        assert read <= 20, (key, read, [node["Node Type"] for node in nodes])

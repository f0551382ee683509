"""PostgreSQL's own path (``persistence/sql/pg.py``) and its group commit (``pg_group.py``).

Commits that many runs make at once go to the server together; each must still get its own
outcome: written, refused for a lost lease (writing nothing), or its own error — and a group
must write what the same commits one by one would have written.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sql_support import Backend, user_write
from we0nb import PersistenceError, Session, SqlPersistence
from we0nb._ids import new_id
from we0nb.errors import LeaseLostError
from we0nb.messages import SessionTime
from we0nb.persistence.sql import pg_group
from we0nb.persistence.sql import statements as q
from we0nb.persistence.sql.engine import AsyncEngines
from we0nb.persistence.sql.pg import PgConnections

pytestmark = pytest.mark.postgres


@pytest.fixture
def group_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every group sent (the commits of one round trip)."""
    sizes: list[int] = []
    together = pg_group.GroupCommit._together

    async def recording(self: Any, group: list) -> list[bool]:
        sizes.append(len(group))
        return await together(self, group)

    monkeypatch.setattr(pg_group.GroupCommit, "_together", recording)
    return sizes




async def _texts(p: Any, sid: str) -> list[str]:
    await p.upsert_session(Session(id=sid, title="t", time=SessionTime(created=1.0, updated=2.0)))
    tr = await p.load_transcript(sid)
    return [part.text for m in tr.messages for part in m.parts]


async def _leases_one_lost(pg: Backend, p: Any, n: int, lost_at: int) -> tuple[list[str], list[Any], str]:
    """``n`` sessions with a lease each (long-lived); the one at ``lost_at`` taken by another host."""
    p.lease_ttl, p.lease_renew = 600.0, 500.0
    sids = [new_id("ses") for _ in range(n)]
    leases = [await p.acquire_lease(sid, f"run_{i}") for i, sid in enumerate(sids)]
    lost = sids[lost_at]
    pg.raw(f"UPDATE we0_leases SET owner = 'elsewhere:1:run_x', host = 'elsewhere' WHERE session_id = '{lost}'")
    return sids, leases, lost


def test_a_postgresql_url_takes_the_own_path_and_other_engine_options_sqlalchemys(pg: Backend) -> None:
    assert isinstance(pg.fresh()._db, PgConnections)
    url = pg.fresh().url
    assert isinstance(SqlPersistence(url, engine_options={"pool_size": 3, "max_overflow": 0})._db, PgConnections)
    assert isinstance(SqlPersistence(url, engine_options={"pool_pre_ping": True})._db, AsyncEngines)


async def test_concurrent_commits_go_together_and_each_gets_its_own_outcome(pg: Backend, group_sizes: list) -> None:
    p = pg.fresh()
    sids, leases, lost = await _leases_one_lost(pg, p, 40, 7)
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    outcomes = await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease)
                                      for (u, t), lease in zip(writes, leases)), return_exceptions=True)
    assert max(group_sizes) > 1  # they did go together
    for sid, outcome in zip(sids, outcomes):
        if sid == lost:
            assert isinstance(outcome, LeaseLostError) and outcome.session_id == sid
        else:
            assert outcome is None
    reader = pg.fresh()
    for i, sid in enumerate(sids):
        assert await _texts(reader, sid) == ([] if sid == lost else [f"body {i}"])
    renewed = pg.raw("SELECT count(*) FROM we0_leases WHERE expires > 1000 AND owner <> 'elsewhere:1:run_x'")
    assert renewed == [(39,)]


async def test_session_rows_go_in_the_group_and_only_where_the_lease_is_held(pg: Backend, group_sizes: list) -> None:
    p = pg.fresh()
    sids, leases, lost = await _leases_one_lost(pg, p, 20, 3)
    sessions = [Session(id=sid, title=f"title {i}", time=SessionTime(created=1.0, updated=2.0 + i))
                for i, sid in enumerate(sids)]
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    outcomes = await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease, session=s)
                                      for (u, t), lease, s in zip(writes, leases, sessions)), return_exceptions=True)
    assert max(group_sizes) > 1
    assert isinstance(outcomes[3], LeaseLostError) and [o for i, o in enumerate(outcomes) if i != 3] == [None] * 19
    reader = pg.fresh()
    for i, sid in enumerate(sids):
        tr = await reader.load_transcript(sid)
        if sid == lost:
            assert tr.session is None and tr.messages == []
        else:
            assert tr.session == sessions[i] and [m.parts[0].text for m in tr.messages] == [f"body {i}"]


async def test_a_value_the_server_refuses_fails_only_its_own_commit(pg: Backend, group_sizes: list) -> None:
    p = pg.fresh()
    sids = [new_id("ses") for _ in range(12)]
    leases = [await p.acquire_lease(sid, f"run_{i}") for i, sid in enumerate(sids)]
    writes = [user_write(sid, f"body {i}") for i, sid in enumerate(sids)]
    bad_u, bad_t = writes[5]
    writes[5] = (bad_u, bad_t.model_copy(update={"id": "prt_with\x00nul"}))  # PostgreSQL text holds no NUL
    outcomes = await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease)
                                      for (u, t), lease in zip(writes, leases)), return_exceptions=True)
    assert max(group_sizes) > 1
    assert isinstance(outcomes[5], PersistenceError) and "NUL" in str(outcomes[5])
    assert [o for i, o in enumerate(outcomes) if i != 5] == [None] * 11
    reader = pg.fresh()
    for i, sid in enumerate(sids):
        assert await _texts(reader, sid) == ([] if i == 5 else [f"body {i}"])


async def test_a_row_written_twice_in_one_group_keeps_the_later_write(pg: Backend, group_sizes: list) -> None:
    p = pg.fresh()
    sid = new_id("ses")
    lease = await p.acquire_lease(sid, "run_a")
    u, t = user_write(sid, "first")
    others = [(await p.acquire_lease(s, f"run_{s}"), user_write(s, "x")) for s in (new_id("ses") for _ in range(5))]
    await asyncio.gather(
        *(p.commit([(ou, [ot], None)], lease=ol) for ol, (ou, ot) in others),  # keeps a send busy
        p.commit([(u, [t], None)], lease=lease),
        p.commit([(None, [t.model_copy(update={"text": "second"})], None)], lease=lease),
    )
    assert any(n > 1 for n in group_sizes)
    assert await _texts(pg.fresh(), sid) == ["second"]


async def test_a_grouped_commit_keeps_the_message_view_it_writes_with_its_parts(pg: Backend) -> None:
    """Parts before messages, as on the one-commit path: the part trigger must not drop the new view."""
    p = pg.fresh()
    sids = [new_id("ses") for _ in range(6)]
    leases = [await p.acquire_lease(sid, "run") for sid in sids]
    writes = [user_write(sid, "hi") for sid in sids]
    await asyncio.gather(*(p.commit([(u, [t], '{"view": 1}')], lease=lease)
                           for (u, t), lease in zip(writes, leases)))
    views = pg.raw("SELECT model_view FROM we0_messages ORDER BY id")
    assert views == [('{"view": 1}',)] * 6


async def test_a_commit_with_nothing_to_write_still_renews_its_lease_in_a_group(pg: Backend) -> None:
    p = pg.fresh()
    p.lease_ttl = 600.0
    sids = [new_id("ses") for _ in range(4)]
    leases = [await p.acquire_lease(sid, "run") for sid in sids]
    pg.raw("UPDATE we0_leases SET expires = 1")
    await asyncio.gather(*(p.commit([], lease=lease) for lease in leases))
    assert pg.raw("SELECT count(*) FROM we0_leases WHERE expires > 2") == [(4,)]


async def test_a_cancelled_statement_never_puts_its_connection_back(pg: Backend) -> None:
    """A statement cancelled mid-flight leaves its connection in an unknown state: it is closed."""
    p = pg.fresh()
    await p.list_sessions()  # the pool holds one idle connection
    db = p._db
    pool = await db.pool()
    task = asyncio.ensure_future(db.fetchall(q.HAS_TABLE, {"name": "we0_meta"}))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for conn in pool.idle:
        assert not conn.closed and conn.info.transaction_status.name == "IDLE"
    assert await p.list_sessions() == []


async def test_a_commit_whose_caller_gave_up_still_lands_before_the_sessions_next(pg: Backend,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller cancelled while its commit is on the wire: the session's next commit must land
    after it (else the older write would be the one left)."""
    p = pg.fresh()
    sid, other = new_id("ses"), new_id("ses")
    lease, other_lease = await p.acquire_lease(sid, "run_a"), await p.acquire_lease(other, "run_b")
    u, t = user_write(sid, "one")
    ou, ot = user_write(other, "x")
    gate, held = asyncio.Event(), asyncio.Event()
    send = pg_group.GroupCommit._send

    async def slow_first(self: Any, group: list) -> None:
        if not held.is_set():  # the first send waits (as on a slow link) until the test opens the gate
            held.set()
            await gate.wait()
        await send(self, group)

    monkeypatch.setattr(pg_group.GroupCommit, "_send", slow_first)
    first = asyncio.gather(p.commit([(u, [t], None)], lease=lease), p.commit([(ou, [ot], None)], lease=other_lease))
    await held.wait()
    first.cancel()  # the caller gives up: its commit is already on its way
    with pytest.raises(asyncio.CancelledError):
        await first
    later = asyncio.ensure_future(p.commit([(None, [t.model_copy(update={"text": "two"})], None)], lease=lease))
    await asyncio.sleep(0.05)
    assert not later.done()  # it waits for the send under way
    gate.set()
    await later
    assert await _texts(pg.fresh(), sid) == ["two"]


async def test_a_commit_is_written_even_when_its_caller_is_cancelled_before_it_is_sent(
        pg: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's writer lets go of the rows it hands to a commit: a commit queued behind a send
    under way must still be written if its caller is cancelled (a Ctrl-C) before it goes."""
    p = pg.fresh()
    sid, other = new_id("ses"), new_id("ses")
    lease, other_lease = await p.acquire_lease(sid, "run_a"), await p.acquire_lease(other, "run_b")
    gate, held = asyncio.Event(), asyncio.Event()
    send = pg_group.GroupCommit._send

    async def slow_first(self: Any, group: list) -> None:
        if not held.is_set():
            held.set()
            await gate.wait()
        await send(self, group)

    monkeypatch.setattr(pg_group.GroupCommit, "_send", slow_first)
    ou, ot = user_write(other, "x")
    busy = asyncio.ensure_future(p.commit([(ou, [ot], None)], lease=other_lease))
    await held.wait()
    u, t = user_write(sid, "queued")
    queued = asyncio.ensure_future(p.commit([(u, [t], None)], lease=lease))
    await asyncio.sleep(0.02)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    gate.set()
    await busy
    for _ in range(100):  # the sender goes on with the queue after the busy send
        if await _texts(pg.fresh(), sid):
            break
        await asyncio.sleep(0.01)
    assert await _texts(pg.fresh(), sid) == ["queued"]


TRICKY = ["plain", "it's", "''", "\\", "\\'", "'); DROP TABLE we0_parts; --", "$$ $a$ E'x'", "naïve 中文 🙂",
          "line\nbreak\ttab\r", "%s %(x)s {}", ""]


def test_literals_of_a_grouped_commit_round_trip_through_the_server(pg: Backend) -> None:
    """What the group writes by its own literals is what the server reads back, quotes and all."""
    import math

    import psycopg

    from sql_support import PG_URL, _libpq

    floats = [0.0, -0.0, 1.5, 1e-300, 1.7976931348623157e308, float("inf"), float("-inf"), float("nan")]
    ints = [0, -1, 2 ** 62]
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        assert conn.info.parameter_status("standard_conforming_strings") == "on"
        for v in TRICKY:
            assert conn.execute(f"SELECT CAST(v.x AS VARCHAR) FROM (VALUES ({pg_group._literal(v)})) AS v(x)"
                                ).fetchone() == (v,)
        for f in floats:
            (got,) = conn.execute(f"SELECT CAST(v.x AS FLOAT) FROM (VALUES ({pg_group._literal(f)})) AS v(x)").fetchone()
            assert (math.isnan(got) and math.isnan(f)) or (got == f and math.copysign(1, got) == math.copysign(1, f))
        for i in ints:
            assert conn.execute(f"SELECT CAST(v.x AS BIGINT) FROM (VALUES ({pg_group._literal(i)})) AS v(x)"
                                ).fetchone() == (i,)
        for b in (True, False, None):
            assert conn.execute(f"SELECT CAST(v.x AS BOOLEAN) FROM (VALUES ({pg_group._literal(b)})) AS v(x)"
                                ).fetchone() == (b,)
    with pytest.raises(TypeError):
        pg_group._literal(b"bytes")


async def test_tricky_text_is_stored_exactly_by_a_grouped_commit(pg: Backend, group_sizes: list) -> None:
    p = pg.fresh()
    sids = [new_id("ses") for _ in TRICKY]
    leases = [await p.acquire_lease(sid, "run") for sid in sids]
    writes = [user_write(sid, body) for sid, body in zip(sids, TRICKY)]
    await asyncio.gather(*(p.commit([(u, [t], None)], lease=lease) for (u, t), lease in zip(writes, leases)))
    assert max(group_sizes) > 1
    reader = pg.fresh()
    assert [await _texts(reader, sid) for sid in sids] == [[body] for body in TRICKY]


async def test_single_statements_of_many_runs_go_together_and_answer_as_alone(pg: Backend,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads and single writes sent together give what each gives alone (rows, row counts)."""
    kinds: list[list[str]] = []
    together = pg_group.GroupCommit._together

    async def recording(self: Any, group: list) -> list:
        kinds.append([e.stmt.name for e in group if isinstance(e, pg_group._Statement)])
        return await together(self, group)

    monkeypatch.setattr(pg_group.GroupCommit, "_together", recording)
    p = pg.fresh()
    sessions = [Session(id=f"s{i}-it's", title=f"t{i} 'quoted' \\ %s", time=SessionTime(created=1.5, updated=-0.0))
                for i in range(20)]
    await asyncio.gather(*(p.upsert_session(s) for s in sessions))
    got = await asyncio.gather(*(p.get_session(s.id) for s in sessions), p.get_session("absent"))
    assert got == [*sessions, None]
    leases = await asyncio.gather(*(p.acquire_lease(s.id, "run") for s in sessions))  # inserts: one row each
    assert all(not lease.lost for lease in leases)
    await asyncio.gather(*(lease.release() for lease in leases))
    assert pg.raw("SELECT count(*) FROM we0_leases") == [(0,)]
    done = {k for group in kinds for k in group}
    assert {"upsert_session", "get_session", "lease_insert", "lease_release"} <= done and max(map(len, kinds)) > 1


def test_a_loops_connections_are_closed_on_that_loop_when_asyncio_run_ends(pg: Backend) -> None:
    p = pg.fresh()
    opened: list[Any] = []

    async def work() -> None:
        await asyncio.gather(*(p.list_sessions() for _ in range(5)), p.get_session("x"))
        opened.extend((await p._db.pool()).open)

    asyncio.run(work())
    assert opened and all(conn.closed for conn in opened)
    assert not p._db.pools
    assert asyncio.run(p.list_sessions()) == []  # a new loop opens new ones


async def test_making_the_schema_leaves_no_idle_connection_of_the_synchronous_engine(pg: Backend) -> None:
    p = pg.fresh()
    await p.list_sessions()  # the first use makes the schema through sync_engine()
    assert p._database._sync_engine is not None and p._database._sync_engine.pool.checkedin() == 0
    import pandas  # noqa: F401  (the frames still read through it: it reconnects)

    from we0nb.notebook import sessions_df

    assert len(sessions_df(p)) == 0


async def test_one_workers_claims_at_once_are_one_claim_shared_out(pg: Backend, group_sizes: list,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's slots turning over at once claim one item each: the group sends one claim of
    their total, and each gets its own items — none twice, none lost."""
    import time

    from we0nb.persistence.batches import NewItem

    merged: list[int] = []
    merge = pg_group._merge_claims

    def recording(statements: list) -> Any:
        sent, shares = merge(statements)
        merged.extend(len(members) for _, members in shares)
        return sent, shares

    monkeypatch.setattr(pg_group, "_merge_claims", recording)
    p = pg.fresh()
    items = [NewItem(prompt=f'["q{i}"]', session_id=new_id("ses")) for i in range(10)]
    await p.open_batch("shared", items, session_ids_given=False, now=time.time())
    t = time.time()
    wants = [1, 2, 1, 1]
    got = await asyncio.gather(*(p.claim_batch_items("shared", "h:1:wrk_a", n, now=t, expires=t + 60) for n in wants))
    got_b = await p.claim_batch_items("shared", "h:1:wrk_b", 10, now=t, expires=t + 60)  # another worker: the rest
    assert [len(g) for g in got] == wants
    assert merged and max(merged) > 1  # (the first may go alone, while no send is under way)
    mine = sorted(it.item for g in got for it in g)
    assert mine == list(range(5)) and sorted(it.item for it in got_b) == list(range(5, 10))
    assert {it.owner for g in got for it in g} == {"h:1:wrk_a"}

"""A claim (or an item's end, or any other statement) whose answer is lost after it committed neither
hangs a batch nor runs an item twice (issue 32, item 1).

A TCP proxy (:mod:`pgproxy`) in front of PostgreSQL lets the statement commit and then drops the
connection before its answer reaches the worker. Before the fix, the group commit sent the claim
again: the worker never learned of the first claim's items, its heartbeat renewed them forever and
``batch()`` never returned (2–8 items stayed ``running``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Optional

import pytest

from batchkit import Ledger, make_agent
from pgproxy import DropAnswer
from sql_support import PG_SKIP_REASON, PG_URL, create_schema, drop_schema
from we0nb import SqlPersistence

pytestmark = pytest.mark.skipif(PG_URL is None, reason=PG_SKIP_REASON)

#: a text only the claim statement holds (its CTE), and one only an item's end holds
CLAIM = b"picked"
END = b"owner=NULL, host=NULL"
#: any statement on the session leases (an insert, a renewal, a run's commit), on the messages (commits, reads)
LEASE, MESSAGES = b"we0_leases", b"we0_messages"
#: engine options beyond psycopg's own path: the store then goes through SQLAlchemy's asyncio engine
ENGINE = {"pool_recycle": 3600}
ITEMS = 16


@pytest.mark.parametrize("marker,nth,options", [
    (CLAIM, 1, None), (CLAIM, 3, None), (END, 2, None), (LEASE, 5, None), (MESSAGES, 30, None),
    (CLAIM, 2, ENGINE), (END, 2, ENGINE)],
    ids=["claim1", "claim3", "end2", "lease5", "messages30", "engine-claim2", "engine-end2"])
async def test_a_lost_answer_neither_hangs_the_batch_nor_runs_an_item_twice(
        tmp_path: Path, marker: bytes, nth: int, options: Optional[dict], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="we0nb")
    schema = create_schema()
    proxy = await DropAnswer(marker, nth).start()
    store = SqlPersistence(proxy.url, schema=schema, lease_ttl=6.0, engine_options=options)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = make_agent(store, ledger, steps=3)
    try:
        result = await asyncio.wait_for(
            agent.batch([f"p{i}" for i in range(ITEMS)], name="lost", concurrency=4, progress=False), timeout=60)
        assert proxy.dropped == 1
        assert result.counts == {"stop": ITEMS}
        items = await store.batch_items("lost")
        assert [(it.status, it.owner) for it in items] == [("stop", None)] * ITEMS  # nothing left running
        assert all(it.attempts == 1 for it in items), [it.attempts for it in items]
        ran = Counter((line["prompt"], line["n"]) for line in ledger.lines())
        assert ran == Counter({(f"p{i}", n): 1 for i in range(ITEMS) for n in (0, 2)})  # no side effect twice
        assert "taken over by another worker" not in caplog.text
    finally:
        await store.close()
        await proxy.close()
        drop_schema(schema)

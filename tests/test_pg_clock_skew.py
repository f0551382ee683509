"""Leases and claims on PostgreSQL follow the server's clock, not each worker's (issue 32, item 3).

Two worker processes share one batch; one's wall clock is 60 s behind or ahead (``time.time``
patched in the child: ``batch_worker.py --skew``). Before, claims and leases expired at the
worker's ``now() + ttl``: the other worker saw a live worker's claims as expired (or its own
lasting 60 s too long) and took items from a live worker, running them again (18 of 24 items
with a worker 60 s behind). Now every expiry is the server's ``now() + ttl`` and every takeover is
decided by the server's clock: no item is taken from a live worker, no side effect runs twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from batchkit import Ledger
from sql_support import PG_SKIP_REASON, PG_URL, create_schema, drop_schema
from we0nb import SqlPersistence

pytestmark = [pytest.mark.postgres, pytest.mark.skipif(PG_URL is None, reason=PG_SKIP_REASON)]

WORKER = Path(__file__).with_name("batch_worker.py")
ITEMS = 24


@pytest.fixture
def schema():
    name = create_schema()
    yield name
    drop_schema(name)


def start(schema: str, ledger: Path, log: Path, skew: float) -> subprocess.Popen:
    assert PG_URL is not None
    args = [sys.executable, str(WORKER), "--url", PG_URL, "--schema", schema, "--name", "skew", "--items",
            str(ITEMS), "--ledger", str(ledger), "--concurrency", "3", "--delay", "0.05", "--tool-delay", "0.2",
            "--skew", str(skew)]
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=dict(os.environ))


@pytest.mark.parametrize("skew", [-60.0, 60.0], ids=["behind", "ahead"])
def test_a_worker_whose_clock_is_a_minute_off_takes_nothing_from_a_live_worker(schema: str, tmp_path: Path,
                                                                                 skew: float) -> None:
    ledger = tmp_path / "ledger.jsonl"
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    procs = [start(schema, ledger, logs[0], 0.0), start(schema, ledger, logs[1], skew)]
    for p in procs:
        assert p.wait(timeout=240) == 0, "\n".join(log.read_text() for log in logs)
    results = [json.loads(line[7:]) for log in logs for line in log.read_text().splitlines()
               if line.startswith("RESULT ")]
    assert [r["counts"] for r in results] == [{"stop": ITEMS}] * 2
    ran = Counter((x["prompt"], x["n"]) for x in Ledger(ledger).lines())
    assert ran == Counter({(f"p{i}", n): 1 for i in range(ITEMS) for n in (0, 2)}), "a side effect ran twice"
    assert len({x["pid"] for x in Ledger(ledger).lines()}) == 2  # both worked
    items = asyncio.run(_items(schema))
    taken = [it.item for it in items if it.attempts > 1]
    assert [it.status for it in items] == ["stop"] * ITEMS
    assert not taken, f"{len(taken)} of {ITEMS} items were taken from a live worker: {taken}"


async def _items(schema: str) -> list:
    store = SqlPersistence(PG_URL, schema=schema)
    try:
        return await store.batch_items("skew")
    finally:
        await store.close()


@pytest.mark.parametrize("skew", [-60.0, 60.0], ids=["behind", "ahead"])
async def test_a_session_lease_is_taken_over_by_the_servers_clock(schema: str, skew: float,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A lease another host holds is busy until the *server* says it expired, whatever this process's
    clock says: 60 s ahead it does not take a live lease; 60 s behind it takes an expired one."""
    import time

    from sql_support import pg_execute
    from we0nb import SessionBusyError

    holder, taker = SqlPersistence(PG_URL, schema=schema), SqlPersistence(PG_URL, schema=schema)
    try:
        lease = await holder.acquire_lease("s", "run_a")
        pg_execute(schema, "UPDATE we0_leases SET host = 'otherhost'")  # (a live run on another host)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + skew)
        if skew > 0:
            with pytest.raises(SessionBusyError):
                await taker.acquire_lease("s", "run_b")
        else:
            pg_execute(schema, "UPDATE we0_leases SET expires = EXTRACT(EPOCH FROM now()) - 1")  # it lapsed
            taken = await taker.acquire_lease("s", "run_b")
            rows = pg_execute(schema, "SELECT owner, expires - EXTRACT(EPOCH FROM now()) FROM we0_leases")
            assert rows[0][0] == taken.owner and 0 < rows[0][1] <= taker.lease_ttl + 1  # the server's now + ttl
            await taken.release()
        monkeypatch.setattr(time, "time", real)
        lease.released = True  # (its row is another's now, or the test's)
    finally:
        monkeypatch.undo()
        await holder.close()
        await taker.close()

"""A process that works on one shared batch: ``agent.batch(prompts, name=…)`` on a database.

Used by ``test_batch_processes.py``: several of these share a batch on PostgreSQL; one is
killed with SIGKILL in the middle of an item. Side effects (the ``act`` tool) go to an
append-only ledger file (``--ledger``), the ground truth of what ran. The worker prints
``STARTED`` once it has begun, and ``RESULT <json>`` (its BatchResult's counts) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from batchkit import Ledger, make_agent  # noqa: E402


def skew(seconds: float) -> None:
    """This process's wall clock ``seconds`` off (a host whose clock is wrong), before we0nb reads it."""
    import time

    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + seconds  # type: ignore[assignment]
    time.time_ns = lambda: real_ns() + int(seconds * 1e9)  # type: ignore[assignment]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--schema", default=None)
    ap.add_argument("--name", required=True)
    ap.add_argument("--items", type=int, required=True)
    ap.add_argument("--ledger", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.02)
    ap.add_argument("--tool-delay", type=float, default=0.05)
    ap.add_argument("--lease-ttl", type=float, default=15.0)
    ap.add_argument("--skew", type=float, default=0.0, help="seconds this process's clock is off (time.time)")
    a = ap.parse_args()
    if a.skew:
        skew(a.skew)
    from we0nb import SqlPersistence

    store = SqlPersistence(a.url, schema=a.schema, lease_ttl=a.lease_ttl)
    agent = make_agent(store, Ledger(a.ledger), delay=a.delay, tool_delay=a.tool_delay)
    print("STARTED", os.getpid(), flush=True)
    batch = await agent.batch([f"p{i}" for i in range(a.items)], name=a.name, concurrency=a.concurrency,
                              progress=False)
    print("RESULT " + json.dumps({"counts": batch.counts, "stopped": batch.stopped}), flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main())

"""A claim the worker never learned of is released by its heartbeat, not renewed for ever (issue 32, item 1).

The second line of defence behind the claim token (see ``test_pg_lost_answer.py``): here the
store claims items and the answer never reaches the worker (its first claim answers nothing),
on SQLite, where no connection can drop. Before, the heartbeat renewed those items for ever
and ``batch()`` never returned.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from batchkit import Ledger, make_agent
from we0nb import SqlPersistence

ITEMS = 8


async def test_claims_whose_answer_never_came_are_released_and_run_once(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="we0nb")
    store = SqlPersistence(f"sqlite:///{tmp_path / 'lost.db'}", lease_ttl=0.9)
    claim = store.claim_batch_items
    lost: list[int] = []

    async def answer_lost_once(*a: Any, **kw: Any) -> Any:
        got = await claim(*a, **kw)
        if not lost and got:
            lost.extend(it.item for it in got)
            return []  # claimed in the database; the worker never hears of it
        return got

    store.claim_batch_items = answer_lost_once  # type: ignore[method-assign]
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = make_agent(store, ledger, steps=3)
    try:
        result = await asyncio.wait_for(
            agent.batch([f"p{i}" for i in range(ITEMS)], name="lost", concurrency=2, progress=False), timeout=60)
        assert lost and result.counts == {"stop": ITEMS}
        items = await store.batch_items("lost")
        assert [(it.status, it.owner) for it in items] == [("stop", None)] * ITEMS
        ran = Counter((line["prompt"], line["n"]) for line in ledger.lines())
        assert ran == Counter({(f"p{i}", n): 1 for i in range(ITEMS) for n in (0, 2)})
        assert "that no claim of its returned" in caplog.text
    finally:
        await store.close()

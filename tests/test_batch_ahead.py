"""Items taken ahead (``we0nb.batch.ahead``): a worker claims a few items, with their sessions'
leases, before a slot asks, so a slot's next run starts without a round trip — and whatever
it took ahead and never ran is given back as it was."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from we0nb import MemoryPersistence, SessionBusyError, user_message
from we0nb.batch import item as item_module
from we0nb.batch.ahead import Ahead, ahead_size
from we0nb.batch.item import Ready, give_back, reserve
from we0nb.batch.runner import Worker
from we0nb.engine.run import Run, RunOptions
from we0nb.persistence.batches import NewItem

from batchkit import Ledger, make_agent

OWNER = "h:1:wrk_ahead"


#: stores whose commits wait: the ones a worker takes items ahead on
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def agent_on(store: Any, tmp_path: Path, **kw: Any) -> Any:
    return make_agent(store, Ledger(tmp_path / "ledger.jsonl"), **kw)


async def open_items(store: Any, name: str, n: int) -> None:
    items = [NewItem(prompt=f'["q{i}"]', session_id=f"{name}-s{i}") for i in range(n)]
    await store.open_batch(name, items, session_ids_given=True, now=time.time())


def claimer(store: Any, name: str) -> Any:
    async def claim(n: int) -> list[Any]:
        t = time.time()
        return await store.claim_batch_items(name, OWNER, n, now=t, expires=t + 60)

    return claim


async def session_is_free(store: Any, session_id: str) -> bool:
    try:
        lease = await store.acquire_lease(session_id, "run_probe")
    except SessionBusyError:
        return False
    await lease.release()
    return True


def test_a_third_of_the_concurrency_is_taken_ahead_on_stores_whose_commits_wait(tmp_path) -> None:
    assert ahead_size(100, True) == 33 and ahead_size(3, True) == 2 and ahead_size(100, False) == 0
    worker = Worker(agent_on(MemoryPersistence(), tmp_path), "b", concurrency=100,
                    stop=asyncio.Event(), max_failures=None, own_sessions=True, progress=None)
    assert worker.ahead.size == 0  # a store that answers at once: a claim and a lease cost no wait


async def test_slots_start_runs_on_leases_taken_ahead_and_each_session_is_leased_once(store, tmp_path,
                                                                                       monkeypatch) -> None:
    held: list[bool] = []

    class Recording(Run):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            held.append(self.options.held is not None)

    leased: list[str] = []
    lease_and_session = store.lease_and_session

    async def counted(session_id: str, run_id: str) -> Any:
        leased.append(session_id)
        return await lease_and_session(session_id, run_id)

    monkeypatch.setattr(item_module, "Run", Recording)
    monkeypatch.setattr(store, "lease_and_session", counted)
    batch = await agent_on(store, tmp_path, steps=1, delay=0.01).batch([f"p{i}" for i in range(24)], name="ahead",
                                                                      concurrency=3, progress=False)
    assert batch.counts == {"stop": 24}
    assert len(held) == 24 and sum(held) >= 12, held  # (the first three are claimed by the slots themselves)
    assert sorted(leased) == sorted(batch.df["session_id"])  # none leased twice, none left leased
    for sid in batch.df["session_id"]:
        assert await session_is_free(store, sid)


async def test_items_refilled_while_a_slot_takes_one_are_all_kept(store, tmp_path, monkeypatch) -> None:
    """A refill adds its items to the list as it is once their leases are held — not to the
    list it started from, which a slot's take replaced meanwhile (they were lost, never run)."""
    await open_items(store, "race", 3)
    agent = agent_on(store, tmp_path)
    gate, waiting = asyncio.Event(), []
    lease_and_session = store.lease_and_session

    async def gated(session_id: str, run_id: str) -> Any:
        waiting.append(session_id)
        await gate.wait()
        return await lease_and_session(session_id, run_id)

    ahead = Ahead(agent, asyncio.Event(), 3, claimer(store, "race"))
    ahead.items = (await claimer(store, "race")(1))
    monkeypatch.setattr(store, "lease_and_session", gated)
    ahead.top_up()
    while len(waiting) < 2:  # (the refill's two items wait for their leases)
        await asyncio.sleep(0.001)
    (first,) = ahead.take()
    gate.set()
    assert ahead.filling is not None
    await ahead.filling
    assert first.item == 0 and [r.item.item for r in ahead.items] == [1, 2]
    assert all(isinstance(r, Ready) and r.held is not None for r in ahead.items)
    await ahead.give_back_all(store, "race", OWNER)


async def test_a_worker_that_stops_gives_back_what_it_took_ahead_as_it_was(store, tmp_path, monkeypatch) -> None:
    await open_items(store, "back", 5)
    agent = agent_on(store, tmp_path)
    ahead = Ahead(agent, asyncio.Event(), 2, claimer(store, "back"))
    ahead.top_up()
    await ahead.filling
    assert [r.item.item for r in ahead.items] == [0, 1]
    gate = asyncio.Event()
    claim = ahead.claim

    async def slow_claim(n: int) -> list[Any]:
        await gate.wait()
        return await claim(n)

    ahead.claim = slow_claim
    (taken,) = ahead.take()  # a refill starts, and waits
    await taken.held[0].release()
    closing = asyncio.ensure_future(ahead.give_back_all(store, "back", OWNER))
    await asyncio.sleep(0.05)
    assert not closing.done()  # it waits for the refill under way: those items are given back too
    gate.set()
    await closing
    by_item = {it.item: it for it in await store.batch_items("back")}
    assert by_item[0].status == "running"  # taken by a slot: not the worker's to give back
    for i in (1, 2, 3, 4):  # left ahead (1), claimed by the refill under way (2), never claimed (3, 4)
        it = by_item[i]
        assert (it.status, it.attempts, it.owner, it.started) == ("pending", 0, None, None), it
        assert await session_is_free(store, it.session_id)
    assert ahead.items == []


async def test_a_worker_paused_by_a_rate_limit_gives_back_what_it_took_ahead(store, tmp_path) -> None:
    """Other workers may run those items meanwhile; nothing of this worker's stays ``running``."""
    agent = agent_on(store, tmp_path, steps=0, delay=0.02, rate_limit={"p0": 1})
    seen: list[list[str]] = []

    async def watch() -> None:
        while True:
            items = await store.batch_items("paused")
            if items and items[0].error and items[0].error.startswith("rate limited"):  # the pause began
                await asyncio.sleep(0.3)  # (it lasts 1 s)
                seen.append([it.status for it in await store.batch_items("paused")])
                return
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    batch = await agent.batch([f"p{i}" for i in range(6)], name="paused", concurrency=1, progress=False)
    await watcher
    assert batch.counts == {"stop": 6}
    assert seen and "running" not in seen[0], seen  # (the two taken ahead were given back)
    assert batch.items[0].attempts == 2 and all(it.attempts == 1 for it in batch.items[1:])


async def test_an_item_whose_session_is_busy_is_kept_without_its_lease(store, tmp_path) -> None:
    """Its run meets the busy session again and ends as usual (put back for later)."""
    await open_items(store, "busy", 1)
    (it,) = await claimer(store, "busy")(1)
    other = await store.acquire_lease(it.session_id, "run_other")
    try:
        got = await reserve(agent_on(store, tmp_path), it, asyncio.Event())
    finally:
        await other.release()
    assert got is it
    await give_back(store, "busy", OWNER, got)
    (back,) = await store.batch_items("busy")
    assert (back.status, back.attempts, back.owner) == ("pending", 0, None)


async def test_a_run_starts_from_the_lease_it_is_given_and_releases_it_if_aborted_first(store, tmp_path) -> None:
    agent = agent_on(store, tmp_path, steps=0)
    request = agent.build_request(session_id="given", messages=[user_message("hi")])
    other = await store.acquire_lease("given", "run_else")
    with pytest.raises(ValueError, match="taken for run 'run_else'"):
        Run(agent, request, structured=False, options=RunOptions(held=(other, None)))
    await other.release()
    abort = asyncio.Event()
    abort.set()
    cut = agent.build_request(session_id="cut", messages=[user_message("hi")], abort=abort)
    run = Run(agent, cut, structured=False, options=RunOptions(held=await store.lease_and_session("cut", cut.run_id)))
    with pytest.raises(asyncio.CancelledError):
        async for _ in run.events():
            pass
    assert await session_is_free(store, "cut")
    ok = agent.build_request(session_id="ok", messages=[user_message("hi")])
    run = Run(agent, ok, structured=False, options=RunOptions(held=await store.lease_and_session("ok", ok.run_id)))
    async for _ in run.events():
        pass
    assert run.result is not None and run.result.text == "answer to hi"
    assert await session_is_free(store, "ok")


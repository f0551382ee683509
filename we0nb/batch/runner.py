"""The batch worker: claim items, run them ``concurrency`` at a time, record each end.

Several workers — this process's and other processes' on the same database — share one
batch through the store's claims (:mod:`we0nb.persistence.batches`): each claims the next
claimable items, keeps its claims alive with a heartbeat, and records each item's end
(conditional on still holding it). When nothing is left to claim, a worker waits for the
items other live workers hold, taking over those of a worker that died (its claims expire,
or at once when its process is gone from this host). That is the whole scheduler.

A worker never holds a claim it does not know of: each claim carries a token the worker
chooses (a claim whose answer was lost is answered with its own rows), and the heartbeat
releases, instead of renewing, any item the store says this worker holds that no claim of
its returned (while no claim is under way).

A stop (the caller's abort, or ``max_failures``) cuts the running items — each run persists
what it produced and ends ``aborted`` — and claims nothing more: the never-started items
stay ``pending`` for the next call with the same name. A budget (``max_cost``) that is spent
claims nothing more but lets the running items end (see :class:`Budget`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Coroutine, Optional

from .._ids import new_id, now
from ..persistence.base import lease_owner
from ..persistence.batches import BatchItem, BatchQueue, batch_queue
from .ahead import Ahead, ahead_size
from .heap import frozen_heap
from .item import ItemOutcome, Ready, released, run_item

__all__ = ["Worker", "LIVE_WORKERS"]

log = logging.getLogger("we0nb.batch")

#: owners of the batch workers running in this process (a claim of this PID whose owner is
#: not here belongs to a worker that is gone: it is taken over at once)
LIVE_WORKERS: set[str] = set()


class Worker:
    """One ``agent.batch()`` call's share of the work on batch ``name``."""

    #: seconds between looks at the batch while other workers hold its last items
    POLL = 0.2
    #: the first back-off after a rate limit (doubled up to MAX_BACKOFF while they go on)
    BACKOFF = 1.0
    MAX_BACKOFF = 60.0

    def __init__(self, agent: Any, name: str, *, concurrency: int, stop: asyncio.Event,
                 max_failures: Optional[int], own_sessions: bool, progress: Any, max_cost: Optional[float] = None):
        self.agent, self.name = agent, name
        self.store: BatchQueue = batch_queue(agent.persistence)
        self.concurrency = concurrency
        self.stop = stop
        self.max_failures = max_failures
        self.own_sessions = own_sessions
        self.progress = progress
        self.owner = lease_owner(new_id("wrk"))
        self.ttl = float(getattr(self.store, "lease_ttl", 15.0))
        self.renew_every = float(getattr(self.store, "lease_renew", self.ttl / 3))
        self.known: set[int] = set()  # the items this worker's claims returned, until their ends
        self.claiming = 0  # claims under way (their items are not known yet)
        self.lanes: set[asyncio.Task[None]] = set()  # one task per item slot in use
        self.exited: list[asyncio.Task[None]] = []  # lanes that ended, not yet looked at
        self.wake = asyncio.Event()  # a lane ended, or the stop was set
        self.failures = 0
        self.stopped: Optional[str] = None  # "aborted" | "max_failures" | "max_cost"
        self.budget = Budget(self.store, name, max_cost) if max_cost is not None else None
        self.backoff = 0.0
        self.paused_until = 0.0
        self.ahead = Ahead(agent, stop, ahead_size(concurrency, agent.persistence.commit_waits),
                           lambda n: self._claim_items(n, counted=False), forget=self.known.discard)

    async def run(self) -> Optional[str]:
        """Work until every item of the batch has ended (or a stop); returns why it stopped early."""
        LIVE_WORKERS.add(self.owner)
        heartbeat = asyncio.ensure_future(self._heartbeat())
        stop_wait = asyncio.ensure_future(self.stop.wait())
        stop_wait.add_done_callback(lambda _: self.wake.set())
        try:
            with frozen_heap():  # (its collections skip the objects of before: see .heap)
                await self.store.free_dead_claims(self.name, list(LIVE_WORKERS))
                await self._loop(stop_wait)
        finally:
            heartbeat.cancel()
            if not stop_wait.done():
                stop_wait.cancel()
            await asyncio.shield(self._give_back())
            await asyncio.shield(self.ahead.give_back_all(self.store, self.name, self.owner))
            LIVE_WORKERS.discard(self.owner)
        return self.stopped

    async def _loop(self, stop_wait: "asyncio.Future[Any]") -> None:
        while True:
            if self.stop.is_set() and self.stopped is None:
                self.stopped = "aborted"
            claimed = await self._claim() if self.stopped is None else 0
            if not self.lanes:
                if self.stopped is not None or (not claimed and await self._all_ended()):
                    return
                if not claimed:  # others hold the last items (or a back-off): look again soon
                    await self._idle(stop_wait)
                continue
            if not self.exited:
                self.wake.clear()
                await self.wake.wait()  # (one event, not asyncio.wait over every lane)
            exited, self.exited = self.exited, []
            _seen(exited)  # (several lanes may fail at once — a database gone: the first is raised)
            for lane in exited:
                lane.result()  # a lane's failure to record an end is the batch's failure

    async def _claim(self) -> int:
        """Take an item for each free lane (those taken ahead first) and start the lanes. While a
        rate limit pauses the worker, what it took ahead is given back (others may run it)."""
        free = self.concurrency - len(self.lanes)
        items: list[Any] = []
        if time.monotonic() < self.paused_until:
            await self.ahead.give_back_all(self.store, self.name, self.owner)
        if free > 0 and self._goes_on() and await self._within_budget():
            items = self.ahead.take(free)
            if items:
                self.progress.claimed(len(items))
            if len(items) < free:
                items += await self._claim_items(free - len(items))
        for it in items:
            lane = asyncio.ensure_future(self._lane(it))
            self.lanes.add(lane)
            lane.add_done_callback(self._on_exit)
        return len(items)

    async def _claim_items(self, n: int, *, counted: bool = True) -> list[BatchItem]:
        """Claim up to ``n`` items (none while the worker may take no more); ``counted``: the
        progress counts them running (an item taken ahead is counted once a slot takes it)."""
        if self.stopped is not None or time.monotonic() < self.paused_until or not await self._within_budget():
            return []
        t = now()
        self.claiming += 1
        try:
            items = await self.store.claim_batch_items(self.name, self.owner, n, now=t, expires=t + self.ttl,
                                                       token=new_id("clm"))
        finally:
            self.claiming -= 1
        self.known.update(it.item for it in items)
        if items and counted:
            self.progress.claimed(len(items))
        return items

    async def _next(self) -> "Optional[Ready | BatchItem]":
        """A slot's next item: one taken ahead, else one claimed now (None: nothing to take)."""
        if not await self._within_budget():
            return None
        taken = self.ahead.take()
        if taken:
            self.progress.claimed(1)
            return taken[0]
        items = await self._claim_items(1)
        return items[0] if items else None

    async def _lane(self, it: "Optional[Ready | BatchItem]") -> None:
        """Run items one after another in this slot (see :meth:`_turn`); the lane ends once the
        ends of all its items are recorded."""
        finishing: list["asyncio.Future[None]"] = []
        try:
            while it is not None:
                _prune(finishing)
                it = await self._turn(it, finishing)
        except BaseException:
            if finishing:  # (their own errors are this one's to drop)
                await asyncio.wait(finishing)
                for f in finishing:
                    if not f.cancelled():
                        f.exception()
            raise
        if finishing:
            await asyncio.gather(*finishing)  # a failure to record an end is the batch's failure

    async def _turn(self, taken: "Ready | BatchItem", finishing: list["asyncio.Future[None]"]
                    ) -> "Optional[Ready | BatchItem]":
        """Run ``taken``; the slot's next item. An item that ends first records its end and claims the
        next in one call to the store (this task: no trip through the loop's queue). An item past
        its last model call hands the slot on at once: the next item is taken (:meth:`_next`) and
        started while this one's last writes and its end go on beside it (in ``finishing``), so a
        slot waits for no commit between two items' model calls — on a store whose commits wait; on
        one that answers at once (:attr:`~we0nb.persistence.base.Persistence.commit_waits`) an
        item's last writes take no time, and it runs in this task."""
        it = taken.item if isinstance(taken, Ready) else taken
        if not self.agent.persistence.commit_waits:
            outcome = await self._run(taken)
            return await self._record(it, outcome, claim=self._goes_on_after(outcome))
        turned = asyncio.get_running_loop().create_future()

        def turn(_: Any = None) -> None:
            if not turned.done():
                turned.set_result(None)

        run = asyncio.ensure_future(self._run(taken, after_last_call=turn))
        run.add_done_callback(turn)
        try:
            await turned
        except asyncio.CancelledError:
            run.cancel()
            raise
        if run.done():
            outcome = run.result()
            return await self._record(it, outcome, claim=self._goes_on_after(outcome))
        finishing.append(asyncio.ensure_future(self._finish(it, run)))
        return await self._next() if self._goes_on() else None

    def _run(self, taken: "Ready | BatchItem", after_last_call: Optional[Callable[[], None]] = None
             ) -> "Coroutine[Any, Any, ItemOutcome]":
        return run_item(self.agent, taken, self.stop, own_sessions=self.own_sessions,
                        backoff=max(self.backoff, self.BACKOFF), after_last_call=after_last_call,
                        on_cost=self.budget.add if self.budget is not None else None)

    async def _finish(self, it: BatchItem, run: "asyncio.Future[ItemOutcome]") -> None:
        await self._record(it, await run, claim=False)

    async def _record(self, it: BatchItem, outcome: ItemOutcome, *, claim: bool) -> Optional[BatchItem]:
        """Record ``it``'s end (and claim the slot's next item when ``claim``); the item claimed."""
        claim = claim and await self._within_budget()
        t = now()
        self.claiming += 1
        try:  # (the run's lease release, under way, goes to the store with this end and claim)
            ended, items = await self.store.end_and_claim(self.name, it.item, self.owner, outcome.end,
                                                          claim=1 if claim else 0, now=t, expires=t + self.ttl,
                                                          token=new_id("clm"))
        finally:
            self.claiming -= 1
            await released(outcome)
        self.known.discard(it.item)
        self.known.update(x.item for x in items)
        self._ended(it, outcome, ended)
        if items:
            self.progress.claimed(len(items))
        return items[0] if items else None  # (claimed as a stop came: its run gives it back)

    async def _within_budget(self) -> bool:
        """Whether the batch's budget allows another item (stopping the claims once it is spent)."""
        if self.budget is None:
            return True
        if self.stopped is None and await self.budget.spent():
            self.stopped = "max_cost"
            log.info("batch %r: its cost so far (%.6f USD) reached max_cost; no new item is started", self.name,
                     self.budget.total)
        return self.stopped is None

    def _goes_on(self) -> bool:
        """Whether a slot may take another item now."""
        return not self.stop.is_set() and self.stopped is None and time.monotonic() >= self.paused_until

    def _goes_on_after(self, outcome: ItemOutcome) -> bool:
        """Whether the lane claims another item once this outcome is recorded."""
        end = outcome.end
        if outcome.rate_limited:
            return False
        if end.status == "failed" and self.max_failures is not None and self.failures + 1 >= self.max_failures:
            return False
        return self._goes_on()

    def _on_exit(self, lane: "asyncio.Task[None]") -> None:
        self.lanes.discard(lane)
        self.exited.append(lane)
        self.wake.set()

    def _ended(self, it: BatchItem, outcome: ItemOutcome, recorded: bool) -> None:
        end = outcome.end
        if not recorded:
            log.warning("batch %r: item %d was taken over by another worker before its end was recorded "
                        "(this worker's claim had lapsed)", self.name, it.item)
        if outcome.rate_limited:
            clock = time.monotonic()
            if clock >= self.paused_until:  # (one burst of 429s at the same instant doubles it once)
                self.backoff = min(self.MAX_BACKOFF, max(self.BACKOFF, self.backoff * 2))
                self.paused_until = clock + self.backoff
        elif end.status in ("stop", "compact", "approval"):
            self.backoff = 0.0
        if end.status == "failed":
            self.failures += 1
            if self.max_failures is not None and self.failures >= self.max_failures and self.stopped is None:
                self.stopped = "max_failures"
                self.stop.set()
        self.progress.ended(it.item, end)

    async def _all_ended(self) -> bool:
        infos = await self.store.list_batches(self.name)
        if infos:
            self.progress.counts(infos[0].counts)
        return not infos or infos[0].unfinished == 0

    async def _idle(self, stop_wait: "asyncio.Future[Any]") -> None:
        await self.store.free_dead_claims(self.name, list(LIVE_WORKERS))
        delay = max(self.POLL, self.paused_until - time.monotonic())
        await asyncio.wait([stop_wait], timeout=min(delay, self.MAX_BACKOFF))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                held = await self.store.renew_batch_claims(self.name, self.owner, now() + self.ttl)
                await self._release_unknown(held)
            except Exception as e:  # a busy or unreachable database: the next tick tries again
                log.warning("batch %r: could not renew this worker's claims: %s", self.name, e)

    async def _release_unknown(self, held: list[int]) -> None:
        """Release the items the store says this worker holds that none of its claims returned
        (a claim whose answer was lost); not while a claim is under way (its items are not known yet)."""
        if self.claiming:
            return
        unknown = [i for i in held if i not in self.known]
        if unknown:
            log.warning("batch %r: this worker held item(s) %s that no claim of its returned (an answer lost on "
                        "the way); released for any worker to take", self.name, unknown)
            await self.store.release_batch_claims(self.name, self.owner, unknown)

    async def _give_back(self) -> None:
        """The batch call was cancelled: cut the running items; each lane records its own (aborted)."""
        if self.lanes:
            self.stop.set()
            await asyncio.wait(list(self.lanes))
        # (a lane's own error is the cancelled or failed call's to drop: each marked seen, those
        # that ended before the call did too — else asyncio logs each as "never retrieved")
        _seen(self.exited)
        self.exited = []


def _seen(lanes: "list[asyncio.Task[None]]") -> None:
    """Mark each lane's error as retrieved (what is raised, if anything, is the caller's choice)."""
    for lane in lanes:
        if lane.done() and not lane.cancelled():
            lane.exception()


class Budget:
    """``max_cost``: what the batch's model calls cost so far, against the budget.

    The sum is read from the store (every priced call of the batch's items, whoever ran them:
    other processes, earlier calls), at most every :attr:`READ_EVERY` seconds — or
    :attr:`READ_SHARE` of the time, when a read takes longer (the sum goes over every model
    call of the batch: on SQLite ~50 ms for 1,000 items, on the loop's thread). The calls this
    worker's runs make are added as they end, each until a read is known to include it: a call
    is told ``written`` once its message is in the store (its event comes after that commit); an
    item's last call is told earlier, before the slot takes the next item, while its message is
    still on its way — and stays counted until it is written and read again. So this worker's own
    spending is seen at once (a retried item's new calls too), another process's within
    ``READ_EVERY`` (or a few seconds on a large batch); an item that is running when the budget is
    reached ends normally (the budget is checked before each claim).
    """

    READ_EVERY = 0.5
    #: the largest share of the time spent reading the sum (reads are spaced by their duration / this)
    READ_SHARE = 0.05

    def __init__(self, store: Any, name: str, limit: float) -> None:
        self.store, self.name, self.limit = store, name, float(limit)
        self.read_total = 0.0  # the store's sum, as last read
        self.unread: dict[str, float] = {}  # this worker's calls the last read may not include: id → cost
        self.unread_total = 0.0
        self.written: set[str] = set()  # of those, the ones whose messages are in the store by now
        self.read_at: Optional[float] = None
        self.every = self.READ_EVERY  # seconds from one read to the next

    @property
    def total(self) -> float:
        return self.read_total + self.unread_total

    def add(self, message_id: str, cost: Optional[float], written: bool) -> None:
        """A call of this worker's runs (its message ``message_id``) ended with ``cost`` (None:
        unknown, counts nothing); ``written``: its message is in the store. Told again, it counts once."""
        if cost is None:
            return
        if message_id not in self.unread:  # (``written`` holds only ids in ``unread``)
            self.unread[message_id] = cost
            self.unread_total += cost
        if written:
            self.written.add(message_id)

    async def spent(self) -> bool:
        """Whether the budget is reached (reading the store's sum when the last read is old)."""
        if self.read_at is None or time.monotonic() - self.read_at >= self.every:
            self.read_at = time.monotonic()
            included, self.written = self.written, set()  # (written before the read: in its sum)
            costs = await self.store.batch_costs(self.name)
            self.read_total = sum(c.priced for c in costs)
            for message_id in included:
                self.unread_total -= self.unread.pop(message_id, 0.0)
            self.every = max(self.READ_EVERY, (time.monotonic() - self.read_at) / self.READ_SHARE)
        return self.total >= self.limit


def _prune(finishing: list["asyncio.Future[None]"]) -> None:
    """Drop the items that have recorded their ends; raise the first failure to record one."""
    done = [f for f in finishing if f.done()]
    for f in done:
        finishing.remove(f)
    failed = [e for e in (f.exception() if not f.cancelled() else None for f in done) if e is not None]
    for f in done:
        if f.cancelled():
            f.result()  # (raises CancelledError: the batch itself was cancelled)
    if failed:
        raise failed[0]

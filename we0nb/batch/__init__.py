"""Batch runs: many prompts, each a session of its own, resumable and shared across processes.

``await agent.batch(prompts, name=...)`` (:func:`run_batch`) persists the batch in the
agent's store, runs its items ``concurrency`` at a time with the engine's own prompt and
resume, and returns a :class:`BatchResult` (``.df``). The same call again continues it; the
same call in other processes on the same database shares its work.

Modules: ``prompts`` (what is accepted, as stored items), ``item`` (one run of one item),
``runner`` (the worker: claims, heartbeat, waiting for others), ``progress`` (the bar and
the live view), ``result`` (BatchResult and its frame).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Optional, Sequence

from .._ids import now
from ..engine.request import check_batch_name, check_session_id
from ..persistence.batches import BatchQueue, batch_queue
from .observe import batch_observer_for
from .progress import make_progress
from .prompts import batch_items, new_batch_name
from .result import BatchResult
from .runner import Worker

__all__ = ["run_batch", "work_batch", "BatchResult"]


async def run_batch(agent: Any, prompts: Any, *, name: Optional[str] = None, concurrency: int = 8,
                    abort: Optional[asyncio.Event] = None, progress: bool = True,
                    session_ids: Optional[Sequence[str]] = None, max_failures: Optional[int] = None,
                    retry_failed: bool = False, max_cost: Optional[float] = None) -> BatchResult:
    """``agent.batch(...)``: see :meth:`we0nb.We0Agent.batch`."""
    _check(concurrency, abort, max_failures, max_cost)
    new = batch_items(prompts, session_ids)
    name = new_batch_name() if name is None else check_batch_name(name, "batch(name=...)")
    store = batch_queue(agent.persistence)
    if session_ids is not None and not await store.list_batches(name):  # (a new batch: its sessions are new)
        await _refuse_taken(agent.persistence, [it.session_id for it in new])
    await store.open_batch(name, new, session_ids_given=session_ids is not None, now=now())
    queued = await _requeue(agent, store, name, retry_failed)
    return await _observed(agent, name, len(new), concurrency=concurrency, abort=abort, progress=progress,
                           own_sessions=session_ids is None, max_failures=max_failures, max_cost=max_cost,
                           queued=queued)


async def _refuse_taken(persistence: Any, session_ids: Sequence[str]) -> None:
    """A new batch's items run in new sessions: an id the store holds already (another batch's
    item, a notebook's session) is refused before anything is written — its turns would mix in."""
    for start in range(0, len(session_ids), 64):  # (64 reads at a time: one round trip each on PostgreSQL)
        chunk = session_ids[start:start + 64]
        found = await asyncio.gather(*(persistence.get_session(sid) for sid in chunk))
        taken = [sid for sid, got in zip(chunk, found) if got is not None]
        if taken:
            raise ValueError(f"batch(session_ids=...): session {taken[0]!r} already exists in this store "
                             f"({len(taken)} of these {len(chunk)} do); a batch's items run in new sessions: "
                             "pass new ids, or none (they are made), or continue that batch by its name.")


async def work_batch(agent: Any, name: str, *, concurrency: int = 8, abort: Optional[asyncio.Event] = None,
                     progress: bool = True, max_failures: Optional[int] = None, retry_failed: bool = False,
                     max_cost: Optional[float] = None) -> BatchResult:
    """Join the existing batch ``name`` without its prompts (a worker on another host: ``we0nb
    batch work``): the same work as ``agent.batch(prompts, name=name)``. LookupError when the
    agent's store has no such batch."""
    _check(concurrency, abort, max_failures, max_cost)
    name = check_session_id(name, "batch name")
    store = batch_queue(agent.persistence)
    found = await store.list_batches(name)
    if not found:
        known = ", ".join(repr(i.name) for i in (await store.list_batches())[:10]) or "none"
        raise LookupError(f"no batch {name!r} in this database (batches: {known})")
    queued = await _requeue(agent, store, name, retry_failed)
    # own_sessions=False: whether the batch made its sessions is not stored; counting from the
    # transcripts is right either way
    return await _observed(agent, name, found[0].items, concurrency=concurrency, abort=abort, progress=progress,
                           own_sessions=False, max_failures=max_failures, max_cost=max_cost,
                           queued=queued)


async def _observed(agent: Any, name: str, n: int, *, concurrency: int, **run: Any) -> BatchResult:
    """:func:`_run` inside the batch's observation (its span, when tracing is on)."""
    watch = batch_observer_for(agent, name, n, concurrency)
    if watch is not None:  # (before any task of the batch exists: they inherit what it makes current)
        watch.started()
    try:
        result = await _run(agent, name, concurrency=concurrency, **run)
    except BaseException as e:
        if watch is not None:
            watch.ended(None, e)
        raise
    if watch is not None:
        watch.ended(result, None)
    return result


async def _run(agent: Any, name: str, *, concurrency: int, abort: Optional[asyncio.Event], progress: bool,
               own_sessions: bool, max_failures: Optional[int], max_cost: Optional[float],
               queued: Optional[dict[str, int]] = None) -> BatchResult:
    store = batch_queue(agent.persistence)
    stop = asyncio.Event()  # the runs' abort: set by the caller's abort, or by max_failures
    relay = asyncio.ensure_future(_relay(abort, stop)) if abort is not None else None
    if abort is not None and abort.is_set():
        stop.set()
    bar = make_progress(name, stop, progress)
    worker = Worker(agent, name, concurrency=concurrency, stop=stop, max_failures=max_failures,
                    own_sessions=own_sessions, progress=bar, max_cost=max_cost)
    stopped: Optional[str] = None
    try:
        bar.start((await store.list_batches(name))[0], queued)
        stopped = await worker.run()
        bar.counts((await store.list_batches(name))[0].counts)  # (the store's word is the last one shown)
    finally:
        if relay is not None:
            relay.cancel()
        bar.close(stopped)
    return BatchResult(name=name, items=await store.batch_items(name), stopped=stopped,
                       costs=await store.batch_costs(name), agent=agent)


async def _relay(abort: asyncio.Event, stop: asyncio.Event) -> None:
    await abort.wait()
    stop.set()


async def _requeue(agent: Any, store: BatchQueue, name: str, retry_failed: bool) -> dict[str, int]:
    """Queue again what this call should run beyond the unfinished items: the failed ones with
    ``retry_failed``, and the approval items whose calls have all been decided. Returns the
    items queued by status (what the progress counts a claim takes from)."""
    again: list[int] = []
    queued: dict[str, int] = {}
    for it in await store.batch_items(name):
        if it.queued or it.status == "running":
            queued[it.status] = queued.get(it.status, 0) + 1
            continue
        if it.status == "failed" and retry_failed:
            again.append(it.item)
        elif it.status == "approval" and not (await agent.persistence.load_transcript(it.session_id)).pending_approvals:
            again.append(it.item)
        else:
            continue
        queued[it.status] = queued.get(it.status, 0) + 1
    if again:
        await store.requeue_batch_items(name, again)
    return queued


def _check(concurrency: Any, abort: Any, max_failures: Any, max_cost: Any) -> None:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"batch(concurrency=...): expected an integer >= 1, got {concurrency!r}.")
    if abort is not None and not isinstance(abort, asyncio.Event):
        raise TypeError(f"batch(abort=...): expected an asyncio.Event, got {type(abort).__name__}.")
    if max_failures is not None and (isinstance(max_failures, bool) or not isinstance(max_failures, int)
                                     or max_failures < 1):
        raise ValueError(f"batch(max_failures=...): expected an integer >= 1 or None, got {max_failures!r}.")
    if max_cost is not None and (isinstance(max_cost, bool) or not isinstance(max_cost, (int, float))
                                 or not math.isfinite(max_cost) or max_cost <= 0):
        raise ValueError(f"batch(max_cost=...): expected a budget in USD, a number > 0, or None; got {max_cost!r}.")

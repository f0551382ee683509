"""Checks of :class:`~we0nb.persistence.batches.BatchQueue`: claims, renewals, ends, requeues, continuations."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..._ids import new_id
from ..batches import ItemEnd, NewItem
from .harness import Check, Harness, check, equal, expect, raises

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
batches = check(CHECKS, "batches")


def _near(stored: float, expected: float) -> bool:
    """An expiry as expected: a store may keep it on its own clock (PostgreSQL: the server's now
    plus the time left), which differs from the caller's by the two clocks' offset."""
    return abs(stored - expected) < 5.0


def _items(n: int, tag: str = "") -> list[NewItem]:
    return [NewItem(prompt=f'["q{i}{tag}"]', session_id=new_id("ses")) for i in range(n)]


async def _open(p: Any, n: int) -> tuple[str, list[NewItem]]:
    name, items = new_id("bat"), _items(n)
    await p.open_batch(name, items, session_ids_given=True, now=time.time())
    return name, items


@batches
async def a_batch_is_created_once_and_continued_with_the_same_prompts(h: Harness) -> None:
    """open_batch creates a batch (every item pending and queued) or loads it; other prompts, another
    count or other session ids are a ValueError naming the batch and the first item that differs."""
    p = h.store
    name, items = await _open(p, 3)
    info = await h.fresh().open_batch(name, items, session_ids_given=True, now=time.time() + 5)
    equal((info.name, info.items, info.counts, info.unfinished), (name, 3, {"pending": 3}, 3), "the batch reopened")
    got = await p.batch_items(name)
    equal([(it.item, it.session_id, it.prompt, it.status, it.queued, it.attempts) for it in got],
          [(i, it.session_id, it.prompt, "pending", True, 0) for i, it in enumerate(items)], "the items")
    other = [items[0], NewItem(prompt='["else"]', session_id=items[1].session_id), items[2]]
    for given, ids_given in ((other, False), (items[:2], False),
                             ([NewItem(it.prompt, new_id("ses")) for it in items], True)):
        async with raises(ValueError, "open_batch with other prompts or sessions") as caught:
            await p.open_batch(name, given, session_ids_given=ids_given, now=time.time())
        expect(name in str(caught[0]) and "item" in str(caught[0]), f"the error names the batch and item: {caught[0]}")
    await p.open_batch(name, [NewItem(it.prompt, new_id("ses")) for it in items], session_ids_given=False,
                       now=time.time())  # generated session ids are not compared
    equal(await p.batch_items(new_id("bat")), [], "the items of a batch that does not exist")


@batches
async def claims_never_hand_out_one_item_twice(h: Harness) -> None:
    """Claimers at once (two instances too) get disjoint items, in item order, each running, held by
    its claimer, its attempt counted; a renewal pushes the claimer's own claims only."""
    name, _ = await _open(h.store, 50)
    t = time.time()
    stores = [h.store, h.fresh()]
    got = await asyncio.gather(*(stores[k % 2].claim_batch_items(name, f"h:1:w{k}", 7, now=t, expires=t + 60)
                                 for k in range(10)))
    claimed = [it.item for g in got for it in g]
    expect(all(len(g) <= 7 for g in got), "no claimer got more than it asked for")
    equal(sorted(claimed), list(range(50)), "every item claimed once")
    for k, g in enumerate(got):
        equal([it.item for it in g], sorted(it.item for it in g), "a claim's items, in item order")
        expect(all(it.status == "running" and it.owner == f"h:1:w{k}" and it.attempts == 1 and it.started is not None
                   and _near(it.expires, t + 60) for it in g), f"claimed items: {g}")
    equal(await h.store.claim_batch_items(name, "h:1:late", 5, now=t, expires=t + 60), [], "a claim of nothing left")
    equal(await h.store.renew_batch_claims(name, "h:1:w0", t + 120), [it.item for it in got[0]], "the claims renewed")
    by = {it.item: it for it in await h.fresh().batch_items(name)}
    expect(all(_near(by[it.item].expires, t + 120) for it in got[0]), "the renewed claims' expiry")
    expect(all(_near(by[it.item].expires, t + 60) for it in got[1]), "another claimer's claims are left alone")


@batches
async def a_claim_the_worker_cannot_account_for_is_released(h: Harness) -> None:
    """renew_batch_claims says which items an owner holds (its worker releases those no claim of its
    returned: an answer lost on the way); release_batch_claims makes them claimable at once, and
    leaves other owners' claims alone."""
    p = h.store
    name, _ = await _open(p, 4)
    t = time.time()
    mine = await p.claim_batch_items(name, "h:1:w", 2, now=t, expires=t + 60, token=new_id("clm"))
    (theirs,) = await p.claim_batch_items(name, "h:1:v", 1, now=t, expires=t + 60, token=new_id("clm"))
    equal(await p.renew_batch_claims(name, "h:1:w", t + 60), [it.item for it in mine], "the items held")
    equal(await p.release_batch_claims(name, "h:1:w", [mine[1].item, theirs.item]), 1, "released: only its own")
    (taken,) = await p.claim_batch_items(name, "h:1:x", 1, now=t + 1, expires=t + 60)
    equal((taken.item, taken.attempts), (mine[1].item, 2), "a released claim, claimed at once")
    equal(await p.renew_batch_claims(name, "h:1:w", t + 60), [mine[0].item], "what the owner holds now")
    equal(await p.renew_batch_claims(name, "h:1:v", t + 60), [theirs.item], "another owner's claim, untouched")


@batches
async def an_end_is_written_only_by_the_claims_holder(h: Harness) -> None:
    """end_batch_item records the end (True) only while its owner holds the claim: another owner,
    or the same after the claim lapsed and another worker took it, writes nothing (False)."""
    p = h.store
    name, _ = await _open(p, 2)
    t = time.time()
    (it,) = await p.claim_batch_items(name, "h:1:a", 1, now=t, expires=t + 0.5)
    end = ItemEnd(status="stop", finished=t + 1, run_time=0.25, attempts=1, started=t, text="done", output='{"x":1}',
                  steps=4, tool_calls=3, input_tokens=10, output_tokens=5)
    equal(await p.end_batch_item(name, it.item, "h:1:b", end), False, "an end by another owner")
    (again,) = await p.claim_batch_items(name, "h:1:b", 1, now=t, expires=t + 60)
    equal(again.item, 1, "a claim while the first item is held takes the next one")
    (taken,) = await p.claim_batch_items(name, "h:1:b", 1, now=t + 2, expires=t + 60)  # the first claim lapsed
    equal((taken.item, taken.attempts), (it.item, 2), "a lapsed claim taken over")
    equal(await p.end_batch_item(name, it.item, "h:1:a", end), False, "an end by the owner whose claim lapsed")
    equal(await p.end_batch_item(name, it.item, "h:1:b", end), True, "an end by the holder")
    got = (await h.fresh().batch_items(name))[it.item]
    equal((got.status, got.queued, got.owner, got.text, got.output, got.steps, got.tool_calls, got.input_tokens,
           got.output_tokens, got.finished, got.duration),
          ("stop", False, None, "done", '{"x":1}', 4, 3, 10, 5, t + 1, 0.25), "the item as ended")
    equal(await p.end_batch_item(name, it.item, "h:1:b", end), False, "a second end of an ended item")


@batches
async def requeued_and_backed_off_items_are_claimed_again(h: Harness) -> None:
    """An end with ``queued`` (aborted, rate-limited) is claimable again once ``not_before`` passed;
    requeue_batch_items queues ended items again and leaves running ones alone."""
    p = h.store
    name, _ = await _open(p, 3)
    t = time.time()
    a, b, c = await p.claim_batch_items(name, "h:1:w", 3, now=t, expires=t + 60)
    await p.end_batch_item(name, a.item, "h:1:w", ItemEnd(status="aborted", queued=True, attempts=1,
                                                          started=t, not_before=t + 10))
    await p.end_batch_item(name, b.item, "h:1:w", ItemEnd(status="failed", finished=t, attempts=1, error="boom"))
    equal(await p.claim_batch_items(name, "h:1:x", 3, now=t + 5, expires=t + 60), [], "a claim before not_before")
    (back,) = await p.claim_batch_items(name, "h:1:x", 3, now=t + 11, expires=t + 60)
    equal((back.item, back.attempts), (a.item, 2), "an aborted item claimed again")
    equal(await p.requeue_batch_items(name, [b.item, c.item, back.item]), 1, "requeued: only the ended item")
    (retry,) = await p.claim_batch_items(name, "h:1:y", 3, now=t + 12, expires=t + 60)
    equal((retry.item, retry.attempts), (b.item, 2), "a requeued item claimed again")
    infos = [i for i in await p.list_batches() if i.name == name]
    equal((len(infos), infos[0].counts, infos[0].unfinished), (1, {"running": 3}, 3), "list_batches' counts")


@batches
async def end_and_claim_records_the_end_and_claims_the_next(h: Harness) -> None:
    """A slot turning over: its end (conditional, as end_batch_item) and a claim of the next items."""
    p = h.store
    name, _ = await _open(p, 4)
    t = time.time()
    (first,) = await p.claim_batch_items(name, "h:1:w", 1, now=t, expires=t + 60)
    ended, nxt = await p.end_and_claim(name, first.item, "h:1:w", ItemEnd(status="stop", finished=t, attempts=1,
                                       text="done"), claim=1, now=t, expires=t + 60)
    equal((ended, [(it.item, it.status, it.owner) for it in nxt]), (True, [(1, "running", "h:1:w")]), "end and claim")
    ended, nxt = await p.end_and_claim(name, first.item, "h:1:w", ItemEnd(status="failed"), claim=2,
                                       now=t, expires=t + 60)
    equal((ended, [it.item for it in nxt]), (False, [2, 3]), "an end no longer held, and the claim")
    ended, nxt = await p.end_and_claim(name, 1, "h:1:w", ItemEnd(status="stop", finished=t, attempts=1),
                                       claim=0, now=t, expires=t + 60)
    equal((ended, nxt), (True, []), "an end with no claim")
    by = {it.item: it for it in await p.batch_items(name)}
    equal([by[i].status for i in range(4)], ["stop", "stop", "running", "running"], "the items' statuses")
    equal(by[0].text, "done", "the first end's text")
    info = (await p.list_batches(name))[0]
    equal((info.counts, info.unfinished), ({"stop": 2, "running": 2}, 2), "the batch's counts")

"""Items taken ahead: a few claimed, with their sessions' leases held, before a slot asks.

Why: on a store whose commits wait (SQLite, PostgreSQL), a slot between two items waited for
two round trips in turn — the claim of the next item, then its session's lease with the
session's row — about 18 ms of each ~230 ms item in W7 on PostgreSQL, while its model sat
idle. A worker keeps up to ``size`` items ready instead, refilled in the background (one
claim for all that are missing, then their leases together; one refill at a time), so a slot
takes its next item at once and its run starts without a round trip. A slot that finds none
ready (slots that started together end together, and drain it) claims its own, as before.

What it costs: up to ``size`` claims (a third of the concurrency) are held a few
milliseconds before a run starts. Their claims and leases are renewed like running items'
(the worker's and the leases' heartbeats); a worker that dies leaves them to the others
exactly as its running items; a worker that stops, or pauses for a provider's rate limit (so
that other workers may run them meanwhile), gives them back untouched (:meth:`give_back_all`):
the item is as before its claim, its attempt returned. The progress counts an item as
running once a slot takes it, not while it waits here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional

from ..persistence.batches import BatchItem, BatchQueue
from .item import Ready, give_back, reserve

__all__ = ["Ahead", "ahead_size"]

log = logging.getLogger("we0nb.batch")


def ahead_size(concurrency: int, commit_waits: bool) -> int:
    """How many items a worker keeps ready: none on a store that answers at once (a claim and
    a lease cost it no wait), else a third of the concurrency, at least 2. (In W7 on PostgreSQL,
    whose items all take the same time, 21–28% of the hand-overs still found none ready with a
    third, 20% with half: slots ending together drain it faster than two round trips; with a
    fifth, refilled only once half was taken, 36–39%. The whole concurrency left 6–8%, and
    none of them ran faster beyond the noise.)"""
    return max(2, concurrency // 3) if commit_waits else 0


class Ahead:
    """A worker's items taken ahead (see the module's docstring)."""

    def __init__(self, agent: Any, stop: asyncio.Event, size: int,
                 claim: Callable[[int], Awaitable[list[BatchItem]]],
                 forget: Optional[Callable[[int], None]] = None):
        self.agent, self.stop, self.size = agent, stop, size
        self.claim = claim  # claims up to n items (none once the worker may take no more)
        self.forget = forget  # told of each item given back (the worker no longer holds it)
        #: Ready (lease held) or BatchItem (its run takes the lease); one list, changed in place,
        #: so a refill that adds to it after a wait adds to what the slots take from
        self.items: list[Any] = []
        self.filling: Optional["asyncio.Future[None]"] = None  # the refill under way

    def take(self, n: int = 1) -> list[Any]:
        """Up to ``n`` items, at once (none when there are none ready); starts a refill."""
        taken = self.items[:n]
        del self.items[:n]
        self.top_up()
        return taken

    def top_up(self) -> None:
        """Start a refill of what is missing, unless one is under way (or the worker stops)."""
        if self.filling is None and len(self.items) < self.size and not self.stop.is_set():
            self.filling = asyncio.ensure_future(self._fill())

    async def _fill(self) -> None:
        try:
            items = await self.claim(self.size - len(self.items))
            # (their leases go to the store together: one round trip on PostgreSQL)
            self.items.extend(await asyncio.gather(*(reserve(self.agent, it, self.stop) for it in items)))
        except Exception as e:  # a busy or unreachable database: the slots claim for themselves
            log.warning("could not claim batch items ahead (each slot claims its own): %s: %s", type(e).__name__, e)
        finally:
            self.filling = None

    async def give_back_all(self, store: BatchQueue, name: str, owner: str) -> None:
        """Give back every item still here (after the refill under way, if any)."""
        if self.filling is not None:
            await asyncio.wait([self.filling])
        items = self.items[:]
        self.items.clear()
        if self.forget is not None:
            for it in items:
                self.forget((it.item if isinstance(it, Ready) else it).item)
        failed = [e for e in await asyncio.gather(*(give_back(store, name, owner, it) for it in items),
                                                  return_exceptions=True) if isinstance(e, BaseException)]
        if failed:  # (their claims and leases lapse by themselves; any worker then takes the items)
            log.warning("could not give back %d batch item(s) claimed ahead (they are free again once their "
                        "claims lapse): %s: %s", len(failed), type(failed[0]).__name__, failed[0])

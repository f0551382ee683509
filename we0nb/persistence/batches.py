"""The batch records at the persistence port: a named batch, its items, and an item's end.

A batch is a list of prompts, each run as its own session (see :mod:`we0nb.batch`). The
store keeps, per item, its prompt, its session id and its state, so several processes on
one database share the work: an item is *claimed* (``status == "running"``, an ``owner``
and an ``expires`` time the owner keeps renewing) and then *ended* with its outcome. An
item is claimable when it is ``queued`` (someone should run it) and its claim has expired
(``expires < now``): never claimed, given up, or held by a worker that stopped renewing.
Every write that ends or renews a claim is conditional on the owner still holding it.
Times are the caller's clock (``now``, ``expires``); a store shared by hosts may keep them on
one clock of its own (PostgreSQL: the server's, a caller's time read as an offset from its own
clock), so that hosts whose clocks disagree never take a live worker's claim.

:class:`BatchQueue` is the capability a store has when it keeps batches; the batch runner
(:mod:`we0nb.batch`) uses a store through it alone.
"""

from __future__ import annotations

import abc
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

__all__ = ["BATCH_STATUSES", "ENDED", "BatchItem", "BatchInfo", "ItemCost", "ItemEnd", "NewItem", "BatchQueue",
           "batch_queue", "fingerprint", "check_same_prompts"]

#: every status an item can have (``pending``: never started; ``running``: claimed by a worker)
BATCH_STATUSES = ("pending", "running", "stop", "compact", "approval", "failed", "aborted")
#: statuses a continuation does not run again by itself (approval waits for a decision,
#: failed for ``retry_failed=True``)
ENDED = ("stop", "compact", "approval", "failed")


@dataclass(frozen=True)
class NewItem:
    """An item as a batch is created: its prompt (JSON text: the user messages) and session."""

    prompt: str
    session_id: str


@dataclass
class BatchItem:
    """One item as stored. Counts are the session's totals (steps, tool calls, tokens);
    ``duration`` the seconds its runs took, summed; ``attempts`` how many runs it had."""

    batch: str
    item: int
    session_id: str
    prompt: str
    status: str = "pending"
    queued: bool = True
    owner: Optional[str] = None
    expires: float = 0.0
    attempts: int = 0
    started: Optional[float] = None
    finished: Optional[float] = None
    duration: float = 0.0
    text: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class ItemEnd:
    """How one run of an item ended, written by :meth:`BatchQueue.end_batch_item`.

    ``status`` is the item's new status; ``queued`` whether it should run again (an
    aborted or rate-limited item: yes); ``not_before`` keeps it unclaimable until then
    (a back-off); ``attempts``/``started`` are absolute (a claim that never started a run
    gives its attempt back); ``run_time`` is added to the item's ``duration``.
    """

    status: str
    queued: bool = False
    finished: Optional[float] = None
    run_time: float = 0.0
    attempts: int = 0
    started: Optional[float] = None
    not_before: float = 0.0
    text: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class BatchInfo:
    """A batch: ``counts`` by status; ``unfinished`` items still queued or running."""

    name: str
    created: float
    updated: float
    items: int
    fingerprint: str
    counts: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0


@dataclass(frozen=True)
class ItemCost:
    """What an item's model calls cost so far, read from its session's messages: ``priced`` sums
    the calls whose cost is known (USD), ``unpriced`` counts the others (no price, no usage)."""

    item: int
    priced: float = 0.0
    unpriced: int = 0

    @property
    def cost(self) -> Optional[float]:
        """The item's cost (None when any of its calls has no known cost; 0.0 before any call)."""
        return None if self.unpriced else self.priced


@runtime_checkable
class BatchQueue(Protocol):
    """The batch queue: named batches of items that workers (in any process on the store) claim,
    renew, end and requeue. Every method is async; every write that ends or renews a claim is
    conditional on its owner still holding it."""

    @abc.abstractmethod
    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        """Create the batch ``name`` with ``items``, or load it when it exists (one transaction).

        An existing batch must hold the same prompts (and the same session ids when
        ``session_ids_given``): else ValueError naming the batch and the first item that differs.
        """

    @abc.abstractmethod
    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float, expires: float,
                                token: Optional[str] = None) -> list[BatchItem]:
        """Claim up to ``n`` claimable items (queued, claim expired), in item order: each becomes
        ``running``, held by ``owner`` (``host:pid:worker``, see :func:`~we0nb.persistence.base.lease_owner`)
        until ``expires``, its ``attempts`` counted. Two claimers never get the same item.

        ``token`` (a new id per claim, chosen by the claimer; the store makes one when None)
        marks the claimed rows, so a claim whose answer was lost after it committed is answered
        with its own rows, never run a second time (``we0nb.persistence.sql.pg_retry``)."""

    @abc.abstractmethod
    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> list[int]:
        """Push the expiry of every item ``owner`` holds to ``expires``; returns those items, in
        item order (the worker releases any it cannot account for: :meth:`release_batch_claims`)."""

    @abc.abstractmethod
    async def release_batch_claims(self, name: str, owner: str, items: Sequence[int]) -> int:
        """Make these items that ``owner`` holds claimable at once (a claim its worker never learned
        of must not be renewed for ever); returns how many were."""

    @abc.abstractmethod
    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        """Record the end of ``owner``'s run of ``item``; False (and nothing written) when
        ``owner`` no longer holds it (its claim lapsed and another worker took it)."""

    async def end_and_claim(self, name: str, item: int, owner: str, end: ItemEnd, *, claim: int, now: float,
                            expires: float, token: Optional[str] = None) -> tuple[bool, list[BatchItem]]:
        """A worker's slot turning over: :meth:`end_batch_item`, then :meth:`claim_batch_items`
        of up to ``claim`` items (none for 0). A store that can send both at once overrides it."""
        ended = await self.end_batch_item(name, item, owner, end)
        items = await self.claim_batch_items(name, owner, claim, now=now, expires=expires,
                                             token=token) if claim else []
        return ended, items

    @abc.abstractmethod
    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        """Queue ended items to run again (failed ones for a retry, decided approvals); running
        items are left alone. Returns how many were queued."""

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        """Make claimable at once the items held by a worker whose process is gone (same host,
        PID not alive; or this PID and an owner not in ``live``). Returns how many (by default
        none: the claims of a dead worker then lapse by themselves)."""
        return 0

    @abc.abstractmethod
    async def batch_items(self, name: str) -> list[BatchItem]:
        """Every item of the batch, in item order (empty when there is no such batch)."""

    @abc.abstractmethod
    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        """Every batch (or only ``name``), by name, with its counts by status."""

    @abc.abstractmethod
    async def batch_costs(self, name: str) -> list["ItemCost"]:
        """What each item of the batch cost so far, in item order, from its session's messages
        (``agent.batch(max_cost=...)`` and the frames' ``cost``); one query on a SQL store."""


def batch_queue(store: object) -> BatchQueue:
    """``store`` as a :class:`BatchQueue`, or NotImplementedError saying what to use instead."""
    if isinstance(store, BatchQueue):
        return store
    raise NotImplementedError(
        f"{type(store).__name__} does not keep batches; use MemoryPersistence or SqlPersistence "
        "(or implement the BatchQueue capability, we0nb.persistence.batches.BatchQueue)."
    )


def fingerprint(items: Sequence[NewItem]) -> str:
    """A digest of every prompt, in order (a quick equality test of two batches' prompts)."""
    h = hashlib.sha256()
    for it in items:
        h.update(it.prompt.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def check_same_prompts(name: str, stored: Sequence[tuple[str, str]], given: Sequence[NewItem],
                       session_ids_given: bool) -> None:
    """Raise ValueError naming the batch and the first item that differs.

    ``stored``: ``(prompt, session_id)`` per item, in order. Session ids are compared only
    when the caller gave them (generated ones differ by construction).
    """
    for i in range(max(len(stored), len(given))):
        if i >= len(stored) or i >= len(given):
            raise ValueError(
                f"Batch {name!r} already exists with {len(stored)} items, but {len(given)} prompts were given: "
                f"item {i} differs. Pass the same prompts to continue it, or another name for a new batch."
            )
        prompt, sid = stored[i]
        if prompt != given[i].prompt:
            raise ValueError(
                f"Batch {name!r} already exists with other prompts: item {i} differs (stored {_short(prompt)}, "
                f"given {_short(given[i].prompt)}). Pass the same prompts to continue it, or another name "
                "for a new batch."
            )
        if session_ids_given and sid != given[i].session_id:
            raise ValueError(
                f"Batch {name!r} already exists with other session ids: item {i} differs (stored {sid!r}, "
                f"given {given[i].session_id!r}). Pass the same session_ids (or none) to continue it."
            )


def _short(prompt_json: str, n: int = 60) -> str:
    return repr(prompt_json if len(prompt_json) <= n else prompt_json[: n - 1] + "…")

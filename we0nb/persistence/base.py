"""The persistence port: what the engine needs from a store, and nothing of the loop.

Every method is async. Writes are upserts keyed by id, so the engine can write the same
part again as it progresses (pending → running → completed). The engine holds a session
lease for the whole run, so within a run it is the only writer of that session.
"""

from __future__ import annotations

import abc
import asyncio
import os
import socket
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..errors import LeaseLostError
from ..messages import AssistantMessage, MessageWithParts, Part, Session, Transcript, UserMessage
from ..models.base import ModelMessage
from .batches import BatchInfo, BatchItem, ItemEnd, NewItem

__all__ = ["Persistence", "Lease", "lease_owner", "RecentHistory", "recent_start", "Batch"]

MessageInfo = Union[UserMessage, AssistantMessage]
#: one write of :meth:`Persistence.upsert_batch`: (message or None, parts, model view or None)
Batch = tuple[Optional[MessageInfo], Sequence[Part], Optional[str]]


def lease_owner(run_id: str) -> str:
    """``host:pid:run_id`` — who holds a lease, readable in errors and in the database."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


@dataclass
class Lease:
    """A held session lease. ``release()`` it (the engine does, in a ``finally``).

    ``lost`` is set (with ``taken_by``) when the store finds that another run took the lease
    over — a renewal that came too late, or a conditional write that found another owner.
    From then on :meth:`check` raises :class:`~we0nb.LeaseLostError`.
    """

    session_id: str
    run_id: str
    owner: str
    persistence: "Persistence" = field(repr=False)
    released: bool = False
    lost: bool = False
    taken_by: Optional[str] = None

    def mark_lost(self, taken_by: Optional[str] = None) -> LeaseLostError:
        """Record that the lease is gone; returns the error to raise."""
        self.lost = True
        if taken_by is not None:
            self.taken_by = taken_by
        return LeaseLostError(self.session_id, self.taken_by)

    def check(self) -> None:
        """Raise :class:`~we0nb.LeaseLostError` once the lease is known to be lost."""
        if self.lost:
            raise LeaseLostError(self.session_id, self.taken_by)

    async def release(self) -> None:
        """Give the session back (once). A cancel that lands meanwhile lets the release finish
        in a task of its own, then goes on: a cancelled run never leaves its session held."""
        if self.released:
            return
        try:
            await self.persistence.release_lease(self)
        except asyncio.CancelledError:
            await asyncio.shield(self.persistence.release_lease(self))  # (releasing twice is harmless)
            raise
        finally:
            self.released = True


@dataclass
class RecentHistory:
    """Where a run starts: the older messages as the model sees them, the recent ones as objects.

    ``earlier`` is the model view of every message before ``messages`` that the model still
    sees (from the latest compaction summary on); ``messages`` are full objects, from the
    point :func:`recent_start` picks. A store without model views returns everything in
    ``messages`` and nothing in ``earlier``.
    """

    session: Optional[Session]
    earlier: list[ModelMessage]
    messages: list[MessageWithParts]


def recent_start(roles: Sequence[str], summary: Sequence[bool], has_view: Sequence[bool]) -> tuple[int, int]:
    """``(s, k)``: the model views of messages ``s..k-1`` stand for them; ``k..`` load as objects.

    The recent messages are what a run inspects: the last user message and everything
    after it (the turn being answered or recovered), reaching back to the last assistant
    message before it that is not a compaction summary (the previous answer, and any summary
    in between). Every message before ``k`` must have a view (else ``k`` moves back to the
    first one without); the model sees them from the latest summary (``s``) on.
    """
    n = len(roles)
    i, seen_user = n - 1, False
    while i >= 0:
        if roles[i] == "user":
            seen_user = True
        elif seen_user and not summary[i]:
            break
        i -= 1
    k = max(i, 0)
    for j in range(k):
        if not has_view[j]:
            k = j
            break
    s = 0
    for j in range(k - 1, -1, -1):
        if summary[j]:
            s = j
            break
    return s, k


class Persistence(abc.ABC):
    """Where sessions, messages and parts live. Implementations: memory, SQL."""

    #: whether the store keeps model views (``upsert_batch(..., view=)``); the engine makes
    #: them only for such a store
    keeps_views: bool = False
    #: whether a commit waits on something (a server's answer, a pass of the event loop): a
    #: batch item then sends its step's start while the model is called (see
    #: :meth:`we0nb.engine.writer.Writer.write_soon`); a store that answers at once gains nothing
    commit_waits: bool = False

    # ---- sessions
    @abc.abstractmethod
    async def get_session(self, session_id: str) -> Optional[Session]: ...

    @abc.abstractmethod
    async def upsert_session(self, session: Session) -> None: ...

    @abc.abstractmethod
    async def list_sessions(self) -> list[Session]: ...

    # ---- messages and parts
    @abc.abstractmethod
    async def upsert_message(self, message: MessageInfo) -> None: ...

    @abc.abstractmethod
    async def upsert_part(self, part: Part) -> None: ...

    async def upsert_parts(self, parts: Sequence[Part]) -> None:
        """Write several parts at once (one transaction where the backend has them)."""
        await self.upsert_batch(None, parts)

    async def upsert_batch(self, message: Optional[MessageInfo], parts: Sequence[Part], *,
                           view: Optional[str] = None, before: Optional[Batch] = None) -> None:
        """Write a message and parts together — one transaction where the backend has them.

        The loop uses it where several writes belong to one durability point (a step's
        start, a step's end), so a crash keeps all of them or none. ``view`` is given with
        a message's final write (stores with :attr:`keeps_views` only): the message as the
        model sees it (:func:`we0nb.models.view.dump_view`), kept until the message or one
        of its parts is written again. ``before``: another ``(message, parts, view)`` written
        first, in the same transaction (a step's end with the next step's start).
        """
        writes: list[Batch] = [] if before is None else [before]
        writes.append((message, parts, view))
        await self.commit(writes)

    async def commit(self, writes: Sequence[Batch], *, lease: Optional[Lease] = None,
                     session: Optional[Session] = None) -> None:
        """Write every ``(message, parts, view)`` of ``writes``, in order, in one transaction.

        This is the engine's only write path during a run: each call is one durability
        point. ``view`` is given with a message's final write (stores with
        :attr:`keeps_views` only). With ``lease``, the write is conditional on the lease: the
        transaction first checks (and renews) that ``lease.owner`` still holds the session;
        if another run took it over, nothing is written, ``lease`` is marked lost and
        :class:`~we0nb.LeaseLostError` is raised. ``session``: the session's row, written
        first in the same transaction (a new session with its first messages, the time a run
        ended with its last ones). The default here writes one row at a time (a store without
        transactions); real stores override it.
        """
        if lease is not None:
            await self.check_lease(lease)
        if session is not None:
            await self.upsert_session(session)
        for message, parts, _view in writes:
            if message is not None:
                await self.upsert_message(message)
            for p in parts:
                await self.upsert_part(p)

    async def check_lease(self, lease: Lease) -> None:
        """Raise :class:`~we0nb.LeaseLostError` (marking ``lease`` lost) unless it is still held."""
        lease.check()

    @abc.abstractmethod
    async def load_transcript(self, session_id: str) -> Transcript:
        """Messages in creation order, each with its parts in creation order."""

    async def load_recent(self, session_id: str) -> RecentHistory:
        """What a run starts from (see :class:`RecentHistory`); by default the whole transcript."""
        tr = await self.load_transcript(session_id)
        return RecentHistory(session=tr.session, earlier=[], messages=tr.messages)

    @abc.abstractmethod
    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        """Delete these messages and their parts for good (used when a revert is cleared)."""

    # ---- the session lease
    @abc.abstractmethod
    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        """Take the session's lease or raise :class:`~we0nb.SessionBusyError`."""

    @abc.abstractmethod
    async def release_lease(self, lease: Lease) -> None: ...

    async def lease_and_session(self, session_id: str, run_id: str) -> tuple[Lease, Optional[Session]]:
        """What a run starts from: the session's lease, then the session as stored once the lease
        is held (None: there is none). A store that can send both at once overrides it."""
        lease = await self.acquire_lease(session_id, run_id)
        try:
            return lease, await self.get_session(session_id)
        except BaseException:
            await lease.release()
            raise

    # ---- batches (see :mod:`we0nb.persistence.batches`; the runner is :mod:`we0nb.batch`)
    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        """Create the batch ``name`` with ``items``, or load it when it exists (one transaction).

        An existing batch must hold the same prompts (and the same session ids when
        ``session_ids_given``): else ValueError naming the batch and the first item that differs.
        """
        raise self._no_batches()

    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float,
                                expires: float) -> list[BatchItem]:
        """Claim up to ``n`` claimable items (queued, claim expired), in item order: each becomes
        ``running``, held by ``owner`` (``host:pid:worker``, see :func:`lease_owner`) until
        ``expires``, its ``attempts`` counted. Two claimers
        never get the same item (one statement: an atomic UPDATE; PostgreSQL skips locked rows)."""
        raise self._no_batches()

    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> int:
        """Push the expiry of every item ``owner`` holds to ``expires``; returns how many it holds."""
        raise self._no_batches()

    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        """Record the end of ``owner``'s run of ``item``; False (and nothing written) when
        ``owner`` no longer holds it (its claim lapsed and another worker took it)."""
        raise self._no_batches()

    async def end_and_claim(self, name: str, item: int, owner: str, end: ItemEnd, *, claim: int, now: float,
                            expires: float) -> tuple[bool, list[BatchItem]]:
        """A worker's slot turning over: :meth:`end_batch_item`, then :meth:`claim_batch_items`
        of up to ``claim`` items (none for 0). A store that can send both at once overrides it."""
        ended = await self.end_batch_item(name, item, owner, end)
        items = await self.claim_batch_items(name, owner, claim, now=now, expires=expires) if claim else []
        return ended, items

    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        """Queue ended items to run again (failed ones for a retry, decided approvals); running
        items are left alone. Returns how many were queued."""
        raise self._no_batches()

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        """Make claimable at once the items held by a worker whose process is gone (same host,
        PID not alive; or this PID and an owner not in ``live``). Returns how many."""
        return 0

    async def batch_items(self, name: str) -> list[BatchItem]:
        """Every item of the batch, in item order (empty when there is no such batch)."""
        raise self._no_batches()

    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        """Every batch (or only ``name``), by name, with its counts by status."""
        raise self._no_batches()

    def _no_batches(self) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not keep batches; use MemoryPersistence or SqlPersistence "
            "(or implement the batch methods of the Persistence port)."
        )

    # ---- lifecycle
    async def flush(self) -> None:
        """Make every write so far durable (a no-op where writes are already durable)."""

    async def close(self) -> None:
        """Release connections. The object may be used again afterwards (it reopens)."""

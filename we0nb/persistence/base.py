"""The persistence port: what the engine needs from a store, as small capabilities.

A store is the sum of the capabilities it has, each a :class:`~typing.Protocol` (a store has one
by its methods; a run's two come by subclassing :class:`Persistence`):

* :class:`SessionStore` — sessions and transcripts: read and write sessions, :meth:`~SessionStore.commit`
  a run's writes (the engine's only write path during a run), load a transcript or its recent part,
  delete messages (a revert cleared);
* :class:`LeaseStore` — the session lease: one run per session at a time, across processes;
* :class:`~we0nb.persistence.batches.BatchQueue` — the batch queue that ``agent.batch()`` claims items from;
* :class:`~we0nb.persistence.columns.ColumnReads` — the frames' column reads, in bulk;
* :class:`~we0nb.persistence.scores.ScoreStore` — what ``batch.score`` found;
* :class:`~we0nb.persistence.copies.CopyStore` — copies made in the store (a cheap fork).

:class:`Persistence` is what a run needs — sessions and transcripts plus the lease — and what
``We0Agent(persistence=...)`` takes (an instance of a subclass). :class:`~we0nb.MemoryPersistence`
has the first five, :class:`~we0nb.SqlPersistence` all six; :mod:`we0nb.persistence.conformance`
checks a store against the ones it has (``docs/stores.md``: the rules a store of your own follows).

Every method is async. Writes are upserts keyed by id, so the engine can write the same part
again as it progresses (pending → running → completed). The engine holds a session lease for
the whole run, so within a run it is the only writer of that session.
"""

from __future__ import annotations

import abc
import asyncio
import os
import socket
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence, Union, runtime_checkable

from ..errors import LeaseLostError
from ..messages import AssistantMessage, MessageWithParts, Part, Session, Transcript, UserMessage
from ..models.base import ModelMessage

__all__ = ["SessionStore", "LeaseStore", "Persistence", "Lease", "lease_owner", "RecentHistory", "recent_start",
           "Write", "MessageInfo"]

MessageInfo = Union[UserMessage, AssistantMessage]
#: one write of a commit: (message or None, parts, the message's model view or None); see :meth:`SessionStore.commit`
Write = tuple[Optional[MessageInfo], Sequence[Part], Optional[str]]


def lease_owner(run_id: str) -> str:
    """``host:pid:run_id`` — who holds a lease, readable in errors and in the database."""
    return (_owner_prefix or _own_prefix()) + run_id


#: ``host:pid:`` of this process, asked of the system once (two system calls a lease were ~1.5%
#: of a judge's verdict in memory); a forked child asks again (its pid is its own)
_owner_prefix = ""


def _own_prefix() -> str:
    global _owner_prefix
    _owner_prefix = f"{socket.gethostname()}:{os.getpid()}:"
    return _owner_prefix


def _forget_prefix() -> None:
    global _owner_prefix
    _owner_prefix = ""


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_prefix)


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
    persistence: "LeaseStore" = field(repr=False)
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


@runtime_checkable
class SessionStore(Protocol):
    """Sessions and transcripts: what a run reads and writes of its session's history."""

    #: whether the store keeps model views (the ``view`` of a :data:`Write`); the engine makes
    #: them only for such a store
    keeps_views: bool = False
    #: whether a commit waits on something (a server's answer, a pass of the event loop): a
    #: batch item then sends its step's start while the model is called (see
    #: :meth:`we0nb.engine.writer.Writer.write_soon`); a store that answers at once gains nothing
    commit_waits: bool = False

    @abc.abstractmethod
    async def get_session(self, session_id: str) -> Optional[Session]:
        """The session as stored, or None."""

    @abc.abstractmethod
    async def upsert_session(self, session: Session) -> None:
        """Write the session's row (insert or replace)."""

    @abc.abstractmethod
    async def list_sessions(self) -> list[Session]:
        """Every session, by id."""

    @abc.abstractmethod
    async def commit(self, writes: Sequence[Write], *, lease: Optional[Lease] = None,
                     session: Optional[Session] = None) -> None:
        """Write every ``(message, parts, view)`` of ``writes``, in order, as one transaction.

        This is the engine's only write path during a run: each call is one durability point —
        all of it is written, or (an error, a lost lease) none of it. Within ``writes`` a later
        write of a row replaces an earlier one. ``view`` is given with a message's final write
        (stores with :attr:`keeps_views` only): the message as the model sees it
        (:func:`we0nb.models.view.dump_view`), kept until the message or one of its parts is
        written again. With ``lease``, the write is conditional on the lease: the transaction
        first checks (and renews) that ``lease.owner`` still holds the session; if another run
        took it over, nothing is written, ``lease`` is marked lost and
        :class:`~we0nb.LeaseLostError` is raised. ``session``: the session's row, written first
        in the same transaction (a new session with its first messages, the time a run ended
        with its last ones).
        """

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

    async def flush(self) -> None:
        """Make every write so far durable (a no-op where writes are already durable)."""
        return None

    async def close(self) -> None:
        """Release connections. The object may be used again afterwards (it reopens)."""
        return None


@runtime_checkable
class LeaseStore(Protocol):
    """The session lease: one run per session at a time, also across processes sharing a database."""

    @abc.abstractmethod
    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        """Take the session's lease or raise :class:`~we0nb.SessionBusyError`."""

    @abc.abstractmethod
    async def release_lease(self, lease: Lease) -> None:
        """Give the lease back; a lease another run holds now (``lease`` was lost) is left alone."""

    @abc.abstractmethod
    async def lease_and_session(self, session_id: str, run_id: str) -> tuple[Lease, Optional[Session]]:
        """What a run starts from: the session's lease, then the session as stored once the lease
        is held (None: there is none)."""

    @abc.abstractmethod
    async def check_lease(self, lease: Lease) -> None:
        """Raise :class:`~we0nb.LeaseLostError` (marking ``lease`` lost) unless it is still held."""


class Persistence(SessionStore, LeaseStore):
    """What a run needs of a store: sessions and transcripts, and the session lease.

    ``We0Agent(persistence=...)`` takes an instance. Implementations: :class:`~we0nb.MemoryPersistence`,
    :class:`~we0nb.SqlPersistence` (both also keep batches and read columns for the frames).
    """

    async def lease_and_session(self, session_id: str, run_id: str) -> tuple[Lease, Optional[Session]]:
        """The lease, then the session (a store that can send both at once overrides it)."""
        lease = await self.acquire_lease(session_id, run_id)
        try:
            return lease, await self.get_session(session_id)
        except BaseException:
            await lease.release()
            raise

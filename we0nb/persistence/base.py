"""The persistence port: what the engine needs from a store, and nothing of the loop.

Every method is async. Writes are upserts keyed by id, so the engine can write the same
part again as it progresses (pending → running → completed). The engine holds a session
lease for the whole run, so within a run it is the only writer of that session.
"""

from __future__ import annotations

import abc
import os
import socket
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..messages import AssistantMessage, Part, Session, Transcript, UserMessage

__all__ = ["Persistence", "Lease", "lease_owner"]

MessageInfo = Union[UserMessage, AssistantMessage]


def lease_owner(run_id: str) -> str:
    """``host:pid:run_id`` — who holds a lease, readable in errors and in the database."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


@dataclass
class Lease:
    """A held session lease. ``release()`` it (the engine does, in a ``finally``)."""

    session_id: str
    run_id: str
    owner: str
    persistence: "Persistence" = field(repr=False)
    released: bool = False

    async def release(self) -> None:
        if not self.released:
            self.released = True
            await self.persistence.release_lease(self)


class Persistence(abc.ABC):
    """Where sessions, messages and parts live. Implementations: memory, SQL."""

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

    async def upsert_batch(self, message: Optional[MessageInfo], parts: Sequence[Part]) -> None:
        """Write a message and parts together — one transaction where the backend has them.

        The loop uses it where several writes belong to one durability point (a step's
        start, a step's end), so a crash keeps all of them or none.
        """
        if message is not None:
            await self.upsert_message(message)
        for p in parts:
            await self.upsert_part(p)

    @abc.abstractmethod
    async def load_transcript(self, session_id: str) -> Transcript:
        """Messages in creation order, each with its parts in creation order."""

    @abc.abstractmethod
    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        """Delete these messages and their parts for good (used when a revert is cleared)."""

    # ---- the session lease
    @abc.abstractmethod
    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        """Take the session's lease or raise :class:`~we0nb.SessionBusyError`."""

    @abc.abstractmethod
    async def release_lease(self, lease: Lease) -> None: ...

    # ---- lifecycle
    async def flush(self) -> None:
        """Make every write so far durable (a no-op where writes are already durable)."""

    async def close(self) -> None:
        """Release connections. The object may be used again afterwards (it reopens)."""

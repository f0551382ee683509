"""Copies at the persistence port: a session's rows copied under new ids inside the store.

A fork (:mod:`we0nb.engine.fork`) copies a session's history into a new one. Through
:class:`~we0nb.persistence.base.SessionStore` alone that means loading every message as objects
and writing every one back; a store with :class:`CopyStore` lets the engine decide from a light
index of the session (:class:`SessionIndex`: ids, roles, times, statuses — no documents) and copy
the rows that need no change but their ids in the store itself, in one transaction. The engine
still makes every decision — which messages are visible, where the copy ends, the new ids, which
messages must be changed as objects (an unfinished one is closed; a call without its key gets it)
— and writes those few itself, in the same transaction.

A renamed copy is the source row with its id, its session and the ids it refers to replaced (a
part's message, an assistant message's parent): every other field, the document's text and a
message's stored model view are kept as they are.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from ..messages import MessageWithParts, Session
from .base import Lease, Write

__all__ = ["IndexedPart", "IndexedMessage", "SessionIndex", "Rename", "CopyStore"]


class IndexedPart(NamedTuple):
    """A part as the index shows it (a tuple: an index holds thousands)."""

    id: str
    type: str
    #: a tool call's status (None for other parts)
    status: Optional[str]
    #: the store can copy it renamed (its document is laid out as the store expects)
    copyable: bool
    #: a tool call's document holds its idempotency key (True for other parts)
    keyed: bool


class IndexedMessage(NamedTuple):
    """A message as the index shows it, with its parts in order."""

    id: str
    role: str
    created: float
    #: its completion time is set (an assistant message that finished; a user message has none)
    completed: bool
    parent_id: Optional[str]
    #: the store can copy it renamed, its model view included
    copyable: bool
    parts: tuple[IndexedPart, ...]


@dataclass(frozen=True)
class SessionIndex:
    """A session and its messages (also those a revert hides), in order."""

    session: Session
    messages: list[IndexedMessage]


#: a row to copy renamed: (its id in the source, its new id, the new id it refers to — a part's
#: message; an assistant message's parent, None for none)
Rename = tuple[str, str, Optional[str]]


@runtime_checkable
class CopyStore(Protocol):
    """A session's rows copied under new ids inside the store (what makes a fork cheap)."""

    @abc.abstractmethod
    async def session_index(self, session_id: str, upto: Optional[str] = None) -> Optional[SessionIndex]:
        """The session and its messages' index (None: no such session): every message, or those
        up to and including the id ``upto`` (ids sort in creation order)."""

    @abc.abstractmethod
    async def load_messages(self, session_id: str, message_ids: Sequence[str]) -> list[MessageWithParts]:
        """These messages of the session as objects, with their parts, in order (an id that is not
        there is left out)."""

    @abc.abstractmethod
    async def copy_rows(self, source: str, target: str, messages: Sequence[Rename], parts: Sequence[Rename],
                        writes: Sequence[Write], *, session: Session, lease: Lease) -> None:
        """One transaction, conditional on ``lease`` (of ``target``): ``session``'s row, then the
        ``parts`` of session ``source`` copied renamed into ``target``, then its ``messages``
        (keeping their model views), then ``writes`` as :meth:`~.base.SessionStore.commit` writes
        them. A row that is not in ``source`` or cannot be copied renamed is not copied. New ids
        must be new: a clash is an error and writes nothing."""

"""Persistence: the port (small capabilities, :mod:`.base`) and its implementations.

Capabilities: :class:`SessionStore` (sessions and transcripts), :class:`LeaseStore` (the session
lease), :class:`BatchQueue` (the batch queue), :class:`ColumnReads` (the frames' column reads),
``scores.ScoreStore`` (scores) and ``copies.CopyStore`` (copies made in the store);
:class:`Persistence` is what a run needs (the first two). Implementations: :class:`MemoryPersistence`,
:class:`SqlPersistence`. :mod:`.conformance` checks a store against the capabilities it has.
"""

from typing import Any

from .base import Lease, LeaseStore, Persistence, RecentHistory, SessionStore, Write
from .batches import BatchQueue
from .columns import ColumnReader, ColumnReads
from .memory import MemoryPersistence

__all__ = ["Persistence", "SessionStore", "LeaseStore", "BatchQueue", "ColumnReads", "ColumnReader", "Lease",
           "RecentHistory", "Write", "MemoryPersistence", "SqlPersistence"]


def __getattr__(name: str) -> Any:
    # SqlPersistence pulls in SQLAlchemy: import it only when asked for.
    if name == "SqlPersistence":
        from .sql import SqlPersistence

        return SqlPersistence
    raise AttributeError(name)

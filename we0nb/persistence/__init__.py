"""Persistence: the port and its implementations."""

from .base import Lease, Persistence, RecentHistory
from .memory import MemoryPersistence

__all__ = ["Persistence", "Lease", "RecentHistory", "MemoryPersistence", "SqlPersistence"]


def __getattr__(name: str):
    # SqlPersistence pulls in SQLAlchemy: import it only when asked for.
    if name == "SqlPersistence":
        from .sql import SqlPersistence

        return SqlPersistence
    raise AttributeError(name)

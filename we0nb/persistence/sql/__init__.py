"""SqlPersistence: the persistence port on SQL (SQLite, PostgreSQL) through SQLAlchemy 2."""

from .store import SqlPersistence

__all__ = ["SqlPersistence"]

"""Driver errors (sqlite3, SQLAlchemy, psycopg, OSError) as :class:`~we0nb.PersistenceError`.

Every path to the database (inline SQLite, the async engine, the frames' readers) raises
through here, so a user sees one kind of error, with the original chained.
"""

from __future__ import annotations

from typing import NoReturn

from ...errors import PersistenceError

__all__ = ["is_readonly_error", "raise_persistence_error"]


def is_readonly_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "readonly" in text or "read-only" in text or getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY"


def raise_persistence_error(e: BaseException, where: str) -> NoReturn:
    """Re-raise a driver error, as a PersistenceError that says what to do when it is read-only."""
    if is_readonly_error(e):
        raise PersistenceError(
            f"The database {where} is read-only ({e}): we0nb writes every message and part as it "
            "happens. Make the file and its folder writable, or use another database."
        ) from e
    raise e

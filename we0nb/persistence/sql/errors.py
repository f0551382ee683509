"""Driver errors (sqlite3, SQLAlchemy, psycopg, OSError) as :class:`~we0nb.PersistenceError`.

Every path to the database (inline SQLite, the async engine, schema work, the lease, the
frames' readers) turns a driver error into a PersistenceError through :func:`wrap`: one
line that says what went wrong and what to do, the original chained as ``__cause__``. The
engine tells a storage failure from a model failure by this type.
"""

from __future__ import annotations

import re
import sys
from typing import NoReturn

from ...errors import PersistenceError

__all__ = ["Busy", "driver_errors", "is_busy", "is_readonly_error", "masked_url", "raise_persistence_error", "wrap"]

_PASSWORD = re.compile(r"(://[^:/@]*):[^/]*@")  # (to the last @ before the path: a password may hold @)


def masked_url(text: str) -> str:
    """A database URL as it may be shown (its password as ``***``), also one that does not parse."""
    return _PASSWORD.sub(r"\1:***@", text)


class Busy(Exception):
    """SQLite: another connection holds the write lock, try again later (never escapes this package)."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def driver_errors() -> tuple[type[BaseException], ...]:
    """The exception types a database driver raises (psycopg's only once it is loaded)."""
    import sqlite3

    from sqlalchemy.exc import SQLAlchemyError

    errors: tuple[type[BaseException], ...] = (sqlite3.Error, SQLAlchemyError, OSError)
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None:
        errors += (psycopg.Error,)
    return errors


def _text(e: BaseException) -> str:
    orig = getattr(e, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's error
    first = str(orig if orig is not None else e).strip().splitlines()
    return first[0] if first else type(e).__name__


def _code(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    return str(getattr(orig, "sqlite_errorname", "") or getattr(orig, "sqlstate", "") or "")


def is_readonly_error(exc: BaseException) -> bool:
    text = _text(exc).lower()
    return "readonly" in text or "read-only" in text or _code(exc).startswith("SQLITE_READONLY") \
        or _code(exc) == "25006"


def is_busy(exc: BaseException) -> bool:
    """SQLite's ``database is locked`` (another connection holds the write lock)."""
    code = _code(exc)
    return code.startswith("SQLITE_BUSY") or code.startswith("SQLITE_LOCKED") or (
        not code and "database is locked" in _text(exc))


def _advice(e: BaseException, where: str) -> str:
    text, code = _text(e), _code(e)
    low = text.lower()
    if is_readonly_error(e):
        return (f"The database {where} is read-only ({text}): we0nb writes every message and part as it "
                "happens. Make the file and its folder writable, or use another database.")
    if code.startswith("SQLITE_FULL") or code in ("53100", "53200") or "disk is full" in low \
            or "no space left" in low or getattr(e, "errno", None) == 28:
        return (f"The database {where} cannot grow ({text}): its disk (or quota) is full. "
                "Free some space and try again; what was committed before is intact.")
    if is_busy(e):
        return (f"The database {where} stayed locked by another connection for longer than busy_timeout "
                f"({text}). Try again once the other writer is done; from Python, a longer wait is "
                "SqlPersistence(busy_timeout=...).")
    if code.startswith("SQLITE_CANTOPEN") or "unable to open database" in low:
        return (f"Cannot open the database {where} ({text}): the path must be a file (or a place for one) "
                "in a folder you can read and write.")
    if code in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or "not a database" in low or "malformed" in low:
        return (f"The database {where} is not a we0nb database or is damaged ({text}). "
                "Use another database (another URL; on the command line, another --db), or restore this one from a backup.")
    if "nul" in low and ("0x00" in low or "character" in low):
        return (f"The database {where} cannot store a NUL character in an id ({text}). "
                "Use ids without control characters.")
    if code.startswith("08") or "connection" in low or "could not connect" in low:
        return (f"Cannot reach the database {where} ({text}). Check that the server runs and that the "
                "URL, user and password are right.")
    return f"The database {where} failed ({type(e).__name__}: {text}). Check the database, then try again."


def wrap(e: BaseException, where: str) -> PersistenceError:
    """The PersistenceError to raise ``from e`` for a driver error (one line, what to do)."""
    if isinstance(e, PersistenceError):
        return e
    return PersistenceError(_advice(e, where))


def raise_persistence_error(e: BaseException, where: str) -> NoReturn:
    """Raise :func:`wrap` of a driver error, with the original chained."""
    if isinstance(e, PersistenceError):
        raise e
    raise wrap(e, where) from e

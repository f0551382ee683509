"""A SQLite database on read-only storage (a read-only mount, a snapshot, a read-only volume): read anyway.

Why: a database in WAL mode needs its ``-shm`` file even to be read, and SQLite creates it
beside the database; where it cannot (the storage is read-only) even ``mode=ro`` fails with
"unable to open database file". Such a database is then opened with SQLite's ``immutable=1``:
the database file alone is read, without locks and without the WAL. What a clean close left
is all there (we0nb's last connection checkpoints and removes the WAL); a ``-wal`` file left
by a process that did not close holds changes that are not read, and the warning says so.
The fallback is logged (``we0nb.persistence.sql``: a warning), never silent.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from typing import Optional
from urllib.parse import quote

__all__ = ["on_read_only_storage", "read_only_uri", "read_only_fallback"]

log = logging.getLogger("we0nb.persistence.sql")

_told: set[str] = set()  # the files whose fallback was logged (once per file and process)


def on_read_only_storage(path: str) -> bool:
    """Whether ``path``'s folder is on storage no one may write (a read-only mount), root included."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return True
    except (OSError, AttributeError):  # pragma: no cover - no statvfs on this platform
        pass
    return False


def _uri(path: str, query: str) -> str:
    return "file:" + quote(os.path.abspath(path)) + "?" + query


def _readable(uri: str) -> bool:
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=0)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return True


def read_only_uri(path: str) -> str:
    """The URI to read the SQLite file ``path`` with, writing nothing: ``mode=ro`` when that reads
    it, else (read-only storage) ``mode=ro&immutable=1``, with a warning that says so."""
    plain = _uri(path, "mode=ro")
    if not on_read_only_storage(path) or _readable(plain):
        return plain
    wal = path + "-wal"
    try:
        unread = os.path.getsize(wal)
    except OSError:
        unread = 0
    note = (f"we0nb: {path} is on read-only storage, where SQLite cannot make the files a WAL database "
            "is read with; reading it with immutable=1 (the database file alone)")
    if unread:
        note += (f" - its WAL file ({unread} bytes, left by a process that did not close it) holds changes "
                 "that are not read; copy the database with its -wal file to writable storage to see them")
    if os.path.abspath(path) not in _told:
        _told.add(os.path.abspath(path))
        log.warning(note)
    return _uri(path, "mode=ro&immutable=1")


def read_only_fallback(database: str, uri: bool) -> Optional[str]:
    """For a SQLite file (not a URI, not in memory) on read-only storage: the URI to read it with
    (:func:`read_only_uri`); None for any other database (it is opened as usual)."""
    if uri or not database or database == ":memory:" or not os.path.isfile(database):
        return None
    if not on_read_only_storage(database):
        return None
    return read_only_uri(database)

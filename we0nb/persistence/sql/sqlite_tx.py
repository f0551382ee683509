"""The write transactions on one ``sqlite3`` connection, for both places that run them.

:class:`~.inline.InlineSqlite` runs them on the event loop's thread, the writer process of
:mod:`.sqlite_writer` on its own core; both must mean the same by a commit (its guard first,
its rows only when the guard changed one row, all or nothing), so the code is here once.
Standard library only: the writer process loads this file alone, without the we0nb package.

``sql`` maps a statement key to its text (:func:`~.statements.statements` of ``"sqlite"``);
an op is ``(key, params)`` or ``(key, [params, ...])`` (executemany).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any, Iterator, Mapping, Optional, Sequence

__all__ = ["Op", "Commit", "run_ops", "writing", "together", "statements", "execute"]

#: ``(statement key, params)`` or ``(statement key, [params, ...])`` (executemany)
Op = tuple[str, Any]
#: a commit: its ops, and the guard that must change one row for them to be written
Commit = tuple[Sequence[Op], Optional[Op]]


def run_ops(conn: sqlite3.Connection, sql: Mapping[str, str], ops: Sequence[Op]) -> None:
    for key, params in ops:
        if isinstance(params, list):
            conn.executemany(sql[key], params)
        else:
            conn.execute(sql[key], params)


@contextlib.contextmanager
def writing(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction (``BEGIN IMMEDIATE``): committed at the end, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def together(conn: sqlite3.Connection, sql: Mapping[str, str], commits: Sequence[Commit]) -> list[bool]:
    """Each commit's guard, then its ops when the guard changed one row; one transaction.
    Returns, for each commit, whether it was written."""
    out = []
    with writing(conn):
        for ops, guard in commits:
            ok = guard is None or conn.execute(sql[guard[0]], guard[1]).rowcount == 1
            if ok:
                run_ops(conn, sql, ops)
            out.append(ok)
    return out


def statements(conn: sqlite3.Connection, sql: Mapping[str, str],
               queries: Sequence[tuple[str, dict[str, Any], bool]]) -> list[Any]:
    """``(key, params, rows)`` statements in one transaction: each one's rows (``rows``) or row count."""
    out = []
    with writing(conn):
        for key, params, rows in queries:
            cur = conn.execute(sql[key], params)
            out.append(cur.fetchall() if rows else cur.rowcount)
    return out


def execute(conn: sqlite3.Connection, sql: Mapping[str, str], key: str, params: dict[str, Any]) -> int:
    """One statement in autocommit mode (its own transaction); returns its row count."""
    return conn.execute(sql[key], params).rowcount

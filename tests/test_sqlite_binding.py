"""SQLite binds a statement's values by position (we0nb/persistence/sql/sqlite_exec.py).

The statements are written once, with named values (``compiled``: PostgreSQL's, and SQLite's
copies); SQLite's are compiled again with ``?`` placeholders, and a row (a dict) becomes the tuple
of its values in their order. These tests hold that order to the named text's, value for value,
and check what a ``None`` and a ``bool`` become in the database.
"""

from __future__ import annotations

import re
import sqlite3

import pytest

from we0nb.persistence.sql import statements as q
from we0nb.persistence.sql.sqlite_exec import execute, execute_many

_LITERAL = re.compile(r"'(?:[^']|'')*'")
_NAMED = re.compile(r"(?<![:\w]):(\w+)")


def _names(named_sql: str) -> list[str]:
    """The named placeholders of ``named_sql`` in order (string literals left out)."""
    return _NAMED.findall(_LITERAL.sub("''", named_sql))


def test_every_statement_binds_the_values_its_named_text_names_in_the_same_order():
    named, positional = q.compiled("sqlite"), q.positional()
    assert set(named) == set(positional)
    checked = 0
    for stmt, (sql, values) in positional.items():
        names = _names(named[stmt])
        row = {n: f"<{n}>" for n in names}
        got = values(row)
        if stmt in q._COPIES:  # (the copies' hand-written texts: bound by name, as written)
            assert sql == named[stmt] and got is row, stmt
            continue
        assert ":" not in _LITERAL.sub("''", sql).replace("::", ""), (stmt, sql)
        assert sql.count("?") == len(names), stmt
        assert got == tuple(f"<{n}>" for n in names), stmt
        checked += 1
    assert checked >= 30  # (the Core statements; a regression to named binding fails above)


def test_the_hot_statements_are_bound_by_position():
    for stmt in (q.UPSERT_PART, q.UPSERT_MESSAGE, q.UPSERT_SESSION, q.LEASE_GUARD, q.GET_SESSION):
        sql, _ = q.positional()[stmt]
        assert "?" in sql and sql != q.compiled("sqlite")[stmt], stmt


@pytest.fixture
def conn(tmp_path):
    from we0nb.persistence.sql.schema import SqliteDb, ensure_schema

    c = sqlite3.connect(str(tmp_path / "b.db"), isolation_level=None)
    ensure_schema(SqliteDb(c, "test"))
    yield c
    c.close()


def _part(i: int, **over):
    row = {"id": f"prt_{i}", "session_id": "ses_1", "message_id": "msg_1", "type": "text", "tool": None,
           "call_id": None, "status": None, "time_start": 1.5, "time_end": None, "interrupted": False,
           "interrupt_reason": None, "recalled": True, "data": "{}"}
    row.update(over)
    return row


def test_none_binds_null_and_bool_binds_an_integer(conn):
    execute(conn, q.UPSERT_PART, _part(1))
    execute_many(conn, q.UPSERT_PART, [_part(2, interrupted=True, recalled=False), _part(3, tool="t")])
    got = conn.execute("SELECT id, typeof(tool), typeof(time_end), interrupted, typeof(interrupted), recalled "
                       "FROM we0_parts ORDER BY id").fetchall()
    assert got == [("prt_1", "null", "null", 0, "integer", 1), ("prt_2", "null", "null", 1, "integer", 0),
                   ("prt_3", "text", "null", 0, "integer", 1)]


def test_a_row_missing_a_value_is_refused_before_anything_is_written(conn):
    row = _part(1)
    del row["status"]
    with pytest.raises(KeyError):
        execute(conn, q.UPSERT_PART, row)
    assert conn.execute("SELECT count(*) FROM we0_parts").fetchone() == (0,)

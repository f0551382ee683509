"""Running one of :mod:`.statements` on a ``sqlite3`` connection, its values bound by position.

Both SQLite drivers (:mod:`.inline`, and :mod:`.schema`'s set-up) run statements through
:func:`execute` and :func:`execute_many`: the text of :func:`~.statements.positional` and the
row's values as a tuple, in the placeholders' order. A named placeholder costs ``sqlite3`` a call
into SQLite for its name and a lookup in the row per value (on 3.11 with the GIL released and
taken back around the call); a judge's verdict binds ~140 values. Measured with callgrind (W3 on
SQLite, 3.11): 1,974k instructions per tool step bound by name, 1,832k by position.

The two adapters registered here serve the values that are not exactly an ``int``, ``float`` or
``str`` — a row's ``None``s and ``bool``s (~44 per verdict). ``sqlite3`` sends those through its
adapter protocol: a registry lookup, then ``__adapt__`` on the protocol, which on 3.11 raises and
clears an AttributeError with a formatted message (~300 ns a value; ~150 ns on 3.13). With an
adapter registered for their type it is one lookup and one call. They bind what was bound before
(NULL, and a ``bool`` as the integer 0 or 1, as ``sqlite3`` always did), so registering them for
the whole process changes no other code's values.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Callable, Sequence, cast

from .statements import Stmt, positional

__all__ = ["execute", "execute_many"]

sqlite3.register_adapter(type(None), cast(Callable[[None], None], {}.get))  # ({}.get(None) is None: C, no frame)
sqlite3.register_adapter(bool, int)

_STATEMENTS = positional()


def execute(conn: sqlite3.Connection, stmt: Stmt, params: dict[str, Any]) -> sqlite3.Cursor:
    """``stmt`` with ``params`` (a row, by column name) on ``conn``."""
    sql, values = _STATEMENTS[stmt]
    return conn.execute(sql, values(params))


def execute_many(conn: sqlite3.Connection, stmt: Stmt, rows: Sequence[dict[str, Any]]) -> sqlite3.Cursor:
    """``stmt`` once per row of ``rows`` (one ``executemany``)."""
    sql, values = _STATEMENTS[stmt]
    return conn.executemany(sql, map(values, rows))

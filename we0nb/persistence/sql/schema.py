"""The schema's one create/upgrade routine, used by every path to the database.

:func:`ensure_schema` reads the version row of ``we0_meta``: the current version costs one
read; none creates the tables (DDL compiled from :mod:`.tables`), an older one is upgraded
in place, a newer one is refused with :class:`~we0nb.SchemaVersionError`. Creation and
upgrades run under a write lock (SQLite ``BEGIN IMMEDIATE``; a PostgreSQL advisory lock)
and look at the version again once they hold it, so processes opening one database at
once never race. Two small adapters give the routine a connection: :class:`SqliteDb` (a
``sqlite3`` connection: the inline path) and :class:`ConnectionDb` (a SQLAlchemy
``Connection`` in a transaction: the async engine through ``run_sync``, and ``sync_engine()``).

Versions: 1 the first tables; 2 the model-view cache (column, triggers) and a partial tool
index; 3 session-id columns widened from 64 to :data:`~.tables.SESSION_ID_MAX` characters;
4 the batch tables (``we0_batches``, ``we0_batch_items``); 5 PostgreSQL's part trigger runs a
static statement (planned once per connection) instead of dynamic SQL planned at every row;
6 the claim index in item order (a claim reads the next items instead of sorting the queue);
7 the batch items' ``claim`` token (a claim whose answer was lost finds its own rows);
8 the scores table (``we0_scores``, ``batch.score``).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from typing import Any, Collection, Iterator, Optional, Protocol

from sqlalchemy.schema import CreateIndex, CreateSchema, CreateTable

from ...errors import PersistenceError, SchemaVersionError
from . import statements as q
from . import tables as S
from .sqlite_exec import execute
from .statements import Stmt, _dialect, compiled

__all__ = ["ensure_schema", "SqliteDb", "ConnectionDb", "check_version", "foreign_table"]

log = logging.getLogger("we0nb.persistence.sql")

VERSION_KEY = "schema_version"
#: the PostgreSQL advisory lock that serializes schema work ("we0nb" in ASCII)
_PG_LOCK = 0x7765306E62


class SchemaDb(Protocol):
    @property
    def dialect(self) -> str: ...

    @property
    def where(self) -> str: ...

    @property
    def pg_schema(self) -> Optional[str]: ...

    def rows(self, stmt: Stmt, params: dict[str, Any]) -> list[Any]: ...

    def run(self, sql: str) -> None: ...

    def exclusive(self) -> contextlib.AbstractContextManager[None]: ...


# --------------------------------------------------------------------------- the routine


def ensure_schema(db: SchemaDb) -> None:
    """Make the database hold the current schema, or raise why it cannot."""
    if _version(db) == S.SCHEMA_VERSION:
        return
    with db.exclusive():
        version = _version(db)  # again, under the lock: another process may have done it
        if version is None:
            _create(db)
        elif version < S.SCHEMA_VERSION:
            for sql in upgrade(version, db.dialect):
                db.run(sql)
            db.rows(q.VERSION_UPDATE, {"key": VERSION_KEY, "value": str(S.SCHEMA_VERSION)})
            log.info("upgraded %s from we0nb schema version %s to %s", db.where, version, S.SCHEMA_VERSION)


def _version(db: SchemaDb) -> Optional[int]:
    if not db.rows(q.HAS_TABLE, {"name": S.meta.name}):
        return None
    row = db.rows(q.VERSION_GET, {"key": VERSION_KEY})
    return check_version(row[0][0], db.where) if row else None


def check_version(value: Any, where: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise PersistenceError(
            f"The database {where} has an unreadable we0nb schema version {value!r} in table we0_meta; "
            "it was not written by we0nb, or it is damaged."
        ) from None
    if v > S.SCHEMA_VERSION:
        raise SchemaVersionError(
            f"The database {where} was written by a newer we0nb (schema version {v}; this version "
            f"reads schema version {S.SCHEMA_VERSION} and older). Upgrade we0nb (pip install -U we0nb) "
            "or use another database (another URL; on the command line, another --db)."
        )
    return v


def _create(db: SchemaDb) -> None:
    _refuse_foreign_tables(db)
    d = _dialect(db.dialect)
    if db.pg_schema is not None and db.dialect == "postgresql":
        db.run(str(CreateSchema(db.pg_schema, if_not_exists=True).compile(dialect=d)))
    for table in S.metadata.sorted_tables:
        db.run(str(CreateTable(table, if_not_exists=True).compile(dialect=d)))
        for index in table.indexes:
            db.run(str(CreateIndex(index, if_not_exists=True).compile(dialect=d)))
    for sql in triggers(db.dialect):
        db.run(sql)
    db.rows(q.VERSION_SET, {"key": VERSION_KEY, "value": str(S.SCHEMA_VERSION)})


def foreign_table(present: Collection[str]) -> Optional[str]:
    """Of a database's tables (``present``), the first named like one of we0nb's (its version table
    aside). In a database without a we0nb schema version it is another program's: we0nb makes its
    tables and their version in one transaction. (The writer refuses such a database, the reading
    commands say so.)"""
    return next((t.name for t in S.metadata.sorted_tables if t is not S.meta and t.name in present), None)


def _refuse_foreign_tables(db: SchemaDb) -> None:
    """Before creating: a table that creating "if not exists" would leave, to fail at the first read."""
    taken = foreign_table({t.name for t in S.metadata.sorted_tables if db.rows(q.HAS_TABLE, {"name": t.name})})
    if taken is not None:
        where = f"{db.where} (schema {db.pg_schema})" if db.pg_schema and db.dialect == "postgresql" else db.where
        raise PersistenceError(
            f"The database {where} already has a table named {taken} that we0nb did not make (the database "
            "has no we0nb schema version). Use another database (another URL; on PostgreSQL, another schema=), "
            "or rename that table.")


# --------------------------------------------------------------------------- DDL beyond the tables

_STALE = "UPDATE we0_messages SET model_view = NULL WHERE id = NEW.message_id AND model_view IS NOT NULL"


def triggers(dialect: str) -> list[str]:
    """The statements that make a part write drop its message's model view."""
    if dialect == "sqlite":
        return [f"CREATE TRIGGER IF NOT EXISTS we0_parts_view_{op.lower()} AFTER {op} ON we0_parts "
                f"BEGIN {_STALE}; END" for op in ("INSERT", "UPDATE")]
    # the messages table of the trigger's own schema (named when the function is made), whatever
    # the writer's search_path; a static statement, which PL/pgSQL plans once per connection
    # (dynamic SQL was planned again at every part written; W7's server CPU fell ~17% without it)
    return [
        "DO $do$ BEGIN EXECUTE 'CREATE OR REPLACE FUNCTION ' || quote_ident(current_schema()) "
        "|| '.we0_parts_view_stale() RETURNS trigger LANGUAGE plpgsql AS $b$ BEGIN UPDATE ' "
        "|| quote_ident(current_schema()) || '.we0_messages SET model_view = NULL "
        "WHERE id = NEW.message_id AND model_view IS NOT NULL; RETURN NULL; END $b$'; END $do$",
        "DROP TRIGGER IF EXISTS we0_parts_view ON we0_parts",
        "CREATE TRIGGER we0_parts_view AFTER INSERT OR UPDATE ON we0_parts "
        "FOR EACH ROW EXECUTE FUNCTION we0_parts_view_stale()",
    ]


#: the columns schema 3 widened to SESSION_ID_MAX (PostgreSQL enforces lengths; SQLite does not)
_SESSION_ID_COLUMNS = [(S.sessions, "id"), (S.messages, "session_id"), (S.parts, "session_id"),
                       (S.leases, "session_id")]


def upgrade(version: int, dialect: str) -> list[str]:
    """The statements that bring a database at schema ``version`` to :data:`~.tables.SCHEMA_VERSION`."""
    d = _dialect(dialect)
    out: list[str] = []
    if version < 2:  # 1 → 2: the model-view cache (2 also made the tool index partial; 9 drops it)
        out.append("ALTER TABLE we0_messages ADD COLUMN model_view TEXT")
        out.extend(triggers(dialect))
    if version < 3 and dialect == "postgresql":  # 2 → 3: session ids up to SESSION_ID_MAX characters
        for table, name in _SESSION_ID_COLUMNS:
            out.append(f"ALTER TABLE {table.name} ALTER COLUMN {name} TYPE {table.c[name].type.compile(dialect=d)}")
    if version < 4:  # 3 → 4: the batch tables
        for table in (S.batches, S.batch_items):
            out.append(str(CreateTable(table, if_not_exists=True).compile(dialect=d)))
            out.extend(str(CreateIndex(i, if_not_exists=True).compile(dialect=d)) for i in table.indexes)
    if 2 <= version < 5 and dialect == "postgresql":  # 4 → 5: the part trigger's static statement
        out.extend(triggers(dialect))
    if 4 <= version < 6:  # 5 → 6: the claim index in item order (4 created the old one above)
        out.append("DROP INDEX IF EXISTS ix_we0_batch_items_claim")
        out.append(str(CreateIndex(_index(S.batch_items, "ix_we0_batch_items_next"), if_not_exists=True)
                       .compile(dialect=d)))
    if 4 <= version < 7:  # 6 → 7: the claim token (4 created the table above, without it)
        exists = " IF NOT EXISTS" if dialect == "postgresql" else ""
        out.append(f"ALTER TABLE we0_batch_items ADD COLUMN{exists} claim VARCHAR(64)")
    if version < 8:  # → 8: the scores table (IF NOT EXISTS: whatever the version it came in)
        out.append(str(CreateTable(S.scores, if_not_exists=True).compile(dialect=d)))
    if version < 9:  # → 9: no tool index (no query used it; every tool part write maintained it)
        out.append("DROP INDEX IF EXISTS ix_we0_parts_tool")
    return out


def _index(table: Any, name: str) -> Any:
    return next(i for i in table.indexes if i.name == name)


# --------------------------------------------------------------------------- adapters


class SqliteDb:
    """A ``sqlite3`` connection in autocommit mode; :meth:`exclusive` is ``BEGIN IMMEDIATE``."""

    dialect = "sqlite"
    pg_schema: Optional[str] = None

    def __init__(self, conn: sqlite3.Connection, where: str):
        self.conn, self.where = conn, where

    def rows(self, stmt: Stmt, params: dict[str, Any]) -> list[Any]:
        return execute(self.conn, stmt, params).fetchall()

    def run(self, sql: str) -> None:
        self.conn.execute(sql)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise


class ConnectionDb:
    """A SQLAlchemy ``Connection`` inside a transaction the caller began."""

    def __init__(self, conn: Any, where: str, pg_schema: Optional[str]):
        self.conn, self.where = conn, where
        self.dialect = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
        self.pg_schema = pg_schema
        self._sql = compiled(self.dialect)

    def rows(self, stmt: Stmt, params: dict[str, Any]) -> list[Any]:
        result = self.conn.exec_driver_sql(self._sql[stmt], params)
        return list(result.all()) if result.returns_rows else []

    def run(self, sql: str) -> None:
        self.conn.exec_driver_sql(sql)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.dialect == "postgresql":  # held until the caller's transaction ends
            self.conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK})")
        yield

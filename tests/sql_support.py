"""Helpers shared by the SQL persistence tests: the PostgreSQL URL and throw-away schemas.

PostgreSQL tests read ``WE0NB_TEST_POSTGRES_URL`` (``.ci/run`` sets it to
``postgresql://postgres@127.0.0.1:5432/test``) and skip with that reason when it is unset.
Every test gets its own schema ``we0test_<random>``, dropped afterwards, so parallel runs
(``pytest -n 2``) never see each other's rows.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

PG_ENV = "WE0NB_TEST_POSTGRES_URL"
PG_URL: Optional[str] = os.environ.get(PG_ENV) or None
PG_SKIP_REASON = f"{PG_ENV} is not set: PostgreSQL tests need a server (.ci/run sets it)"


def _libpq(url: str) -> str:
    # psycopg.connect wants a libpq URL, not a SQLAlchemy one
    return url.replace("postgresql+psycopg://", "postgresql://").replace("postgresql+psycopg_async://", "postgresql://")


def create_schema() -> str:
    import psycopg

    assert PG_URL is not None
    name = f"we0test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return name


def drop_schema(name: str) -> None:
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def pg_execute(schema: str, sql: str, params: tuple = ()) -> list[tuple]:
    """Run one statement in ``schema`` (autocommit) and return its rows, if any."""
    import psycopg

    assert PG_URL is not None
    with psycopg.connect(_libpq(PG_URL), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def pg_tables(schema: str) -> list[str]:
    """The names of the tables in ``schema`` (a read-only command must leave it empty)."""
    rows = pg_execute(schema, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
                      (schema,))
    return [r[0] for r in rows]


@pytest.fixture
def pg_schema() -> Iterator[str]:
    if PG_URL is None:
        pytest.skip(PG_SKIP_REASON)
    name = create_schema()
    try:
        yield name
    finally:
        drop_schema(name)


def sqlite_raw(path):
    """A function that runs one SQL statement on the SQLite file ``path`` and returns its rows."""
    import sqlite3

    def raw(sql: str) -> list:
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()

    return raw


#: every store the port's tests run on (the conformance suite: tests/test_store_conformance.py)
ALL_STORES = ["memory", "sqlite", "sqlite-aiosqlite", "sqlite-engine",
              pytest.param("postgres", marks=pytest.mark.postgres),
              pytest.param("postgres-sqlalchemy", marks=pytest.mark.postgres)]
#: the SQL stores the tests of SQL behaviour run on by default (conftest's ``sql``)
SQL_STORES = ["sqlite", "sqlite-aiosqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Backend:
    """Makes persistences on one database; ``fresh()`` is a new instance on the same data."""

    def __init__(self, name: str, make: Callable[[], Any], raw: Optional[Callable[[str], list]] = None):
        self.name = name
        self._make = make
        self.raw = raw  # run one SQL statement directly on the database
        self.made: list[Any] = []
        self._mem: Any = None

    def fresh(self) -> Any:
        from we0nb import MemoryPersistence

        if self.name == "memory":  # memory has no second instance on the same data
            if self._mem is None:
                self._mem = MemoryPersistence()
            return self._mem
        p = self._make()
        self.made.append(p)
        return p


def backend_for(name: str, tmp_path: Path) -> Iterator[Backend]:
    """A :class:`Backend` of this name on a fresh database: closed and dropped afterwards."""
    from we0nb import MemoryPersistence, SqlPersistence

    db = tmp_path / "we0.db"
    schema = None
    if name == "memory":
        b = Backend(name, MemoryPersistence)
    elif name == "sqlite":
        b = Backend(name, lambda: SqlPersistence(f"sqlite:///{db}"), sqlite_raw(db))
    elif name == "sqlite-aiosqlite":
        b = Backend(name, lambda: SqlPersistence(f"sqlite+aiosqlite:///{db}", inline_sqlite=False), sqlite_raw(db))
    elif name == "sqlite-engine":
        from sqlalchemy.ext.asyncio import create_async_engine

        b = Backend(name, lambda: SqlPersistence(create_async_engine(f"sqlite+aiosqlite:///{db}")), sqlite_raw(db))
    elif name in ("postgres", "postgres-sqlalchemy"):
        if PG_URL is None:
            pytest.skip(PG_SKIP_REASON)
        schema = create_schema()
        # other engine_options than pool_size/max_overflow/connect_args: SQLAlchemy's asyncio engine
        opts = {"pool_pre_ping": True} if name == "postgres-sqlalchemy" else None
        b = Backend(name, lambda: SqlPersistence(PG_URL, schema=schema, engine_options=opts),
                    lambda sql: pg_execute(schema, sql))
    else:
        raise ValueError(f"no backend {name!r}")
    try:
        yield b
    finally:
        for p in b.made:
            asyncio.run(p.close())
        if schema is not None:
            drop_schema(schema)


def user_write(sid: str, body: str) -> tuple[Any, Any]:
    """A user message of session ``sid`` and its one text part ``body``: one commit's write."""
    from we0nb import TextPart, UserMessage
    from we0nb._ids import new_id
    from we0nb.messages import MessageTime, PartTime

    u = UserMessage(id=new_id("msg"), session_id=sid, time=MessageTime(created=3.0))
    return u, TextPart(id=new_id("prt"), session_id=sid, message_id=u.id, text=body,
                       time=PartTime(start=3.0, end=3.0))


async def put(p: Any, message: Any = None, *parts: Any, view: Optional[str] = None) -> None:
    """Write ``message`` (or None) and ``parts`` in one commit of their own (no lease): what a test
    stores directly, through the port's one write path."""
    await p.commit([(message, parts, view)])


@dataclass
class Target:
    """A database a crash test's worker processes open: a URL, and a PostgreSQL schema."""

    url: str
    schema: Optional[str] = None

    def persistence(self) -> Any:
        from we0nb import SqlPersistence

        return SqlPersistence(self.url, schema=self.schema) if self.schema else SqlPersistence(self.url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """A SQLite file, or a PostgreSQL schema of its own (dropped afterwards)."""
    if request.param == "sqlite":
        yield Target(f"sqlite:///{tmp_path / 'crash.db'}")
        return
    if PG_URL is None:
        pytest.skip(PG_SKIP_REASON)
    schema = create_schema()
    try:
        yield Target(PG_URL, schema)
    finally:
        drop_schema(schema)

"""The store conformance suite (``we0nb.persistence.conformance``) on every store of this package.

Each check of the port's contract runs on MemoryPersistence and SqlPersistence on SQLite (inline,
through aiosqlite, through an AsyncEngine passed in) and PostgreSQL (psycopg's own connections,
and SQLAlchemy's asyncio engine chosen by ``engine_options``). A check a store has not the
capability for is skipped with the reason (MemoryPersistence's leases never expire).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from sql_support import ALL_STORES, Backend
from we0nb import MemoryPersistence, SqlPersistence
from we0nb.persistence.base import Lease
from we0nb.persistence.conformance import CHECKS, Check, Harness, validate


STORES = ALL_STORES


def harness(backend: Backend) -> Harness:
    raw = backend.raw

    async def expire(sid: str) -> None:  # what a run on another host that stopped renewing leaves
        assert raw is not None
        await asyncio.to_thread(raw, "UPDATE we0_leases SET expires = 1, host = 'elsewhere.example' "
                                     f"WHERE session_id = '{sid}'")

    return Harness(backend.fresh, expire_lease=expire if raw is not None else None, name=backend.name)


@pytest.mark.parametrize("check", CHECKS, ids=str)
async def test_store_conformance(backend: Backend, check: Check) -> None:
    async with harness(backend) as h:
        if not check.applies(h):
            pytest.skip(check.missing(h))
        await check.run(h)


def test_every_capability_has_checks_and_every_store_of_ours_has_every_capability() -> None:
    needs = {n for c in CHECKS for n in c.needs}
    assert needs == {"sessions", "leases", "batches", "columns", "scores", "copies", "expire"}
    # (copies: SQL only; a fork on MemoryPersistence copies objects, which is as cheap there)
    assert Harness(MemoryPersistence).capabilities == {"sessions", "leases", "batches", "columns", "scores"}
    assert Harness(lambda: SqlPersistence("sqlite://")).capabilities == {
        "sessions", "leases", "batches", "columns", "scores", "copies"}


async def test_validate_reports_every_check_of_a_conforming_store() -> None:
    store = MemoryPersistence()  # (one instance, as a store without instances: the checks use their own ids)
    report = await validate(lambda: store)
    assert report.ok, report
    skipped = [k for k, v in report.results.items() if v.startswith("skipped")]
    assert set(report.results) == {c.name for c in CHECKS}
    assert skipped == [c.name for c in CHECKS if c.needs & {"expire", "copies"}]


class IgnoresTheLease(MemoryPersistence):
    """A broken store: its commits are not conditional on the run's lease."""

    async def commit(self, writes: Any, *, lease: Optional[Lease] = None, session: Any = None) -> None:
        await super().commit(writes, session=session)


class NotAtomic(MemoryPersistence):
    """A broken store: a commit writes its rows one by one, keeping those before a failure."""

    async def commit(self, writes: Any, *, lease: Optional[Lease] = None, session: Any = None) -> None:
        await super().commit([], lease=lease, session=session)
        for w in writes:
            await super().commit([w], lease=lease)


async def test_the_suite_fails_a_store_that_breaks_the_contract() -> None:
    for store, broken in ((IgnoresTheLease(), "a_commit_under_a_lost_lease_raises_and_writes_nothing"),
                          (NotAtomic(), "a_commit_that_fails_writes_nothing")):
        report = await validate(lambda: store)
        assert list(report.failed) == [broken], report

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
    for store, broken in ((IgnoresTheLease(), ["a_commit_under_a_lost_lease_raises_and_writes_nothing"]),
                          (NotAtomic(), ["a_commit_may_write_parts_before_their_message",  # (its parts alone first)
                                         "a_commit_that_fails_writes_nothing"])):
        report = await validate(lambda: store)
        assert list(report.failed) == broken, report


class WritesInTurns(MemoryPersistence):
    """A broken store: each write of a commit lands on its own, with an await between them (an async
    driver without a transaction), so a cancelled commit leaves the first writes."""

    async def commit(self, writes: Any, *, lease: Optional[Lease] = None, session: Any = None) -> None:
        await super().commit([], lease=lease, session=session)
        for w in writes:
            await super().commit([w], lease=lease)
            await asyncio.sleep(0.005)


class InWriteOrder(MemoryPersistence):
    """A broken store: messages and parts come back in the order they were first written, not by id."""

    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, int] = {}

    async def commit(self, writes: Any, *, lease: Optional[Lease] = None, session: Any = None) -> None:
        for m, parts, _ in writes:
            for x in ([m] if m is not None else []) + list(parts):
                self.first.setdefault(x.id, len(self.first))
        await super().commit(writes, lease=lease, session=session)

    async def load_transcript(self, session_id: str) -> Any:
        tr = await super().load_transcript(session_id)
        order = self.first.get
        for m in tr.messages:
            m.parts.sort(key=lambda x: order(x.id, 0))
        tr.messages.sort(key=lambda m: order(m.info.id, 0))
        return tr


class MessageFirst(MemoryPersistence):
    """A store stricter than the port: a part must come after its message, even within one commit."""

    async def commit(self, writes: Any, *, lease: Optional[Lease] = None, session: Any = None) -> None:
        seen: set[str] = set()
        for m, parts, _ in writes:
            if m is not None:
                seen.add(m.id)
            for x in parts:
                if x.message_id not in seen and not (await self.load_transcript(x.session_id)).messages:
                    raise KeyError(f"part {x.id} of unknown message {x.message_id}")
        await super().commit(writes, lease=lease, session=session)


async def test_the_suite_fails_stores_that_reorder_or_write_a_commit_in_parts() -> None:
    for make, broken in ((WritesInTurns, ["a_commit_may_write_parts_before_their_message",
                                          "a_cancelled_commit_writes_all_of_it_or_nothing",
                                          "a_commit_that_fails_writes_nothing"]),
                         (InWriteOrder, ["messages_and_parts_load_in_id_order_whatever_order_they_were_written"]),
                         (MessageFirst, ["a_commit_may_write_parts_before_their_message"])):
        store = make()
        report = await validate(lambda: store)
        assert list(report.failed) == broken, report


class Nothing:
    """Not a store: no capability at all (and no ``close``)."""


class SessionsOnly:
    """A store with sessions and transcripts (a MemoryPersistence's) and no lease capability."""

    keeps_views = False
    commit_waits = False

    def __init__(self) -> None:
        inner = MemoryPersistence()
        for name in ("get_session", "upsert_session", "list_sessions", "commit", "load_transcript", "load_recent",
                     "delete_messages", "flush", "close"):
            setattr(self, name, getattr(inner, name))


async def test_a_store_without_what_every_store_needs_fails_saying_what_it_lacks() -> None:
    report = await validate(Nothing)
    assert not report.ok and report.failed  # (not "OK, everything skipped")
    why = report.failed["sessions_round_trip"]
    assert why.startswith("FAILED: the store lacks sessions (SessionStore: no close, commit, commit_waits,")
    assert "\n" not in why
    assert "every store needs SessionStore (subclass we0nb.Persistence" in why
    store = SessionsOnly()
    report = await validate(lambda: store)
    assert "sessions_round_trip" not in report.failed
    assert "leases (LeaseStore: no acquire_lease, check_lease, lease_and_session, release_lease)" in \
        report.failed["a_lease_is_exclusive_until_released"], report
    assert report.results["an_expired_lease_is_taken_over_and_its_run_writes_nothing_more"] == (  # (a hook: skipped)
        "skipped: the store lacks leases (LeaseStore: no acquire_lease, check_lease, lease_and_session, "
        "release_lease); no expire_lease= hook was given (the checks of an expired lease need it)")


class Duck(SessionsOnly):
    """A store of one's own with every member of a run's two capabilities, not subclassing Persistence."""

    def __init__(self) -> None:
        super().__init__()
        inner = MemoryPersistence()
        for name in ("get_session", "upsert_session", "list_sessions", "commit", "load_transcript", "load_recent",
                     "delete_messages", "flush", "close", "acquire_lease", "release_lease", "check_lease",
                     "lease_and_session"):
            setattr(self, name, getattr(inner, name))


async def test_a_duck_typed_store_is_told_how_to_declare_itself() -> None:
    from we0nb import ScriptedModel, We0Agent, text

    with pytest.raises(TypeError) as info:
        We0Agent(ScriptedModel([[text("hi")]]), persistence=Duck())  # type: ignore[arg-type]
    assert str(info.value) == (
        "We0Agent(persistence=...): expected MemoryPersistence(), SqlPersistence(url) or an instance of a "
        "we0nb.Persistence subclass, got Duck, which has the methods but does not subclass it: declare "
        "`class Duck(..., we0nb.Persistence)` (see docs/stores.md).")
    with pytest.raises(TypeError, match=r"subclass, got int\.$"):
        We0Agent(ScriptedModel([[text("hi")]]), persistence=5)  # type: ignore[arg-type]


def test_the_frames_read_a_store_of_ones_own_through_its_column_reads() -> None:
    """A store with ``ColumnReads`` (not ours) gives the frames its own reader (stores.md's promise),
    ``message_costs`` included by default; the frames are those of the same records read otherwise."""
    from we0nb import (Persistence, ScriptedModel, We0Agent, messages_df, parts_df, sessions_df, text,
                       tool_calls_df, user_message)
    inner = MemoryPersistence()
    opened: list[Any] = []

    class Reads:  # (a reader of one's own, with ColumnReader's methods, not a subclass: the memory store's)
        where = "Own"

        def __init__(self) -> None:
            self.inner = inner.column_reader()

        def sessions(self, *a: Any, **k: Any) -> Any:
            return self.inner.sessions(*a, **k)

        def messages(self, *a: Any, **k: Any) -> Any:
            return self.inner.messages(*a, **k)

        def parts(self, *a: Any, **k: Any) -> Any:
            return self.inner.parts(*a, **k)

        def batches(self) -> Any:
            return self.inner.batches()

        def batch_items(self, name: str) -> Any:
            return self.inner.batch_items(name)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.inner.close()

    class Own(Persistence):
        keeps_views = False
        commit_waits = False

        def column_reader(self) -> Any:
            opened.append(Reads())
            return opened[-1]

    for name in ("get_session", "upsert_session", "list_sessions", "commit", "load_transcript", "load_recent",
                 "delete_messages", "flush", "close", "acquire_lease", "release_lease", "check_lease"):
        setattr(Own, name, (lambda n: lambda self, *a, **k: getattr(inner, n)(*a, **k))(name))
    Own.__abstractmethods__ = frozenset()
    own = Own()
    agent = We0Agent(ScriptedModel([[text("hi")]]), persistence=own)
    asyncio.run(agent.invoke(session_id="ses_own", messages=[user_message("q")]))
    for frame in (sessions_df, messages_df, parts_df, tool_calls_df):
        got, want = frame(own), frame(inner)
        assert got.equals(want) and list(got.columns) == list(want.columns), frame.__name__
    assert len(opened) == 4 and sessions_df(own)["session_id"].tolist() == ["ses_own"]

"""Checks of :class:`~we0nb.persistence.base.LeaseStore`: one run per session, and conditional commits."""

from __future__ import annotations

from ..._ids import new_id
from ...errors import LeaseLostError, SessionBusyError
from .harness import Check, Harness, check, equal, expect, raises
from .history import session, user

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
leases = check(CHECKS, "sessions", "leases")
expiring = check(CHECKS, "sessions", "leases", "expire")


@leases
async def a_lease_is_exclusive_until_released(h: Harness) -> None:
    """A second run (another instance too) is refused with SessionBusyError naming the holder;
    other sessions are free; release is idempotent and frees the session."""
    p, q, sid = h.store, h.fresh(), new_id("ses")
    lease = await p.acquire_lease(sid, "run_a")
    async with raises(SessionBusyError, "a second lease on a held session") as caught:
        await q.acquire_lease(sid, "run_b")
    err = caught[0]
    expect(isinstance(err, SessionBusyError) and err.session_id == sid and "run_a" in str(err),
           f"SessionBusyError names the session and its holder: {err}")
    other = await q.acquire_lease(new_id("ses"), "run_c")
    await lease.release()
    await lease.release()
    again = await q.acquire_lease(sid, "run_b")
    await again.release()
    await other.release()


@leases
async def lease_and_session_reads_the_session_once_held(h: Harness) -> None:
    """The lease, then the session as stored (None when there is none); a busy session is refused
    and its holder keeps it."""
    p, sid = h.store, new_id("ses")
    lease, got = await p.lease_and_session(sid, "run_a")
    equal(got, None, "the session of a new session id")
    await p.upsert_session(session(sid))
    async with raises(SessionBusyError, "lease_and_session on a held session"):
        await h.fresh().lease_and_session(sid, "run_b")
    await p.check_lease(lease)  # still held by its run
    await lease.release()
    lease, got = await h.fresh().lease_and_session(sid, "run_c")
    equal(got, session(sid), "the session read with the lease")
    await lease.release()


@leases
async def a_commit_under_a_lost_lease_raises_and_writes_nothing(h: Harness) -> None:
    """Once another run holds the session, a commit under the old lease writes nothing of itself and
    raises LeaseLostError (a SessionBusyError naming the new holder); every later one is refused."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    lease = await p.acquire_lease(sid, "run_first")
    u, t = user(sid)
    await p.commit([(u, [t], None)], lease=lease)
    await p.release_lease(lease)  # (its run does not know: the lease object still says held)
    other = await h.fresh().acquire_lease(sid, "run_second")
    u2, t2 = user(sid, "late write")
    async with raises(LeaseLostError, "a commit under a lost lease") as caught:
        await p.commit([(None, [t.model_copy(update={"text": "changed"})], None), (u2, [t2], None)], lease=lease)
    err = caught[0]
    expect(isinstance(err, SessionBusyError) and err.session_id == sid and "run_second" in str(err),
           f"LeaseLostError is a SessionBusyError naming the session and its new holder: {err}")
    expect(lease.lost and lease.taken_by == other.owner, f"the lease is marked lost to {other.owner}: {lease}")
    tr = await h.fresh().load_transcript(sid)
    equal(([m.info.id for m in tr.messages], tr.messages[0].parts), ([u.id], [t]), "what the lost commit left")
    async with raises(LeaseLostError, "a later commit under the lost lease"):
        await p.commit([(u2, [t2], None)], lease=lease)
    async with raises(LeaseLostError, "check_lease of the lost lease"):
        await p.check_lease(lease)
    await h.fresh().check_lease(other)
    await other.release()


@leases
async def a_commit_under_a_held_lease_with_nothing_to_write_is_fine(h: Harness) -> None:
    p, sid = h.store, new_id("ses")
    lease = await p.acquire_lease(sid, "run_a")
    await p.commit([], lease=lease)
    await p.commit([], lease=lease, session=session(sid))
    equal(await h.fresh().get_session(sid), session(sid), "the session written under the lease")
    expect(not lease.lost, "the lease is still held")
    await lease.release()


@expiring
async def an_expired_lease_is_taken_over_and_its_run_writes_nothing_more(h: Harness) -> None:
    """A lease its run stopped renewing (another host) is taken over; the old run's commits and
    checks then fail, and its release leaves the new holder's lease alone."""
    p, sid = h.store, new_id("ses")
    await p.upsert_session(session(sid))
    lease = await p.acquire_lease(sid, "run_first")
    u, t = user(sid)
    await p.commit([(u, [t], None)], lease=lease)
    await h.expire_lease(sid)
    q = h.fresh()
    other = await q.acquire_lease(sid, "run_second")
    u2, t2 = user(sid, "late")
    async with raises(LeaseLostError, "a commit after the takeover"):
        await p.commit([(u2, [t2], None)], lease=lease)
    expect(lease.lost and lease.taken_by == other.owner, "the old lease is marked lost to the new holder")
    equal([m.info.id for m in (await q.load_transcript(sid)).messages], [u.id], "what the old run left")
    await lease.release()
    async with raises(SessionBusyError, "a lease after the old run released its lost one"):
        await h.fresh().acquire_lease(sid, "run_third")
    await q.check_lease(other)
    await other.release()


@expiring
async def a_commit_under_the_lease_renews_it(h: Harness) -> None:
    """A run's commit renews its lease: an expired lease committed under is held again (no takeover)."""
    p, sid = h.store, new_id("ses")
    lease = await p.acquire_lease(sid, "run_a")
    await h.expire_lease(sid)
    await p.commit([], lease=lease)
    async with raises(SessionBusyError, "a takeover after the lease was renewed by a commit"):
        await h.fresh().acquire_lease(sid, "run_b")
    expect(not lease.lost, "the renewed lease is held")
    await lease.release()

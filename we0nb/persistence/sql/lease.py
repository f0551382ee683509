"""The session lease (``we0_leases``) across processes and hosts.

Acquiring is an atomic insert-if-absent, or a compare-and-swap on the row that was seen
(so two processes cannot both win); a lease whose owner is on this host with a PID that
is no longer alive is taken over at once, any other only after it expires — by the database
server's clock on PostgreSQL (one clock for every host: a worker whose clock is off neither
takes a live run's lease nor keeps a dead one's; :func:`~.statements.db_now`), by this host's
on SQLite. A heartbeat
renews it every ``lease_renew`` seconds — one task per store and event loop for all the
leases held there (a batch holds a hundred at once) —; when a renewal finds another owner, the
lease is marked lost (:meth:`~we0nb.persistence.base.Lease.mark_lost`). Every conditional
commit renews it too, in its own transaction (:meth:`SqlLeases.guard`, the commit's guard), so a
run that lost its lease writes nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, Optional

from ...errors import PersistenceError, SessionBusyError
from ..base import Lease, LeaseStore, lease_owner
from . import statements as q
from .driver import Driver, Guard, Params, held, write_together
from .errors import is_readonly_error
from .statements import Stmt

__all__ = ["SqlLeases", "pid_alive", "LIVE_OWNERS"]

log = logging.getLogger("we0nb.persistence.sql")

#: owners (host:pid:run) of the leases this process holds right now, whatever the instance
LIVE_OWNERS: set[str] = set()


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive on this host? (A zombie — killed, not yet reaped — is not.)"""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # pragma: no cover - unusual platforms: assume alive, the TTL decides
        return True
    try:
        # procfs is served from kernel memory: this read never waits for a disk
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"Z", b"X"):
            return False
    except (OSError, IndexError):
        pass
    return True


class SqlLeases:
    """The session leases of one store on one database (``we0_leases``), through its driver.

    ``store`` is what each :class:`~we0nb.persistence.base.Lease` is given back to (its
    ``release_lease``); ``ttl`` and ``renew_every`` are the store's ``lease_ttl`` and ``lease_renew``.
    """

    def __init__(self, store: LeaseStore, db: Driver, ttl: float, renew_every: float) -> None:
        self.store, self.db = store, db
        self.ttl, self.renew_every = ttl, renew_every
        self.host = socket.gethostname()[:128]
        self.heartbeats: dict[asyncio.AbstractEventLoop, _Heartbeat] = {}  # loop → its leases' heartbeat

    def guard(self, lease: Lease) -> Guard:
        """The statement that keeps ``lease`` (renewing it once due, see
        :func:`~.statements._guard_expiry`) — and changes no row once another run holds it: the
        guard of the run's commits (:func:`~.driver.held`)."""
        return (q.LEASE_GUARD, self._renewal(lease))

    def _renewal(self, lease: Lease) -> Params:
        return {"sid": lease.session_id, "holder": lease.owner, "expires": time.time() + self.ttl,
                "ttl": self.ttl, "fresh": self.renew_every}

    async def holder(self, session_id: str) -> Optional[str]:
        """Who holds the session's lease now (None: nobody)."""
        rows = await self.db.fetchall(q.LEASE_GET, {"sid": session_id, "now": time.time()})
        return rows[0][0] if rows else None

    async def check(self, lease: Lease) -> None:
        lease.check()
        now = await self.holder(lease.session_id)
        if now != lease.owner:
            raise lease.mark_lost(now)

    def held_here(self) -> int:
        """How many leases are held for runs on the running event loop."""
        hb = self.heartbeats.get(asyncio.get_running_loop())
        return len(hb.leases) if hb is not None else 0

    def _new_row(self, session_id: str, run_id: str, owner: str) -> Params:
        return {"session_id": session_id, "owner": owner, "host": self.host, "pid": os.getpid(),
                "run_id": run_id[:64], "expires": time.time() + self.ttl, "ttl": self.ttl}

    async def acquire_and_read(self, session_id: str, run_id: str, read: tuple[Stmt, Params]) -> tuple[Lease, list[Any]]:
        """The lease, and the rows of ``read`` as the lease's holder sees them.

        The lease's insert and the read are sent together, the read second (on PostgreSQL one
        round trip; on SQLite one transaction): an insert that wins means nobody held the
        session, so the read is current. An insert that does not win (a busy session, a lease
        to take over) takes the usual path, and the read is made again once the lease is held.
        """
        owner = lease_owner(run_id)[:256]
        inserted = False  # (whether the insert may have been written: then a failure deletes it)
        try:
            if self.db.dialect == "sqlite":  # the insert with the pass's other writes, then the read
                won = await write_together(self.db, q.LEASE_INSERT, self._new_row(session_id, run_id, owner))
                inserted, rows = bool(won), []  # (a failed transaction wrote nothing)
                if won:
                    rows = await self.db.fetchall(*read)
            else:
                inserted = True  # (an answer lost on the way back: the insert may have committed)
                won, rows = await self.db.run([(q.LEASE_INSERT, self._new_row(session_id, run_id, owner), False),
                                               (read[0], read[1], True)])
        except BaseException as e:
            if inserted and not (isinstance(e, PersistenceError) and is_readonly_error(e)):  # (read-only: nothing written)
                await self._drop(session_id, owner, e)  # (the insert may have won before the read failed)
            raise
        if won == 1:
            return self._held(session_id, run_id, owner), rows
        lease = await self.acquire(session_id, run_id)
        return lease, await self.db.fetchall(*read)

    async def _drop(self, session_id: str, owner: str, cause: BaseException) -> None:
        """Delete ``owner``'s lease row if there is one, keeping the error under way (the lease
        then expires by itself, and this process's own runs take it over at once)."""
        try:
            # (with the pass's writes, as the insert: after it, when it is still queued)
            await asyncio.shield(write_together(self.db, q.LEASE_RELEASE, {"sid": session_id, "holder": owner}))
        except BaseException as e:  # (on purpose: the caller raises its own error)
            # the same failure again (a database that cannot be reached) says nothing new: the caller's says it
            same = type(e) is type(cause) and str(e) == str(cause)
            (log.debug if same else log.warning)("could not delete the lease row of session %r: %s: %s",
                                                 session_id, type(e).__name__, e)

    async def acquire(self, session_id: str, run_id: str) -> Lease:
        """Take the lease or raise :class:`~we0nb.SessionBusyError`; starts its heartbeat."""
        owner = lease_owner(run_id)[:256]  # the column widths (PostgreSQL enforces them)
        for _ in range(5):
            new = self._new_row(session_id, run_id, owner)
            if await self.db.execute(q.LEASE_INSERT, new) == 1:
                break
            rows = await self.db.fetchall(q.LEASE_GET, {"sid": session_id, "now": time.time()})
            if not rows:
                continue  # released in between: try the insert again
            old_owner, old_host, old_pid, old_expires, db_now = rows[0]  # (db_now: the clock expiry is judged by)
            dead = _owner_gone(old_owner, old_host, int(old_pid), self.host)
            if not dead and old_expires >= db_now:
                raise SessionBusyError(session_id, old_owner)
            take = dict(new, sid=session_id, old_owner=old_owner, old_expires=old_expires)
            if held(await self.db.execute(q.LEASE_TAKE, take)):
                log.info("took over the lease of session %r from %s (%s)", session_id, old_owner,
                         "its process is gone" if dead else "it expired")
                break
            # someone else changed the row first: look again
        else:
            raise SessionBusyError(session_id, None)
        return self._held(session_id, run_id, owner)

    def _held(self, session_id: str, run_id: str, owner: str) -> Lease:
        """The lease just taken: known live in this process, renewed by the loop's heartbeat."""
        lease = Lease(session_id=session_id, run_id=run_id, owner=owner, persistence=self.store)
        LIVE_OWNERS.add(owner)
        _Heartbeat.of(self).leases[(session_id, owner)] = lease
        return lease

    async def renew(self, lease: Lease, held_now: dict[tuple[str, str], Lease]) -> bool:
        """Renew one lease (in full, whatever its commits' guards did); False when another run
        holds it now (the lease is then marked lost)."""
        try:
            n = await self.db.execute(q.LEASE_RENEW, self._renewal(lease))
            if n == 0:
                taken_by = await self.holder(lease.session_id)
        except PersistenceError as e:  # a busy or unreachable database: try again at the next tick
            log.warning("could not renew the lease of session %r: %s", lease.session_id, e)
            return True
        if n != 0:
            return True
        if held_now.get((lease.session_id, lease.owner)) is not lease:
            return False  # released while its renewal was on the way: nothing was lost
        lease.mark_lost(taken_by)
        log.warning("the lease of session %r (%s) was taken over by %s", lease.session_id, lease.owner,
                    taken_by or "another run, which has released it since (no one holds it now)")
        return False

    async def release(self, lease: Lease) -> None:
        LIVE_OWNERS.discard(lease.owner)
        key = (lease.session_id, lease.owner)
        for loop, hb in list(self.heartbeats.items()):
            if hb.leases.pop(key, None) is not None and not hb.leases:  # the loop's last lease
                del self.heartbeats[loop]
                if not hb.task.done():
                    try:
                        hb.task.cancel()
                    except RuntimeError:  # its event loop is closed: the task is gone with it
                        pass
        await write_together(self.db, q.LEASE_RELEASE, {"sid": lease.session_id, "holder": lease.owner})


def _owner_gone(old_owner: str, old_host: str, old_pid: int, host: str) -> bool:
    if old_host != host:
        return False  # another machine: only the TTL can tell
    if old_pid == os.getpid():
        # this PID: a live run of this process, or a crashed process whose PID we reuse
        # (common in containers after a restart)
        return old_owner not in LIVE_OWNERS
    return not pid_alive(old_pid)


class _Heartbeat:
    """The renewal of every lease a store holds on one event loop, in one task: started with
    the loop's first lease, stopped with its last (:attr:`SqlLeases.heartbeats`: loop → heartbeat)."""

    __slots__ = ("leases", "task")

    def __init__(self, owner: SqlLeases) -> None:
        self.leases: dict[tuple[str, str], Lease] = {}  # (session id, owner) → lease
        self.task = asyncio.ensure_future(self._run(owner))

    @staticmethod
    def of(owner: SqlLeases) -> "_Heartbeat":
        loop = asyncio.get_running_loop()
        beats = owner.heartbeats
        hb = beats.get(loop)
        if hb is None or hb.task.done():
            for gone in [lp for lp in beats if lp.is_closed()]:  # left by a loop closed mid-run
                del beats[gone]
            old, hb = hb, _Heartbeat(owner)
            if old is not None:
                hb.leases.update(old.leases)
            beats[loop] = hb
        return hb

    async def _run(self, owner: SqlLeases) -> None:
        while self.leases:
            await asyncio.sleep(owner.renew_every)
            held_now = list(self.leases.items())
            # all at once: on PostgreSQL they go to the server together (one round trip, not one each)
            renewed = await asyncio.gather(*(owner.renew(lease, self.leases) for _, lease in held_now))
            for (key, lease), ok in zip(held_now, renewed):
                if not ok and self.leases.get(key) is lease:
                    self.leases.pop(key, None)
        loop = asyncio.get_running_loop()
        if owner.heartbeats.get(loop) is self:  # every lease here was lost
            del owner.heartbeats[loop]

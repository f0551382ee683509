"""Group commit on SQLite: the commits many runs make in one pass of the event loop, in one transaction.

Why: a batch keeps ~100 runs going on one event loop, each committing two or three times
per model step. A SQLite COMMIT in WAL mode appends every page the transaction changed to
the WAL, two ``write()`` calls per page: ~8 pages and ~90 µs a commit, most of a batch's
SQLite time (W7 of ``shared/BENCH.md``). Runs that commit together share pages (the newest
rows of a table sit on the same leaf), so a group writes a fraction of them, and takes the
write lock and commits once.

How: :meth:`SqliteGroup.commit` queues the commit and waits; the queue is written by a
callback of the loop's next pass — or, while the loop has other callbacks ready (runs whose
next commits would make groups of their own one pass later), by one at the end of the pass
after, up to :attr:`~SqliteGroup.MAX_PASSES` passes or :attr:`~SqliteGroup.MAX_WAIT` after the
first (on a loop that does not expose its ready queue, as asyncio's own does: the next pass) —
in one ``BEGIN IMMEDIATE … COMMIT``: for each commit its guard
(the lease renewal) and, when that changed its row, its rows — as one ``executemany`` per
statement for the whole group when its rows allow it (:func:`~.inline._mergeable`). A commit
whose guard changed nothing writes nothing (its lease was lost), exactly as alone. Only runs
that are not alone wait for a pass, and a group for the work ready beside it (W12 of
``shared/BENCH.md``, 2,000 verdicts: a transaction per 2.2–2.5 verdicts before that wait, per
7.4–7.7 with it; 44 KB of WAL per verdict → 24 KB, 28–31 checkpoints → 13–16, 0.62–0.65 ms of
CPU per verdict → 0.56–0.57). :meth:`~.inline.InlineSqlite.commit` sends a commit here when it
is *crowded* (other runs of this loop hold leases on the store), else writes it at once.

A group that fails on an error writes nothing, and each of its commits is then tried alone,
so the error reaches only the commit that caused it; a group that finds the database locked
waits (the async back-off) as one, and when the lock outlasts ``busy_timeout`` each of its
commits fails with that error (alone, each would wait as long again). A commit once queued is
written even if its caller is cancelled meanwhile (the run's writer keeps those rows and sends
them again: upserts, so twice is harmless; dropped, they could be lost). Queues are per event
loop; a queue left by a loop that closed before its pass is written with the next group.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .driver import Guard, Op
from .errors import Busy, is_busy

if TYPE_CHECKING:
    from .inline import InlineSqlite

__all__ = ["SqliteGroup"]


class _Commit:
    __slots__ = ("ops", "guard", "done")

    def __init__(self, ops: Sequence[Op], guard: Optional[Guard], done: "asyncio.Future[bool]"):
        self.ops, self.guard, self.done = ops, guard, done


class SqliteGroup:
    """The queued commits of each event loop, for one :class:`~.inline.InlineSqlite`."""

    #: a group is written once the loop has no other callback ready, or after this many passes
    #: of the loop, or this long after its first pass, whichever comes first
    MAX_PASSES = 16
    MAX_WAIT = 0.002

    def __init__(self, db: "InlineSqlite"):
        self.db = db
        self.queues: dict[asyncio.AbstractEventLoop, list[_Commit]] = {}

    async def commit(self, ops: Sequence[Op], guard: Optional[Guard]) -> bool:
        """``ops`` after ``guard`` (as :meth:`InlineSqlite.transaction`), with the others of this pass."""
        loop = asyncio.get_running_loop()
        entry = _Commit(ops, guard, loop.create_future())
        queue = self.queues.get(loop)
        if queue is None:
            queue = self.queues[loop] = []
            loop.call_soon(self._write, loop)
        queue.append(entry)
        # one pass, not two: the pass's commits are written by the callback queued above, which
        # runs before this task's own turn in the next pass — awaiting the future alone would
        # resume the run only in the pass after that (a future wakes its waiter with call_soon)
        await asyncio.sleep(0)
        return await entry.done

    def _write(self, loop: asyncio.AbstractEventLoop, passes: int = 0, since: float = 0.0) -> None:
        ready = getattr(loop, "_ready", None)  # (asyncio's queue of ready callbacks; another loop: none)
        if ready and passes < self.MAX_PASSES:  # (work is ready that may commit too: it joins this group)
            t = time.monotonic()
            if not passes or t - since < self.MAX_WAIT:
                loop.call_soon(self._write, loop, passes + 1, since or t)
                return
        group = self.queues.pop(loop, [])
        for gone in [lp for lp in self.queues if lp.is_closed()]:
            group.extend(self.queues.pop(gone))
        if not group:
            return
        pairs = [(c.ops, c.guard) for c in group]
        try:
            results = self.db.together_now(pairs)
        except Busy:  # another process writes: wait for it without blocking this pass
            asyncio.ensure_future(self._later(group))
            return
        except Exception:  # on purpose: nothing was written; each commit alone gets its own outcome
            asyncio.ensure_future(self._alone(group))
            return
        _settle(group, results)

    async def _later(self, group: list[_Commit]) -> None:
        try:
            results = await self.db.together([(c.ops, c.guard) for c in group])
        except Exception as exc:  # on purpose: as in _write
            if is_busy(exc.__cause__ or exc):  # locked past busy_timeout: alone, each would wait as long again
                for c in group:
                    _set(c.done, exc=exc)
                return
            await self._alone(group)
            return
        _settle(group, results)

    async def _alone(self, group: list[_Commit]) -> None:
        for c in group:
            try:
                result = await self.db.transaction(c.ops, c.guard)
            except Exception as exc:
                _set(c.done, exc=exc)
            else:
                _set(c.done, result)


def _settle(group: list[_Commit], results: list[bool]) -> None:
    for c, result in zip(group, results):
        _set(c.done, result)


def _set(done: "asyncio.Future[bool]", result: Any = None, exc: Optional[BaseException] = None) -> None:
    """Resolve a caller's future unless it left (cancelled) or its loop is gone."""
    if done.done() or done.get_loop().is_closed():
        return
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(result)

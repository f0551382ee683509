"""The run's only path to the store: every durability point is one conditional commit.

The writer owns the three things that decide *when* something becomes durable:

* **coalescing** — streamed text goes into the open part's buffer and is written every
  ``flush_interval`` seconds (a timer raises :attr:`Writer.flush_due`: the delta path reads
  one attribute, never the clock), at part end, at abort and at step end (never per delta);
  parts that are not a durability point of their own (a pending tool call) wait in
  ``dirty`` for the next commit;
* **the write-ahead** — :meth:`Writer.write_ahead` commits a call's ``running`` state before
  its tool executes; the one exception is decided here too: in a pipelined run a read-only
  call's (recovery runs it again whether it finds it pending or running) is sent while it runs;
* **held writes** — a write that nothing depends on before the next commit is held and
  committed with whatever comes next (:meth:`hold`): a finished step's end (with the text
  part the stream's end closed) goes with the next step's start or the run's end
  (:meth:`commit_held`); a prompt's user message goes with its first step's start. Nothing
  is run or yielded between the hold and that commit, so a crash sees the same states as
  with a commit of its own, one fewer. Their events wait for it;
* **commits under way** — a pipelined run (a batch item, on a store whose commits wait:
  :attr:`~we0nb.persistence.base.Persistence.commit_waits`) sends a step's start while its
  model call goes out, and a read-only call's ``running`` state while the call runs
  (:meth:`write_soon`). Their rows are taken when they are sent and they land one after
  the other, in order; every awaited write, and the step's use of the model's reply, waits
  for them first (:meth:`settle`). One that fails stops the ones after it: their writes go
  again, first and in order, with the next commit, and the error is raised at the next wait.

Every commit carries the run's lease: a run that lost its session to another one raises
:class:`~we0nb.LeaseLostError` at its next write and writes nothing more. A commit that
fails or is cancelled (a slow database, a locked SQLite file, a cancelled task) is not
forgotten: its writes go again, first, with the next commit — the one that records the
abort or the failure.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence, Union

from .._ids import now
from ..messages import MessageWithParts, Part, PartTime, ReasoningPart, Session, TextPart
from ..models.view import dump_view
from ..persistence.base import Lease, MessageInfo, Persistence, Write
from .events import Event
from .history import convert

__all__ = ["Writer"]

OpenPart = Union[TextPart, ReasoningPart]


class Writer:
    """Writes of one run (which holds the session lease: it is the session's only writer)."""

    def __init__(self, persistence: Persistence, lease: Optional[Lease], flush_interval: float, *,
                 pipelined: bool = False) -> None:
        self.p = persistence
        self.lease = lease
        self.interval = flush_interval
        self.pipelined = pipelined
        self.keeps_views = persistence.keeps_views
        self.dirty: dict[str, Part] = {}
        self.open: Optional[OpenPart] = None
        #: the open part's text since it was last written (one list for the writer's life: the
        #: delta path keeps a reference to it)
        self.chunks: list[str] = []
        #: the open part is due to be written (raised by a timer every ``flush_interval``)
        self.flush_due = flush_interval <= 0
        self._timer: Optional[asyncio.TimerHandle] = None
        #: held writes ``(message, parts, final)`` and their events, for the next commit
        self._held: list[tuple[Optional[MessageInfo], tuple[Part, ...], Optional[MessageWithParts]]] = []
        self._held_events: list[Event] = []
        #: the writes of a commit that failed or was cancelled: they go first with the next one
        self._unsent: list[Write] = []
        #: the session's row, held for the next commit (a new session; the run's end time)
        self._session: Optional[Session] = None
        #: commits :meth:`write_soon` made that have not landed yet (the first is being sent)
        self._soon: list[tuple[list[Write], Optional[Session]]] = []
        #: the task sending ``_soon``, until it has been waited for (:meth:`settle`)
        self._pending: Optional["asyncio.Future[None]"] = None
        #: a message or part has been collected for a commit (what :meth:`writes_anything` reads)
        self._wrote = False

    # ------------------------------------------------------------------ commits

    def view_of(self, m: MessageWithParts) -> Optional[str]:
        """A final message's model view, for a store that keeps them (else None: not made)."""
        return dump_view(convert(m)) if self.keeps_views else None

    def mark(self, part: Part) -> None:
        """``part`` changed but is not a durability point: it goes with the next commit."""
        self.dirty[part.id] = part

    async def write(self, message: Optional[MessageInfo], *parts: Part,
                    final: Optional[MessageWithParts] = None, then: Sequence[Write] = ()) -> None:
        """One commit: what a failed commit left and the held writes first, then ``message`` with
        ``parts`` and every dirty part (after the commits still under way: :meth:`settle`).

        ``final``: the message is final with this write; its model view goes with it.
        ``then``: more ``(message, parts, view)`` writes in the same transaction.
        """
        if self._pending is not None:
            try:
                await self.settle()
            except (Exception, asyncio.CancelledError):
                self._keep([self._collect(message, parts, final, then)])  # (after the ones under way)
                raise
        writes, session = self._collect(message, parts, final, then)
        if writes or session is not None:
            try:
                await self.p.commit(writes, lease=self.lease, session=session)  # (:meth:`_commit`, inline)
            except (Exception, asyncio.CancelledError):
                # (an interrupt or exit inside the store is the process going down: no retry)
                self._keep([(writes, session)])
                raise

    async def write_ahead(self, part: Part, *, wait: bool) -> None:
        """A call's ``running`` state, before its tool executes. ``wait=False`` (a read-only
        call: recovery runs it again whether it finds it pending or running) lets a pipelined
        run send it while the call runs; otherwise it is durable when this returns."""
        if wait or not self.pipelined:
            await self.write(None, part)
        else:
            self.write_soon(None, part)

    def write_soon(self, message: Optional[MessageInfo], *parts: Part) -> None:
        """:meth:`write`'s commit, sent without waiting for it: its rows are taken now, it lands
        after the commits already under way, and the next :meth:`write` or :meth:`settle` waits
        for it (and raises its error). Only where nothing depends on it until then."""
        entry = self._collect(message, parts, None, ())
        pending = self._pending
        if pending is not None and pending.done() and (pending.cancelled() or pending.exception() is not None):
            self._keep([entry])  # (an earlier one failed: nothing more is sent before the error is seen)
            return
        self._soon.append(entry)
        if pending is None or pending.done():
            self._pending = asyncio.ensure_future(self._send_soon())

    async def settle(self) -> None:
        """Wait for the commits :meth:`write_soon` started (never cancelling them: a cancelled
        wait leaves them to the next write); the first error is raised here, once."""
        pending = self._pending
        if pending is None:
            return
        try:
            await asyncio.shield(pending)
        finally:
            if pending.done():
                self._pending = None
                if not pending.cancelled():
                    pending.exception()  # (seen: raised above, or by the wait that was cancelled)

    async def _send_soon(self) -> None:
        soon = self._soon
        try:
            while soon:
                writes, session = soon[0]
                await self._commit(writes, session)
                soon.pop(0)
        except (Exception, asyncio.CancelledError):
            rest, soon[:] = list(soon), []
            self._keep(rest)  # (the one that failed and every one after it, in order)
            raise

    def _collect(self, message: Optional[MessageInfo], parts: Sequence[Part], final: Optional[MessageWithParts],
                 then: Sequence[Write]) -> tuple[list[Write], Optional[Session]]:
        """A commit's writes, in order: what failed before, the held writes, ``message`` with the
        dirty parts and ``parts``, ``then``; and the session's row when one is held."""
        dirty = self.dirty
        if dirty:
            for part in parts:
                dirty.pop(part.id, None)
            parts = (*dirty.values(), *parts)
            dirty.clear()
        writes, self._unsent = self._unsent, []
        if self._held:
            view_of = self.view_of
            writes.extend((m, ps, view_of(f) if f is not None else None) for m, ps, f in self._held)
            self._held = []
        if message is not None or parts:
            writes.append((message, parts, self.view_of(final) if final is not None else None))
        writes.extend(then)
        if writes:
            self._wrote = True
        session, self._session = self._session, None
        return writes, session

    def _keep(self, entries: Sequence[tuple[list[Write], Optional[Session]]]) -> None:
        """Commits that did not land: their writes go first, in order, with the next commit (live
        objects: written as they are by then) — unless the run lost its lease. Kept writes were
        made before any already kept (a write collects only once the commits under way are done
        or it has kept itself: a wait cancelled while they go on), so they go in front."""
        if self.lost:
            return
        kept = [w for writes, _ in entries for w in writes]
        self._unsent = kept + self._unsent
        if self._session is None:
            self._session = next((s for _, s in reversed(entries) if s is not None), None)

    async def _commit(self, writes: list[Write], session: Optional[Session]) -> None:
        await self.p.commit(writes, lease=self.lease, session=session)

    def writes_anything(self) -> bool:
        """Whether the run has written a message or a part, or holds one for its next commit
        (the session's row aside): a run that writes nothing leaves the session as it was."""
        return self._wrote or bool(self._held) or bool(self.dirty)

    def hold_session(self, session: Session) -> None:
        """Write the session's row with the next commit (the run holds its lease: no other writer)."""
        self._session = session

    def hold(self, message: Optional[MessageInfo], parts: Sequence[Part], final: Optional[MessageWithParts],
             events: Sequence[Event] = ()) -> None:
        """Hold a write (with every dirty part) for the next commit; ``events`` wait for it.

        Only for a write that nothing is run or yielded before: the next commit follows at once
        (a step's start, a write-ahead, the run's end, or the abort's or failure's own write).
        """
        self._held.append((message, (*self.dirty.values(), *parts), final))
        self.dirty.clear()
        self._held_events.extend(events)

    def hold_message(self, message: MessageInfo) -> None:
        """Write ``message``'s row (alone: its parts go as they are due) with the next commit."""
        self._held.append((message, (), None))

    def take_held_events(self) -> list[Event]:
        """The events of held writes that are now committed (yield them in order)."""
        events, self._held_events = self._held_events, []
        return events

    async def commit_held(self) -> list[Event]:
        """Commit the held writes now (the run goes no further); their events."""
        if self._held or self._session is not None:
            await self.write(None)
        return self.take_held_events()

    # ------------------------------------------------------------------ streamed text

    def open_part(self, part: OpenPart) -> None:
        """A text or reasoning part starts streaming: it is due to be written ``flush_interval``
        from now (and every ``flush_interval`` after each write)."""
        self.open = part
        self.chunks.clear()
        if self.interval > 0:
            self.flush_due = False
            self._arm()

    def stop_flush_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._due)

    def _due(self) -> None:
        self._timer = None
        self.flush_due = True

    def materialize(self) -> None:
        """Move the buffered deltas into the open part's text."""
        part = self.open
        if part is not None and self.chunks:
            part.text = part.text + "".join(self.chunks)
            self.chunks.clear()

    def close_open(self, tail: str = "") -> Optional[OpenPart]:
        """End the open text/reasoning part (``tail``: its last text), without writing it."""
        part = self.open
        if part is None:
            return None
        if tail:
            self.chunks.append(tail)
        self.materialize()
        part.time = PartTime(start=part.time.start if part.time else now(), end=now())
        self.open = None
        return part

    async def flush_open(self, close: bool, tail: str = "") -> Optional[OpenPart]:
        """Write the open text/reasoning part; with ``close`` also end it (``tail``: its last text)."""
        part = self.close_open(tail) if close else self.open
        if part is None:
            return None
        self.materialize()
        await self.write(None, part)
        if self.interval > 0:
            self.flush_due = False
            self._arm()
        return part

    def keep_open(self) -> None:
        """An interrupted step: the open part's text so far goes with the next commit, unclosed."""
        self.materialize()
        if self.open is not None:
            self.dirty[self.open.id] = self.open
            self.open = None

    async def persist_interrupted(self) -> None:
        """On abort or cancel: write what was produced (a held step end too), close nothing."""
        self.keep_open()
        await self.write(None)
        await self.p.flush()

    @property
    def lost(self) -> bool:
        """The run lost its lease: nothing more may be written."""
        return self.lease is not None and self.lease.lost


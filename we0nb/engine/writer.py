"""The run's only path to the store: every durability point is one conditional commit.

The writer owns the three things that decide *when* something becomes durable:

* **coalescing** — streamed text goes into the open part's buffer and is written every
  ``flush_interval`` seconds, at part end, at abort and at step end (never per delta);
  parts that are not a durability point of their own (a pending tool call) wait in
  ``dirty`` for the next commit;
* **the write-ahead** — :meth:`Writer.write` commits at once; the executor calls it with a
  call's ``running`` state before the tool executes;
* **the merged step end** — a finished step's end is held (:meth:`defer_end`) and committed
  with whatever comes next (the next step's start, or :meth:`commit_end` at the run's end):
  nothing is run or yielded before that commit, so a crash sees the same states as with a
  commit of its own, one fewer. Its events wait for it.

Every commit carries the run's lease: a run that lost its session to another one raises
:class:`~we0nb.LeaseLostError` at its next write and writes nothing more. A commit that
fails or is cancelled (a slow database, a locked SQLite file, a cancelled task) is not forgotten: its writes
go again, first, with the next commit — the one that records the abort or the failure.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Sequence, Union

from .._ids import now
from ..messages import AssistantMessage, MessageWithParts, Part, PartTime, ReasoningPart, TextPart
from ..models.view import dump_view
from ..persistence.base import Batch, Lease, MessageInfo, Persistence
from .history import convert

__all__ = ["Writer"]

OpenPart = Union[TextPart, ReasoningPart]


class Writer:
    """Writes of one run (which holds the session lease: it is the session's only writer)."""

    def __init__(self, persistence: Persistence, lease: Optional[Lease], flush_interval: float) -> None:
        self.p = persistence
        self.lease = lease
        self.interval = flush_interval
        self.keeps_views = persistence.keeps_views
        self.dirty: dict[str, Part] = {}
        self.open: Optional[OpenPart] = None
        self.chunks: list[str] = []
        self.last_flush = 0.0
        self._end: Optional[tuple[AssistantMessage, tuple[Part, ...], MessageWithParts]] = None
        self._end_events: list[dict[str, Any]] = []
        #: the writes of a commit that failed or was cancelled: they go first with the next one
        self._unsent: list[Batch] = []

    # ------------------------------------------------------------------ commits

    def view_of(self, m: MessageWithParts) -> Optional[str]:
        """A final message's model view, for a store that keeps them (else None: not made)."""
        return dump_view(convert(m)) if self.keeps_views else None

    def mark(self, part: Part) -> None:
        """``part`` changed but is not a durability point: it goes with the next commit."""
        self.dirty[part.id] = part

    async def write(self, message: Optional[MessageInfo], *parts: Part,
                    final: Optional[MessageWithParts] = None, then: Sequence[Batch] = ()) -> None:
        """One commit: a held step end first, then ``message`` with ``parts`` and every dirty part.

        ``final``: the message is final with this write; its model view goes with it.
        ``then``: more ``(message, parts, view)`` writes in the same transaction.
        """
        dirty = self.dirty
        if dirty:
            for part in parts:
                dirty.pop(part.id, None)
            parts = (*dirty.values(), *parts)
            dirty.clear()
        writes, self._unsent = self._unsent, []
        end = self._end
        if end is not None:
            self._end = None
            writes.append((end[0], end[1], self.view_of(end[2])))
        if message is not None or parts:
            writes.append((message, parts, self.view_of(final) if final is not None else None))
        writes.extend(then)
        if writes:
            try:
                await self.p.commit(writes, lease=self.lease)
            except (Exception, asyncio.CancelledError):
                # (an interrupt or exit inside the store is the process going down: no retry)
                if not self.lost:  # (live objects: the retry writes them as they are by then)
                    self._unsent = writes
                raise

    def defer_end(self, info: AssistantMessage, parts: Sequence[Part], msg: MessageWithParts,
                  events: list[dict[str, Any]]) -> None:
        """Hold a finished step's end (with every dirty part) for the next commit."""
        self._end = (info, (*self.dirty.values(), *parts), msg)
        self.dirty.clear()
        self._end_events = events

    @property
    def holds_end(self) -> bool:
        return self._end is not None

    def take_end_events(self) -> list[dict[str, Any]]:
        """The events of a step end that is now committed (yield them in order)."""
        events, self._end_events = self._end_events, []
        return events

    async def commit_end(self) -> list[dict[str, Any]]:
        """Commit a held step end now (the run goes no further); its events."""
        if self._end is not None:
            await self.write(None)
        return self.take_end_events()

    # ------------------------------------------------------------------ streamed text

    def open_part(self, part: OpenPart) -> None:
        self.open = part
        self.chunks = []

    def materialize(self) -> None:
        """Move the buffered deltas into the open part's text."""
        part = self.open
        if part is not None and self.chunks:
            part.text = part.text + "".join(self.chunks)
            self.chunks = []

    async def flush_open(self, close: bool, tail: str = "") -> Optional[OpenPart]:
        """Write the open text/reasoning part; with ``close`` also end it (``tail``: its last text)."""
        part = self.open
        if part is None:
            return None
        if tail:
            self.chunks.append(tail)
        self.materialize()
        if close:
            part.time = PartTime(start=part.time.start if part.time else now(), end=now())
            self.open = None
        await self.write(None, part)
        self.last_flush = time.monotonic()
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

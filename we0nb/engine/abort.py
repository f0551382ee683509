"""Abort for one run: cheap checks between phases, an immediate cancel while blocked.

Abort costs nothing per delta beyond a flag test: a watcher waits on the run's
``asyncio.Event`` and, when it fires, cancels the run's task only if the run is *blocked*
— awaiting the model's next event or a tool (:meth:`AbortScope.next`,
:meth:`AbortScope.wait`). Between those points the engine calls :meth:`AbortScope.check`.
Writes are never cancelled this way: a commit in progress completes.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Optional, TypeVar

__all__ = ["Aborted", "AbortScope"]

T = TypeVar("T")


class Aborted(Exception):
    """Internal: the abort event was seen at a check point."""


class AbortScope:
    """The abort plumbing of one run (start it in the run's task, close it at the end)."""

    __slots__ = ("event", "_task", "_blocked", "_watcher", "cancelled_by_abort")

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event
        self._task: Optional[asyncio.Task[Any]] = None
        self._blocked: Optional[asyncio.Task[Any]] = None
        self._watcher: Optional[asyncio.Future[Any]] = None
        self.cancelled_by_abort = False

    def start(self) -> None:
        self._task = asyncio.current_task()
        self._watcher = asyncio.ensure_future(self.event.wait())
        self._watcher.add_done_callback(self._on_abort)

    def close(self) -> None:
        watcher = self._watcher
        if watcher is not None:
            watcher.remove_done_callback(self._on_abort)
            if not watcher.done():
                watcher.cancel()
            self._watcher = None

    def _on_abort(self, fut: "asyncio.Future[Any]") -> None:
        if fut.cancelled():
            return
        task = self._blocked
        if task is not None and not task.done():
            self.cancelled_by_abort = True
            task.cancel()

    @property
    def is_set(self) -> bool:
        return self.event.is_set()

    def check(self) -> None:
        """Raise :class:`Aborted` if the abort event is set."""
        if self.event.is_set():
            raise Aborted

    def uncancel(self) -> None:
        """After our own cancel was caught: take it back, so the task can finish its cleanup."""
        task = self._task
        if self.cancelled_by_abort and task is not None and hasattr(task, "uncancel"):
            task.uncancel()

    async def next(self, it: AsyncIterator[T]) -> T:
        """The stream's next item; an abort cancels the read at once (raises StopAsyncIteration at the end)."""
        if self.event.is_set():
            raise Aborted
        self._blocked = self._task
        try:
            return await it.__anext__()
        finally:
            self._blocked = None

    async def wait(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` (a tool) so that an abort cancels it at once."""
        self._blocked = self._task
        try:
            return await aw
        finally:
            self._blocked = None

    def cancelled_by_us(self) -> bool:
        """Whether a CancelledError now in flight came from this scope's abort (not a tool's own)."""
        return self.cancelled_by_abort or self.event.is_set()

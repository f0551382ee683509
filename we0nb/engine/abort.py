"""Abort for one run: cheap checks between phases, an immediate cancel while blocked.

Abort costs nothing per delta beyond a flag test: a watcher waits on the run's
``asyncio.Event`` and, when it fires, cancels the run's task only if the run is *blocked*
— awaiting the model's next event or a tool (:attr:`AbortScope.blocked`, set by
:meth:`AbortScope.next`, :meth:`AbortScope.wait` and the run's delta path). Between those points the engine calls :meth:`AbortScope.check`.
Writes are never cancelled this way: a commit in progress completes. Runs that share one
event (a batch's items) share one watcher: a task per event, not per run.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, AsyncIterator, Awaitable, Optional, TypeVar

__all__ = ["Aborted", "AbortScope", "SetFlag", "set_flag"]

T = TypeVar("T")


class Aborted(Exception):
    """Internal: the abort event was seen at a check point."""


class SetFlag:
    """What the delta path reads to know whether an event is set: ``flag._value``.

    For an :class:`asyncio.Event` whose class keeps asyncio's ``is_set`` (every event in
    practice), :func:`set_flag` gives the event itself: ``is_set()`` returns that attribute,
    and reading it costs a twentieth of the call, once per delta. An event whose class
    overrides ``is_set`` is read through this wrapper, which calls it."""

    __slots__ = ("event",)

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event

    @property
    def _value(self) -> bool:
        return self.event.is_set()


def set_flag(event: asyncio.Event) -> Any:
    """An object whose ``_value`` is whether ``event`` is set (see :class:`SetFlag`)."""
    if type(event).is_set is asyncio.Event.is_set and hasattr(event, "_value"):
        return event
    return SetFlag(event)


class _Watcher:
    """One task waiting on one abort event for every open scope that uses it."""

    __slots__ = ("scopes", "task")

    def __init__(self, event: asyncio.Event) -> None:
        self.scopes: set[AbortScope] = set()
        self.task: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        self.task.add_done_callback(self._fired)

    def _fired(self, fut: "asyncio.Future[Any]") -> None:
        if not fut.cancelled():
            for scope in list(self.scopes):
                scope.on_abort()


#: the watcher of each event now in use (an event nobody watches is forgotten)
_WATCHERS: "weakref.WeakKeyDictionary[asyncio.Event, _Watcher]" = weakref.WeakKeyDictionary()


class AbortScope:
    """The abort plumbing of one run (start it in the run's task, close it at the end)."""

    __slots__ = ("event", "task", "blocked", "_watcher", "cancelled_by_abort", "__weakref__")

    def __init__(self, event: asyncio.Event) -> None:
        self.event = event
        self.task: Optional[asyncio.Task[Any]] = None
        #: the run's task while it is blocked on the model or a tool (an abort then cancels it);
        #: set around each read by :meth:`next` and by the run's delta path
        self.blocked: Optional[asyncio.Task[Any]] = None
        self._watcher: Optional[_Watcher] = None
        self.cancelled_by_abort = False

    def start(self) -> None:
        self.task = asyncio.current_task()
        watcher = _WATCHERS.get(self.event)
        if watcher is None or watcher.task.done() or watcher.task.get_loop() is not asyncio.get_running_loop():
            # (done: the event was set earlier; another loop: left by a loop closed mid-run)
            watcher = _WATCHERS[self.event] = _Watcher(self.event)
        watcher.scopes.add(self)
        self._watcher = watcher

    def close(self) -> None:
        watcher = self._watcher
        if watcher is None:
            return
        self._watcher = None
        watcher.scopes.discard(self)
        if not watcher.scopes:  # the last run on this event: stop waiting on it
            if not watcher.task.done():
                watcher.task.cancel()
            if _WATCHERS.get(self.event) is watcher:
                del _WATCHERS[self.event]

    def on_abort(self) -> None:
        """The event fired: cancel the run's task if it is blocked on the model or a tool."""
        task = self.blocked
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
        task = self.task
        if self.cancelled_by_abort and task is not None and hasattr(task, "uncancel"):
            task.uncancel()

    async def next(self, it: AsyncIterator[T]) -> T:
        """The stream's next item; an abort cancels the read at once (raises StopAsyncIteration at the end)."""
        if self.event.is_set():
            raise Aborted
        self.blocked = self.task
        try:
            return await it.__anext__()
        finally:
            self.blocked = None

    async def wait(self, aw: Awaitable[T]) -> T:
        """Await ``aw`` (a tool) so that an abort cancels it at once."""
        self.blocked = self.task
        try:
            return await aw
        finally:
            self.blocked = None

    def cancelled_by_us(self) -> bool:
        """Whether a CancelledError now in flight came from this scope's abort (not a tool's own)."""
        return self.cancelled_by_abort or self.event.is_set()

"""Watching a batch from the side: the seam its tracing composes through.

A :class:`BatchObserver` is told when a batch call starts (before any of its tasks exist,
in the task that runs it — so what it makes current there, its runs inherit) and when it
ends. Observers are made per call by the factories connected with
:func:`use_batch_observers` (``we0nb/__init__.py`` connects the tracing one): this package
imports none of them. An observer that raises is logged and dropped, never failing the batch.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Protocol

__all__ = ["BatchObserver", "use_batch_observers", "batch_observer_for"]

log = logging.getLogger("we0nb.batch")


class BatchObserver(Protocol):
    def started(self) -> None:
        """The batch starts (in the task that runs it; its workers' tasks do not exist yet)."""

    def ended(self, result: Any, error: Optional[BaseException]) -> None:
        """The call ended: its :class:`~we0nb.batch.BatchResult`, or the error that ended it."""


#: ``factory(agent, name, items, concurrency)`` → an observer of this batch call, or None
BatchObserverFactory = Callable[[Any, str, int, int], Optional[BatchObserver]]

_FACTORIES: list[BatchObserverFactory] = []


def use_batch_observers(factory: BatchObserverFactory) -> None:
    """Connect a factory of batch observers (called once, by the package that composes it)."""
    if factory not in _FACTORIES:
        _FACTORIES.append(factory)


class _Guarded:
    """The observers of one call; one that raises is logged and dropped."""

    def __init__(self, inner: list[BatchObserver]) -> None:
        self.inner = inner

    def _each(self, what: str, call: Callable[[BatchObserver], None]) -> None:
        for obs in list(self.inner):
            try:
                call(obs)
            except Exception as e:
                log.warning("a batch observer failed at %s (%s: %s); the batch goes on without it",
                            what, type(e).__name__, e)
                self.inner.remove(obs)

    def started(self) -> None:
        self._each("its start", lambda o: o.started())

    def ended(self, result: Any, error: Optional[BaseException]) -> None:
        self._each("its end", lambda o: o.ended(result, error))


def batch_observer_for(agent: Any, name: str, items: int, concurrency: int) -> Optional[_Guarded]:
    """The observers of one batch call (None when no factory gives one: the usual case)."""
    made: list[BatchObserver] = []
    for factory in _FACTORIES:
        try:
            obs = factory(agent, name, items, concurrency)
        except Exception as e:
            log.warning("a batch observer could not be made (%s: %s); the batch goes on without it",
                        type(e).__name__, e)
            continue
        if obs is not None:
            made.append(obs)
    return _Guarded(made) if made else None

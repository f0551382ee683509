"""Watching a run from the side: the seam tracing (and anything like it) composes through.

A :class:`RunObserver` sees what a run does without being on its path: every event but the
deltas, as the consumer gets it (so what it reports is what was made durable), the end of
each model stream, and the run's end however it ends (an abort, a failure). The engine
calls it at those points only — nothing per delta — and calls nothing when there is no
observer: one check per run. An observer that raises is logged once per run and dropped,
never failing the run. An observer whose class says ``guarded = True`` catches what it
raises itself (the tracer does: it is called per event, and a second guard would cost a
call each time); alone, it is called as it is.

Observers are made per run by the factories connected with :func:`use_run_observers` (the
package that composes the engine with, say, OpenTelemetry does this): the engine imports
none of them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from .events import Event
    from .request import RunRequest

__all__ = ["RunObserver", "ObserverFactory", "use_run_observers", "observer_for", "Guarded"]

log = logging.getLogger("we0nb.engine")


class RunObserver(Protocol):
    """What a run tells whoever watches it."""

    def event(self, ev: "Event") -> None:
        """An event of the run, as it is yielded (never a delta)."""

    def model_ended(self, step: int, error: Optional[BaseException], finish: Any = None) -> None:
        """The model's stream of step ``step`` ended (``error``: what ended it, if not its end;
        ``finish``: its finish event, with the usage it reported, or None when it sent none)."""

    def run_ended(self, error: Optional[BaseException]) -> None:
        """The run ended: ``None`` after its ``finish`` event, else the abort or failure."""


#: ``factory(agent, request)`` → an observer for this run, or None (nothing to watch)
ObserverFactory = Callable[[Any, "RunRequest"], Optional[RunObserver]]

_FACTORIES: list[ObserverFactory] = []


def use_run_observers(factory: ObserverFactory) -> None:
    """Connect a factory of run observers (called once, by the package that composes it)."""
    if factory not in _FACTORIES:
        _FACTORIES.append(factory)


def observer_for(agent: Any, request: "RunRequest") -> Optional[RunObserver]:
    """The observer of one run (None when no factory gives one: the usual case)."""
    found = None
    for factory in _FACTORIES:
        try:
            made = factory(agent, request)
        except Exception as e:
            log.warning("a run observer could not be made (%s: %s); the run goes on without it",
                        type(e).__name__, e)
            continue
        if made is not None:
            found = made if found is None else _Both(found, made)
    if found is None or getattr(found, "guarded", False) is True:
        return found
    return Guarded(found)


class _Both:
    """Two observers as one."""

    def __init__(self, a: RunObserver, b: RunObserver) -> None:
        self.a, self.b = a, b

    def event(self, ev: "Event") -> None:
        self.a.event(ev)
        self.b.event(ev)

    def model_ended(self, step: int, error: Optional[BaseException], finish: Any = None) -> None:
        self.a.model_ended(step, error, finish)
        self.b.model_ended(step, error, finish)

    def run_ended(self, error: Optional[BaseException]) -> None:
        self.a.run_ended(error)
        self.b.run_ended(error)


class Guarded:
    """An observer whose failure is logged once and ends its watch, never the run."""

    __slots__ = ("inner",)

    def __init__(self, inner: RunObserver) -> None:
        self.inner: Optional[RunObserver] = inner

    def _failed(self, e: Exception) -> None:
        log.warning("a run observer failed (%s: %s); it watches this run no more", type(e).__name__, e)
        self.inner = None

    def event(self, ev: "Event") -> None:
        if self.inner is not None:
            try:
                self.inner.event(ev)
            except Exception as e:
                self._failed(e)

    def model_ended(self, step: int, error: Optional[BaseException], finish: Any = None) -> None:
        if self.inner is not None:
            try:
                self.inner.model_ended(step, error, finish)
            except Exception as e:
                self._failed(e)

    def run_ended(self, error: Optional[BaseException]) -> None:
        if self.inner is not None:
            try:
                self.inner.run_ended(error)
            except Exception as e:
                self._failed(e)

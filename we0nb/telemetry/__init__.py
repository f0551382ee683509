"""OpenTelemetry GenAI spans for every run and batch (the ``we0nb[otel]`` extra).

With ``opentelemetry-api`` installed and a tracer provider configured — the agent's own
(``We0Agent(tracer_provider=...)``) or the global one (``trace.set_tracer_provider``) — each
run is an ``invoke_agent`` span with a ``chat`` span per model call and an ``execute_tool``
span per tool execution (:mod:`.run`), and each batch an ``invoke_workflow`` span whose
items' runs are its children (:mod:`.batch`). Attribute names follow the GenAI semantic
conventions of ``open-telemetry/semantic-conventions-genai`` v0.1.0 (:mod:`.attributes`);
docs/tracing.md describes every span.

This package is imported only when OpenTelemetry already is (``import we0nb`` loads none of
it): ``we0nb/__init__.py`` connects :func:`run_observer` to the engine's observer seam and
:func:`batch_observer` to the batch runner's. Without a provider, no observer is made: the
cost is one check per run. Exporting is the provider's business: configure a
``BatchSpanProcessor`` (never a ``SimpleSpanProcessor`` with a network exporter, which would
export on the event loop's thread as each span ends).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Optional

from opentelemetry import trace

from .attributes import SCOPE, SEMCONV

__all__ = ["run_observer", "batch_observer", "tracer_for", "SEMCONV"]

_TRACERS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _version() -> str:
    """we0nb's version, as the package read it at import (no metadata read here: this runs on
    the event loop, and this layer does not import the package's root)."""
    return str(getattr(sys.modules.get("we0nb"), "__version__", "0+unknown"))


def tracer_for(agent: Any) -> Optional[Any]:
    """The tracer of ``agent``'s spans: from its ``tracer_provider``, else the global provider
    when one is configured (None: nobody listens, trace nothing)."""
    provider = getattr(agent, "tracer_provider", None)
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None
    try:
        return _TRACERS[provider]
    except (KeyError, TypeError):
        pass
    tracer = provider.get_tracer(SCOPE, _version())
    try:
        _TRACERS[provider] = tracer
    except TypeError:  # (a provider that cannot be weakly referenced: asked again next time)
        pass
    return tracer


def agent_name(agent: Any) -> str:
    """``gen_ai.agent.name``: the agent's ``name`` if it has one, else ``"we0nb"``."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else "we0nb"


def run_observer(agent: Any, request: Any) -> Optional[Any]:
    """The engine's observer factory: a :class:`~.run.RunTracer` when someone listens."""
    tracer = tracer_for(agent)
    if tracer is None:
        return None
    from .run import RunTracer

    return RunTracer(tracer, agent, request, agent_name(agent))


def batch_observer(agent: Any, name: str, items: int, concurrency: int) -> Optional[Any]:
    """The batch runner's observer factory: a :class:`~.batch.BatchTracer` when someone listens."""
    tracer = tracer_for(agent)
    if tracer is None:
        return None
    from .batch import BatchTracer

    return BatchTracer(tracer, agent, name, items, concurrency)

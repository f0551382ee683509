"""What a model call cost, in USD, from its usage: the model's own price, else ``genai-prices``.

A call is priced when it ends (:func:`call_cost`, called by the engine as it closes a step)
and the figure is persisted with its message, so a later change of prices never rewrites
history. The rules (SPEC §13):

* a model given ``price=`` (:class:`~we0nb.models.base.ModelPrice`, USD per million input
  and output tokens) is priced with it: every input token (cached ones too) at the input
  price, every output token at the output price;
* otherwise its :attr:`~we0nb.models.base.Model.provider_name` and
  :attr:`~we0nb.models.base.Model.request_model` are looked up in pydantic's
  ``genai-prices`` data (offline: the data ships with the package), which prices cached
  reads and cache writes as the provider does. ``OpenAIChatModel`` is provider ``openai``
  whatever its ``base_url``: a self-hosted server behind it is priced as OpenAI's model of
  that name, if there is one — give such a model ``price=`` or ``provider=``;
* the offline test models (provider ``"we0nb"``) have no price: their cost is ``None``;
* a lookup that fails (a model or provider the data does not know, the package missing)
  is ``None`` — never 0 — and the reason is logged once per model on ``we0nb.cost``;
* a call that reported no usage (it failed or was aborted before its end) costs ``None``.

``genai-prices`` takes ~0.3 s to import (its data is one large module), so it is imported
on a worker thread as soon as an agent is made with a model that needs it
(:func:`prefetch`): a real model's first call ends long after. (An offline model that
answers at once may end its first call before: that call then waits for the import, once
per process.)
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import sys
import threading
from typing import Any, Optional

from ..messages import Usage
from .base import OWN_PROVIDER

__all__ = ["call_cost", "add_cost", "format_cost", "needs_lookup", "prefetch", "wait_prefetched", "PROVIDER_IDS"]

log = logging.getLogger("we0nb.cost")

#: OpenTelemetry ``gen_ai.provider.name`` values → the provider ids of ``genai-prices``
#: (names that are the same in both are passed as they are)
PROVIDER_IDS = {
    "aws.bedrock": "aws",
    "azure.ai.openai": "azure",
    "azure.ai.inference": "azure",
    "gcp.gemini": "google",
    "gcp.vertex_ai": "google",
    "gcp.gen_ai": "google",
    "mistral_ai": "mistral",
    "x_ai": "x-ai",
    "moonshot_ai": "moonshotai",
}

_lock = threading.Lock()
_prefetching: Optional[threading.Thread] = None
#: (provider, model) pairs whose lookup failed, already logged
_warned: set[tuple[str, str]] = set()


def needs_lookup(model: Any) -> bool:
    """Whether ``model``'s calls are priced from the ``genai-prices`` data."""
    return getattr(model, "price", None) is None and getattr(model, "provider_name", OWN_PROVIDER) != OWN_PROVIDER


def prefetch(model: Any) -> None:
    """Import ``genai-prices`` and load its data on a worker thread, once per process, when
    ``model`` needs it (so the first priced call never waits for it on the event loop)."""
    global _prefetching
    if not needs_lookup(model) or "genai_prices.data" in sys.modules:
        return
    with _lock:
        if _prefetching is None:
            _prefetching = threading.Thread(target=_load, name="we0nb-genai-prices", daemon=True)
            _prefetching.start()


def wait_prefetched(timeout: Optional[float] = None) -> bool:
    """Wait for the import started by :func:`prefetch` (for code that must not import it on a loop)."""
    t = _prefetching
    if t is not None:
        t.join(timeout)
        return not t.is_alive()
    return True


def _load() -> None:
    """Import ``genai-prices`` and its data (a failure is for the lookups to report)."""
    try:
        import genai_prices  # noqa: F401
        from genai_prices import data  # noqa: F401  (the prices: the slow part)
    except Exception as e:  # (the package missing or broken: every lookup says so, once per model)
        log.debug("genai-prices could not be loaded: %s: %s", type(e).__name__, e)


def call_cost(model: Any, usage: Optional[Usage], when: Optional[float] = None) -> Optional[float]:
    """The cost in USD of one call of ``model`` that reported ``usage`` (None: it reported
    none); ``when`` (epoch seconds) picks the price in force then. None when unknown: also
    when the call counted no token at all, which means its provider reported no usage (a
    real call always reads its prompt), so its cost is unknown, not $0."""
    if usage is None or not (usage.input_tokens or usage.output_tokens):
        return None
    price = getattr(model, "price", None)
    if price is not None:
        return (usage.input_tokens * price.input_mtok + usage.output_tokens * price.output_mtok) / 1e6
    provider = getattr(model, "provider_name", OWN_PROVIDER)
    if provider == OWN_PROVIDER:
        return None
    name = str(getattr(model, "request_model", None) or getattr(model, "model_id", ""))
    try:
        return _looked_up(provider, name, usage, when)
    except Exception as e:
        _unknown(provider, name, f"{type(e).__name__}: {e}")
        return None


def _looked_up(provider: str, name: str, usage: Usage, when: Optional[float]) -> Optional[float]:
    try:
        from genai_prices import Usage as PriceUsage, calc_price
    except ImportError:
        _unknown(provider, name, "the genai-prices package is not installed (pip install genai-prices)")
        return None
    at = _dt.datetime.fromtimestamp(when, _dt.timezone.utc) if when is not None else None
    counted = PriceUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                         cache_read_tokens=usage.cached_tokens, cache_write_tokens=usage.cache_write_tokens)
    calc = calc_price(counted, name, provider_id=PROVIDER_IDS.get(provider, provider), genai_request_timestamp=at)
    cost = float(calc.total_price)
    return cost if math.isfinite(cost) else None


def _unknown(provider: str, name: str, why: str) -> None:
    key = (provider, name)
    if key in _warned:
        return
    _warned.add(key)
    log.warning("no price for model %r of provider %r (%s): its calls' cost is None. Give the model its price "
                "with price=(usd_per_million_input, usd_per_million_output), or provider= naming one that "
                "genai-prices knows.", name, provider, why)


def add_cost(total: Optional[float], cost: Optional[float]) -> Optional[float]:
    """A running sum of costs: unknown (None) once any part of it is."""
    if total is None or cost is None:
        return None
    return total + cost


def format_cost(cost: Optional[float]) -> str:
    """A cost for people: ``$1.23``, ``$0.0123`` (four significant digits below a dollar), ``$0``;
    ``unknown`` for None."""
    if cost is None:
        return "unknown"
    return f"${cost:.2f}" if cost >= 1 else f"${cost:.4g}" if cost else "$0"

"""AnthropicModel: Claude through Anthropic's Messages API, with the official ``anthropic`` SDK.

Install the extra: ``pip install 'we0nb[anthropic]'``. The request and the stream mapping
live in :mod:`we0nb.models._anthropic_wire`; this module owns the client, the retries and
the errors.

* Text and extended thinking (``thinking={"type": "enabled", "budget_tokens": 1024}``,
  passed to the API as is) stream as they arrive; each thinking block is kept with its
  signature (a redacted block with its data) and sent back as the API requires, from the
  transcript, so a resume in another process sends them too. Tool calls (``tool_use``,
  input streamed as ``input_json_delta``) are emitted one by one as their blocks end.
* Usage: ``input_tokens`` is the whole prompt (uncached + cache reads + cache writes),
  ``cached_tokens`` the cache reads, ``cache_write_tokens`` the cache writes,
  ``reasoning_tokens`` the thinking tokens when the API reports them.
* ``max_tokens`` (the API requires it) defaults to :data:`DEFAULT_MAX_TOKENS`.
* Structured output: the output tool is forced (``tool_choice={"type": "any"}``); with
  thinking on, the API allows no forced tool, so the choice is left to the model.

Errors (the classes of the OpenAI adapter):

* 401 and 403 → :class:`~we0nb.errors.ModelAuthenticationError`, never retried; 404 and
  other 4xx → :class:`~we0nb.errors.ModelProviderError`, not retried;
* 408, 409, 429, 5xx, 529 (overloaded), an ``error`` event before any output and a failed
  connection → retried here (the SDK's own retries are off) up to ``max_retries`` times,
  honouring ``retry-after`` / ``retry-after-ms`` (longer than ``max_retry_after``: not
  waited for), else with exponential backoff — only while nothing has been streamed;
* a prompt too long for the context window → :class:`~we0nb.errors.ContextWindowExceeded`
  (the engine compacts the history);
* an ``error`` event after output, a cut connection, an event that is not JSON or breaks the
  event sequence → :class:`~we0nb.errors.ModelProviderError`; the engine keeps what
  arrived and leaves the message unfinished, so ``mode="resume"`` continues.

Abort: the engine cancels the pending read and closes this generator; its ``finally``
closes the HTTP response at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any, AsyncIterator, Optional

from .._extras import require
from ..errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError
from ._anthropic_wire import StreamAccumulator, system_param, to_anthropic_messages, to_anthropic_tools
from ._retry import backoff, retry_after
from .base import Model, ModelEvent, ModelRequest

__all__ = ["AnthropicModel", "DEFAULT_MAX_TOKENS"]

#: ``max_tokens`` when none is given: every current Claude model can produce this many
DEFAULT_MAX_TOKENS = 8192

_anthropic: Any = None


def _sdk() -> Any:
    """The official anthropic package, imported on first use (a clear error without the extra)."""
    global _anthropic
    if _anthropic is None:
        _anthropic = require("anthropic", "AnthropicModel", "anthropic")
    return _anthropic


_RESERVED = ("model", "messages", "stream", "system", "tools")
_RETRY_STATUS = (408, 409, 429)
# the status an error type stands for (an ``error`` event arrives inside a 200 response)
_TYPE_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529}
_CONTEXT_TEXT = re.compile(
    r"prompt is too long|context (window|length|limit)|exceeds? (the )?(model'?s? )?context|"
    r"too many (input )?tokens", re.IGNORECASE)


def _is_transport(exc: BaseException) -> bool:
    """A network failure below the SDK (a read that broke off, a reset connection)."""
    if isinstance(exc, OSError):
        return True
    for name in ("httpx2", "httpx"):
        mod = sys.modules.get(name)
        base = getattr(mod, "TransportError", None) if mod is not None else None
        if base is not None and isinstance(exc, base):
            return True
    return False


def _described(exc: BaseException) -> tuple[int, Optional[str], str, bool]:
    """``(status, error type, message, in_stream)`` of an SDK status error."""
    body = getattr(exc, "body", None)
    err = body.get("error") if isinstance(body, dict) else None
    etype = err.get("type") if isinstance(err, dict) and isinstance(err.get("type"), str) else None
    text = err.get("message") if isinstance(err, dict) else None
    if not isinstance(text, str) or not text:
        text = body.strip()[:500] if isinstance(body, str) and body.strip() else str(getattr(exc, "message", exc))
    status = getattr(exc, "status_code", None)
    in_stream = not isinstance(status, int) or status < 400
    if in_stream:
        status = _TYPE_STATUS.get(etype or "", 500)
    return status, etype, text, in_stream  # type: ignore[return-value]


def _is_context(status: int, text: str) -> bool:
    return status == 413 or (status == 400 and bool(_CONTEXT_TEXT.search(text)))


class AnthropicModel(Model):
    """A Claude model, streamed through ``anthropic.AsyncAnthropic().messages.create``.

    ``model`` is the API's model name (e.g. ``"claude-sonnet-4-5"``); ``api_key`` defaults to
    ``$ANTHROPIC_API_KEY``; ``base_url`` points at a proxy or a compatible server. Keywords:

    * ``max_tokens`` (:data:`DEFAULT_MAX_TOKENS`) — the most tokens one step may produce
      (thinking included: it must exceed a thinking ``budget_tokens``);
    * ``prompt_cache`` (False) — cache breakpoints on the system prompt, the tools and the
      latest turn, so each step re-reads the conversation from the cache;
    * ``context_window`` — the model's context size in tokens; compaction needs it;
    * ``max_retries`` (3), ``retry_base_delay`` (0.5 s, doubled per attempt, capped at
      ``retry_max_delay`` = 8 s), ``max_retry_after`` (60 s) — see the module docstring;
    * ``timeout`` — seconds for the HTTP request (None: the SDK's default);
    * ``client`` — an ``AsyncAnthropic`` (or a Bedrock/Vertex client) to use as it is;
    * any other keyword that ``messages.create`` of the installed SDK takes (``thinking``,
      ``stop_sequences``, ``metadata``, ``extra_headers``, ``extra_body`` …) goes to it as is.
    """

    def __init__(self, model: str, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, prompt_cache: bool = False,
                 context_window: Optional[int] = None, max_retries: int = 3, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 8.0, max_retry_after: float = 60.0, timeout: Optional[float] = None,
                 client: Any = None, model_id: Optional[str] = None, **options: Any):
        _sdk()  # the SDK is an extra: a clear one-line error here rather than at the first step
        self._check(model, max_tokens, context_window, max_retries,
                    (retry_base_delay, retry_max_delay, max_retry_after), options)
        if client is None and api_key is None:
            api_key = os.environ.get("ANTHROPIC_API_KEY")
            if api_key is None and not os.environ.get("ANTHROPIC_AUTH_TOKEN"):
                if base_url is None:
                    raise ValueError("AnthropicModel: no API key. Pass api_key=... or set ANTHROPIC_API_KEY.")
                api_key = "not-needed"  # a local proxy may need none; the SDK wants one
        self.model = model
        self.base_url = base_url
        self.model_id = model_id or model
        self.max_tokens = max_tokens
        self.prompt_cache = bool(prompt_cache)
        self.context_window = context_window
        self.max_retries = max_retries
        self.retry_base_delay = float(retry_base_delay)
        self.retry_max_delay = float(retry_max_delay)
        self.max_retry_after = float(max_retry_after)
        self.timeout = timeout
        self.options = options
        self._api_key = api_key
        self._given_client = client
        self._client: Any = None
        self._client_loop: Any = None

    @staticmethod
    def _check(model: Any, max_tokens: Any, context_window: Any, max_retries: Any, delays: tuple,
               options: dict[str, Any]) -> None:
        if not isinstance(model, str) or not model:
            raise TypeError("AnthropicModel(model): expected the model name as a non-empty string, "
                            "e.g. 'claude-sonnet-4-5'.")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
            raise ValueError("AnthropicModel(max_tokens=...): expected a positive number of tokens.")
        if context_window is not None and (not isinstance(context_window, int) or context_window <= 0):
            raise ValueError("AnthropicModel(context_window=...): expected a positive number of tokens or None.")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError("AnthropicModel(max_retries=...): expected an integer >= 0.")
        if any(not isinstance(v, (int, float)) or v < 0 for v in delays):
            raise ValueError("AnthropicModel(retry_base_delay/retry_max_delay/max_retry_after=...): "
                             "expected seconds >= 0.")
        bad = sorted(set(options) & set(_RESERVED))
        if bad:
            raise TypeError(f"AnthropicModel: {', '.join(bad)} cannot be passed as options; the model sets them.")
        thinking = options.get("thinking")
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if isinstance(budget, int) and budget >= max_tokens:
            raise ValueError(f"AnthropicModel: thinking budget_tokens={budget} must be below "
                             f"max_tokens={max_tokens}; pass a larger max_tokens=....")

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"AnthropicModel({self.model!r}{where})"

    # ------------------------------------------------------------------ client

    def _get_client(self) -> Any:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        # an HTTP connection pool belongs to one event loop: a new loop gets a new client
        if self._client is None or self._client_loop is not loop:
            kwargs: dict[str, Any] = {"max_retries": 0}
            if self._api_key is not None:
                kwargs["api_key"] = self._api_key
            if self.base_url is not None:
                kwargs["base_url"] = self.base_url
            if self.timeout is not None:
                kwargs["timeout"] = self.timeout
            self._client = _sdk().AsyncAnthropic(**kwargs)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client of the current event loop (optional; it is rebuilt on use)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------------ request

    @property
    def thinking(self) -> bool:
        """Extended thinking is on (then the API allows no forced tool choice)."""
        t = self.options.get("thinking")
        return isinstance(t, dict) and t.get("type") not in (None, "disabled")

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``."""
        cache = self.prompt_cache
        params: dict[str, Any] = dict(self.options)
        params["model"] = self.model
        params["max_tokens"] = self.max_tokens
        params["messages"] = to_anthropic_messages(request, cache=cache)
        params["stream"] = True
        system = system_param(request.system, cache=cache)
        if system is not None:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request, cache=cache)
            if request.output_tool and not self.thinking:
                params["tool_choice"] = {"type": "any"}
        else:
            params.pop("tool_choice", None)
        return params

    # ------------------------------------------------------------------ errors and retries

    def _where(self) -> str:
        return f"The model server at {self.base_url}" if self.base_url else "The Anthropic API"

    def _translate(self, exc: BaseException, produced: bool) -> BaseException:
        """A provider exception as a we0nb error with a clear message (others unchanged)."""
        where = self._where()
        low = where[0].lower() + where[1:]
        if isinstance(exc, ModelProviderError):
            return exc
        if isinstance(exc, json.JSONDecodeError):
            return ModelProviderError(f"{where} sent a malformed stream event (not JSON: {exc.doc[:200]!r})",
                                      retryable=True)
        sdk = _sdk()
        if isinstance(exc, sdk.APIConnectionError) or _is_transport(exc):
            cause = exc.__cause__ if isinstance(exc, sdk.APIConnectionError) else exc
            detail = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else str(exc)
            if produced:
                return ModelProviderError(f"The stream from {low} broke off mid-way ({detail})", retryable=True)
            return ModelProviderError(f"Cannot reach {low} ({detail})", retryable=True)
        if not isinstance(exc, sdk.APIStatusError):
            return exc
        status, etype, text, in_stream = _described(exc)
        if _is_context(status, text):
            return ContextWindowExceeded(f"The request is larger than the context window of {self.model!r} "
                                         f"({low} said: {text})", status_code=status)
        if status == 401:
            return ModelAuthenticationError(
                f"{where} refused the API key (HTTP 401: {text}); pass a valid api_key=... to "
                "AnthropicModel or set ANTHROPIC_API_KEY", status_code=401)
        if status == 403:
            return ModelAuthenticationError(
                f"{where} denied access (HTTP 403: {text}); check that this API key may use model "
                f"{self.model!r}", status_code=403)
        if status == 404:
            return ModelProviderError(f"{where} answered HTTP 404 ({text}); check the model name {self.model!r} "
                                      "and base_url", status_code=404)
        retryable = status in _RETRY_STATUS or status >= 500
        kind = f" ({etype})" if etype else ""
        if in_stream:
            return ModelProviderError(f"{where} reported an error mid-stream{kind}: {text}", status_code=status,
                                      retryable=retryable)
        return ModelProviderError(f"{where} answered HTTP {status}{kind}: {text}", status_code=status,
                                  retryable=retryable)

    def _retry_delay(self, exc: BaseException, attempt: int) -> Optional[float]:
        """Seconds to wait before trying again, or None when ``exc`` is not worth retrying."""
        if attempt >= self.max_retries:
            return None
        sdk = _sdk()
        if isinstance(exc, sdk.APIStatusError):
            status, _, text, in_stream = _described(exc)
            if not (status in _RETRY_STATUS or status >= 500) or _is_context(status, text):
                return None
            if not in_stream:
                headers = exc.response.headers
                if headers.get("x-should-retry") == "false":
                    return None
                after = retry_after(headers)
                if after is not None:
                    return after if after <= self.max_retry_after else None
        elif not (isinstance(exc, sdk.APIConnectionError) or _is_transport(exc)):
            return None
        return backoff(attempt, self.retry_base_delay, self.retry_max_delay)

    # ------------------------------------------------------------------ the stream

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:  # type: ignore[override]
        client = self._get_client()
        params = self.request_params(request)
        attempt = 0
        while True:
            produced = False
            response = None
            delay: Optional[float] = None
            try:
                response = await client.messages.create(**params)
                acc = StreamAccumulator(self._where())
                while True:
                    try:
                        event = await response.__anext__()
                    except StopAsyncIteration:
                        break
                    for ev in acc.feed(event):
                        produced = True
                        yield ev
                yield acc.finish()
                return
            except Exception as exc:
                if not produced:
                    delay = self._retry_delay(exc, attempt)
                if delay is None:
                    err = self._translate(exc, produced)
                    if err is exc:
                        raise
                    if attempt and isinstance(err, ModelProviderError):
                        err.args = (f"{err.args[0]} (gave up after {attempt} retr{'y' if attempt == 1 else 'ies'})",)
                    raise err from exc
            finally:
                if response is not None:
                    # closes the HTTP response at once: on abort the server sees the disconnect
                    await response.close()
            attempt += 1
            await asyncio.sleep(delay)

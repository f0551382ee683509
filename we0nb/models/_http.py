"""What every HTTP provider adapter does the same way: :class:`HttpModel`.

An adapter (:class:`~we0nb.models.openai.OpenAIChatModel`,
:class:`~we0nb.models.anthropic.AnthropicModel`) says how to build its SDK client, its
request and its stream accumulator, and what its SDK's errors mean (a :class:`Failure`).
The base does the rest, once for all of them:

* one SDK client per event loop (an HTTP connection pool belongs to one loop), the SDK's
  own retries off;
* the stream, retried with backoff — honouring ``Retry-After`` / ``retry-after-ms`` up to
  ``max_retry_after`` — for a rate limit, a 5xx or a lost connection, but only while
  nothing has been streamed yet (see :class:`~we0nb.models._retry.RetryPolicy`);
* the HTTP response closed at once when the engine closes the stream (an abort), so the
  server sees the client go;
* provider errors as we0nb errors that say what to do: 401/403 →
  :class:`~we0nb.errors.ModelAuthenticationError`, a request too large →
  :class:`~we0nb.errors.ContextWindowExceeded` (the engine compacts), anything else →
  :class:`~we0nb.errors.ModelProviderError` with ``status_code`` and ``retryable``.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator, ClassVar, Generic, Mapping, Optional, Protocol, TypeVar
from urllib.parse import urlsplit

from .._extras import require
from ..errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError
from ._retry import RetryPolicy, is_retry_status, retry_after
from .base import Model, ModelEvent, ModelRequest

__all__ = ["HttpModel", "Failure", "Accumulator", "is_transport"]

_SDKS: dict[str, Any] = {}


class Accumulator(Protocol):
    """Turns the SDK's stream items into model events (pure: no I/O)."""

    def feed(self, item: Any, /) -> list[ModelEvent]: ...


A = TypeVar("A", bound=Accumulator)


@dataclass(frozen=True)
class Failure:
    """What a provider's error means, as an adapter reads it from its SDK's exception.

    ``status`` is the HTTP status (for an error reported inside a streamed 200 response:
    the status its type stands for, or None); ``text`` the server's own words; ``kind`` the
    provider's error type, named in the message; ``context``: the request is larger than
    the context window; ``no_retry``: the adapter knows asking again cannot help (a spent
    quota, a request the server rejects every time); ``headers`` the failed response's."""

    text: str
    status: Optional[int] = None
    kind: Optional[str] = None
    in_stream: bool = False
    context: bool = False
    no_retry: bool = False
    headers: Optional[Mapping[str, str]] = None

    @property
    def retryable(self) -> bool:
        """Trying again later may help (a rate limit, a 5xx, an error inside the stream)."""
        return self.status is None or is_retry_status(self.status)


def is_transport(exc: BaseException) -> bool:
    """A network failure below the SDK (a read that broke off, a reset connection)."""
    if isinstance(exc, OSError):
        return True
    for name in ("httpx2", "httpx"):
        mod = sys.modules.get(name)
        base = getattr(mod, "TransportError", None) if mod is not None else None
        if base is not None and isinstance(exc, base):
            return True
    return False


def _check_number(label: str, name: str, value: Any, *, positive: bool) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value > 0 if positive else value >= 0)
    if not ok:
        expected = "a positive number of tokens or None" if positive else "an integer >= 0"
        raise ValueError(f"{label}({name}=...): expected {expected}.")


class HttpModel(Model, Generic[A]):
    """The shared base of the HTTP adapters (see the module docstring).

    Subclasses set the class attributes below and implement :meth:`request_params`,
    :meth:`_new_client`, :meth:`_open`, :meth:`_accumulator`, :meth:`_finish` and
    :meth:`_describe`."""

    #: the SDK's module and the we0nb extra that installs it
    sdk_module: ClassVar[str]
    sdk_extra: ClassVar[str]
    #: the provider's API when no ``base_url`` is given ("The OpenAI API") and its URL
    api_name: ClassVar[str]
    default_url: ClassVar[str]
    #: the environment variables the SDK reads for the key and the URL
    key_env: ClassVar[str]
    url_env: ClassVar[str]
    #: a model name for the messages of construction errors
    example_model: ClassVar[str]
    #: request keywords the adapter sets itself (not accepted as options)
    reserved: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: str, *, base_url: Optional[str], api_key: Optional[str],
                 context_window: Optional[int], max_retries: int, retry_base_delay: float,
                 retry_max_delay: float, max_retry_after: float, timeout: Optional[float], client: Any,
                 model_id: Optional[str], provider: Optional[str], price: Any, options: dict[str, Any]):
        self.sdk()  # the SDK is an extra: a clear one-line error here rather than at the first step
        self._check(model, context_window, max_retries, (("retry_base_delay", retry_base_delay),
                    ("retry_max_delay", retry_max_delay), ("max_retry_after", max_retry_after)), options)
        self._set_pricing(provider, price)
        self.model = model
        self.base_url = base_url
        self.model_id = model_id or model
        self.context_window = context_window
        self.retry = RetryPolicy(max_retries, float(retry_base_delay), float(retry_max_delay),
                                 float(max_retry_after))
        self.timeout = timeout
        self.options = options
        self._api_key = api_key
        self._given_client = client
        self._client: Any = None
        self._client_loop: Optional[asyncio.AbstractEventLoop] = None
        url = getattr(client, "base_url", None) if client is not None else None
        self._endpoint = urlsplit(str(url or base_url or os.environ.get(self.url_env) or self.default_url))

    @classmethod
    def sdk(cls) -> Any:
        """The provider's SDK module, imported on first use (a clear error without the extra)."""
        mod = _SDKS.get(cls.sdk_module)
        if mod is None:
            mod = _SDKS[cls.sdk_module] = require(cls.sdk_module, cls.__name__, cls.sdk_extra)
        return mod

    def _check(self, model: Any, context_window: Any, max_retries: Any, delays: tuple[tuple[str, Any], ...],
               options: dict[str, Any]) -> None:
        label = type(self).__name__
        if not isinstance(model, str) or not model:
            raise TypeError(f"{label}(model): expected the model name as a non-empty string, "
                            f"e.g. {self.example_model!r}.")
        if context_window is not None:
            _check_number(label, "context_window", context_window, positive=True)
        _check_number(label, "max_retries", max_retries, positive=False)
        for name, v in delays:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{label}({name}=...): expected seconds >= 0.")
        bad = sorted(set(options) & set(self.reserved))
        if bad:
            raise TypeError(f"{label}: {', '.join(bad)} cannot be passed as options; the model sets them.")

    @property
    def max_retries(self) -> int:
        return self.retry.max_retries

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"{type(self).__name__}({self.model!r}{where})"

    # ------------------------------------------------------------------ facts for traces and prices

    @property
    def request_model(self) -> str:
        return self.model

    @property
    def server_address(self) -> Optional[str]:
        return self._endpoint.hostname

    @property
    def server_port(self) -> Optional[int]:
        try:
            port = self._endpoint.port
        except ValueError:  # a malformed port in the URL: the SDK will say so
            return None
        if port is not None:
            return port
        return {"https": 443, "http": 80}.get(self._endpoint.scheme)

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
            self._client = self._new_client(kwargs)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client of the current event loop (optional; it is rebuilt on use)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------------ what an adapter says

    @abc.abstractmethod
    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of the SDK's streaming call for ``request``."""

    @abc.abstractmethod
    def _new_client(self, kwargs: dict[str, Any]) -> Any:
        """A new SDK client made with ``kwargs`` (``max_retries=0``, ``api_key``, ``base_url``…)."""

    @abc.abstractmethod
    async def _open(self, client: Any, params: dict[str, Any]) -> Any:
        """Send the request; the SDK's stream (``__anext__`` and ``close()``)."""

    @abc.abstractmethod
    def _accumulator(self) -> A:
        """A new accumulator for one streamed reply."""

    @abc.abstractmethod
    def _finish(self, acc: A, params: dict[str, Any]) -> list[ModelEvent]:
        """The events after the stream's end (the finish), or an error when it ended wrong."""

    @abc.abstractmethod
    def _describe(self, exc: BaseException) -> Optional[Failure]:
        """What an SDK status error means (None: ``exc`` is not one)."""

    # ------------------------------------------------------------------ the stream

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        client = self._get_client()
        params = self.request_params(request)
        attempt = 0
        while True:
            produced = False
            response = None
            delay: Optional[float] = None
            try:
                response = await self._open(client, params)
                acc = self._accumulator()
                feed, next_item = acc.feed, response.__anext__
                while True:
                    try:
                        item = await next_item()
                    except StopAsyncIteration:
                        break
                    for ev in feed(item):
                        produced = True
                        yield ev
                for ev in self._finish(acc, params):
                    yield ev
                return
            except Exception as exc:
                if not produced:
                    delay = self._retry_delay(exc, attempt)
                if delay is None:
                    err = self._final_error(exc, produced, attempt)
                    if err is exc:
                        raise
                    raise err from exc
            finally:
                if response is not None:
                    # closes the HTTP response at once: on abort the server sees the disconnect
                    await response.close()
            attempt += 1
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------ errors and retries

    def _redacted(self, text: str) -> str:
        """The server's words without the API key (a server that quotes the key it refused puts it
        in the raised error, the stored message and every log that prints them)."""
        key = self._api_key or os.environ.get(self.key_env)
        if isinstance(key, str) and len(key) >= 8 and key in text:
            text = text.replace(key, f"{key[:3]}…(the API key)")
        return text

    def _wait_refused(self, f: Failure) -> str:
        """Why a failure the server said to retry later was not retried: the wait it asked for."""
        after = retry_after(f.headers) if f.headers is not None and f.retryable else None
        if after is None or after <= self.retry.max_retry_after:
            return ""
        return (f" (it asked to wait {after:g} s, longer than max_retry_after={self.retry.max_retry_after:g} s: "
                "run again later — mode='resume' continues the turn — or raise max_retry_after)")

    def _where(self) -> str:
        return f"The model server at {self.base_url}" if self.base_url else self.api_name

    def _is_connection(self, exc: BaseException) -> bool:
        return isinstance(exc, self.sdk().APIConnectionError) or is_transport(exc)

    def _retry_delay(self, exc: BaseException, attempt: int) -> Optional[float]:
        """Seconds to wait before trying again, or None when ``exc`` is not worth retrying."""
        if self._is_connection(exc):
            return self.retry.delay(attempt, None)
        failure = self._describe(exc)
        if failure is None or failure.context or failure.no_retry or not failure.retryable:
            return None
        return self.retry.delay(attempt, failure.headers)

    def _final_error(self, exc: BaseException, produced: bool, attempt: int) -> BaseException:
        err = self._translate(exc, produced)
        if err is not exc and attempt and isinstance(err, ModelProviderError):
            err.args = (f"{err.args[0]} (gave up after {attempt} retr{'y' if attempt == 1 else 'ies'})",)
        return err

    def _translate(self, exc: BaseException, produced: bool) -> BaseException:
        """A provider exception as a we0nb error with a clear message (others unchanged)."""
        if isinstance(exc, ModelProviderError):
            return exc
        where = self._where()
        low = where[0].lower() + where[1:]
        if isinstance(exc, json.JSONDecodeError):
            return ModelProviderError(f"{where} sent a malformed stream event (not JSON: {exc.doc[:200]!r})",
                                      retryable=True)
        if self._is_connection(exc):
            cause = exc.__cause__ if isinstance(exc, self.sdk().APIConnectionError) else exc
            detail = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else str(exc)
            if produced:
                return ModelProviderError(f"The stream from {low} broke off mid-way ({detail})", retryable=True)
            return ModelProviderError(f"Cannot reach {low} ({detail})", retryable=True)
        failure = self._describe(exc)
        return exc if failure is None else self._failure_error(failure, where)

    def _failure_error(self, f: Failure, where: str) -> ModelProviderError:
        low = where[0].lower() + where[1:]
        label = type(self).__name__
        f = dataclasses.replace(f, text=self._redacted(f.text) + self._wait_refused(f))
        if f.context:
            return ContextWindowExceeded(f"The request is larger than the context window of {self.model!r} "
                                         f"({low} said: {f.text})", status_code=f.status)
        if f.status == 401:
            return ModelAuthenticationError(
                f"{where} refused the API key (HTTP 401: {f.text}); pass a valid api_key=... to {label} "
                f"or set {self.key_env}", status_code=401)
        if f.status == 403:
            return ModelAuthenticationError(
                f"{where} denied access (HTTP 403: {f.text}); check that this API key may use model "
                f"{self.model!r}", status_code=403)
        if f.status == 404:
            return ModelProviderError(f"{where} answered HTTP 404 ({f.text}); check the model name {self.model!r} "
                                      "and base_url", status_code=404)
        kind = f" ({f.kind})" if f.kind else ""
        if f.in_stream:
            return ModelProviderError(f"{where} reported an error mid-stream{kind}: {f.text}", status_code=f.status,
                                      retryable=f.retryable)
        return ModelProviderError(f"{where} answered HTTP {f.status}{kind}: {f.text}", status_code=f.status,
                                  retryable=f.retryable)

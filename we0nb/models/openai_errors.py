"""Errors of an OpenAI-compatible server: what they mean for we0nb, and whether to retry.

* 401/403 → :class:`~we0nb.errors.ModelAuthenticationError` (never retried);
* 408, 409, 429, 5xx and connection failures are retried (the client's own retries are
  off) up to ``max_retries`` times with exponential backoff, honouring ``Retry-After`` /
  ``retry-after-ms`` — but only while nothing has been streamed yet; a ``Retry-After``
  longer than ``max_retry_after`` is not waited for;
* a request too large for the context window → :class:`~we0nb.errors.ContextWindowExceeded`
  (the engine compacts the history);
* a stream that breaks off, a chunk that is not JSON, an empty stream, or a stream that
  ends without a finish reason → :class:`~we0nb.errors.ModelProviderError`.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError

__all__ = ["is_context_length_error", "translate", "RetryPolicy"]

_RETRY_STATUS = (408, 409, 429)
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded",
                  "string_above_max_length"}
_CONTEXT_TEXT = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|too many tokens|prompt is too long|"
    r"input is too long|exceeds? the (available )?context|reduce the length of the messages",
    re.IGNORECASE,
)


def error_text(exc: BaseException) -> str:
    """The server's own words from an SDK error (its JSON ``message``/``detail``, or its body)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        msg = body.get("message") or body.get("error") or body.get("detail")
        if isinstance(msg, dict):
            msg = msg.get("message")
        if isinstance(msg, str) and msg:
            return msg
        if msg is not None:
            return json.dumps(msg)[:500]  # e.g. a list of validation errors
    elif isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return str(getattr(exc, "message", None) or exc)


def is_context_length_error(exc: BaseException) -> bool:
    """Whether a provider error says the request is larger than the context window."""
    if isinstance(exc, ContextWindowExceeded):
        return True
    sdk = sys.modules.get("openai")
    if sdk is None or not isinstance(exc, sdk.APIError) or isinstance(exc, sdk.APIConnectionError):
        return False
    status = getattr(exc, "status_code", None)
    if status is not None and status not in (400, 413, 422, 500):
        return False
    code = getattr(exc, "code", None)
    etype = getattr(exc, "type", None)
    if code in _CONTEXT_CODES or etype in _CONTEXT_CODES:
        return True
    return bool(_CONTEXT_TEXT.search(error_text(exc)))


def retry_after(headers: Any) -> Optional[float]:
    """Seconds a ``Retry-After`` / ``retry-after-ms`` header asks for (None: no usable header)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value) / scale
        except ValueError:
            continue
        if math.isfinite(delay):
            return max(0.0, delay)
    value = headers.get("retry-after")
    if value:
        try:
            parsed = email.utils.parsedate_tz(value)
            if parsed is not None:
                return max(0.0, email.utils.mktime_tz(parsed) - time.time())
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def translate(sdk: Any, exc: BaseException, *, produced: bool, where: str, model: str) -> BaseException:
    """A provider exception as a we0nb error with a clear message (others unchanged).

    ``where`` names the server ("The model server at …"), ``model`` the model name."""
    if isinstance(exc, ModelProviderError):
        return exc
    if isinstance(exc, json.JSONDecodeError):
        return ModelProviderError(
            f"{where} sent a malformed stream chunk (not JSON: {exc.doc[:200]!r})", retryable=True)
    if not isinstance(exc, sdk.APIError):
        return exc
    text = error_text(exc)
    status = getattr(exc, "status_code", None)
    low = where[0].lower() + where[1:]
    if is_context_length_error(exc):
        return ContextWindowExceeded(
            f"The request is larger than the context window of {model!r} ({low} said: {text})", status_code=status)
    if isinstance(exc, sdk.AuthenticationError):
        return ModelAuthenticationError(
            f"{where} refused the API key (HTTP 401: {text}); pass a valid api_key=... to "
            "OpenAIChatModel or set OPENAI_API_KEY", status_code=401)
    if isinstance(exc, sdk.PermissionDeniedError):
        return ModelAuthenticationError(
            f"{where} denied access (HTTP 403: {text}); check that this API key may use model {model!r}",
            status_code=403)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else text
        if produced:
            return ModelProviderError(f"The stream from {low} broke off mid-way ({detail})", retryable=True)
        return ModelProviderError(f"Cannot reach {low} ({detail})", retryable=True)
    if status is not None:
        retryable = status in _RETRY_STATUS or status >= 500
        return ModelProviderError(f"{where} answered HTTP {status}: {text}", status_code=status,
                                  retryable=retryable)
    return ModelProviderError(f"{where} reported an error in the stream: {text}", retryable=True)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait before asking again (see the module docstring)."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, sdk: Any, exc: BaseException, attempt: int) -> Optional[float]:
        """Seconds to wait before trying again, or None when ``exc`` is not worth retrying."""
        if attempt >= self.max_retries:
            return None
        if isinstance(exc, sdk.APIStatusError):
            status = exc.status_code
            if not (status in _RETRY_STATUS or status >= 500) or is_context_length_error(exc):
                return None
            if getattr(exc, "code", None) == "insufficient_quota":
                return None  # a quota, not a rate: waiting does not help
            if _never_succeeds(exc):
                return None
            if exc.response.headers.get("x-should-retry") == "false":
                return None
            after = retry_after(exc.response.headers)
            if after is not None:
                return after if after <= self.max_retry_after else None
        elif not isinstance(exc, sdk.APIConnectionError):
            return None
        backoff = min(self.base_delay * (2 ** attempt), self.max_delay)
        return backoff * (1 - 0.25 * random.random())


def _never_succeeds(exc: Any) -> bool:
    """A 5xx that is really a rejected request (a validation error): the same request fails again.

    llama-cpp-python answers HTTP 500 with pydantic's ``validation error`` text to a request
    it cannot parse; retrying it three times only delays the error."""
    return exc.status_code == 500 and "validation error" in error_text(exc)

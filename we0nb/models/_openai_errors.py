"""What the errors of an OpenAI-compatible server mean (the rest is :mod:`we0nb.models._http`).

* a request too large for the context window, recognised by the error codes and the
  words of OpenAI, vLLM, llama.cpp and others → :class:`~we0nb.errors.ContextWindowExceeded`;
* 429 ``insufficient_quota`` (a spent quota, not a rate: waiting does not help) and
  llama-cpp-python's HTTP 500 ``validation error`` (a request it cannot parse, rejected
  every time) are not retried;
* an error event inside the stream is retryable later but not retried at once.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Optional

from ..errors import ContextWindowExceeded
from ._http import Failure

__all__ = ["is_context_length_error", "describe", "error_text"]

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


def describe(sdk: Any, exc: BaseException) -> Optional[Failure]:
    """What an error of the ``openai`` SDK means (None: not a server's error)."""
    if not isinstance(exc, sdk.APIError) or isinstance(exc, sdk.APIConnectionError):
        return None
    text = error_text(exc)
    context = is_context_length_error(exc)
    if isinstance(exc, sdk.APIStatusError):
        err: Any = exc
        status = err.status_code
        no_retry = getattr(err, "code", None) == "insufficient_quota" or (
            status == 500 and "validation error" in text)
        return Failure(text, status, context=context, no_retry=no_retry, headers=err.response.headers)
    return Failure(text, in_stream=True, context=context, no_retry=True)

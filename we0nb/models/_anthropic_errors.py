"""What the errors of Anthropic's Messages API mean (the rest is :mod:`we0nb.models._http`).

An error before the stream is an HTTP status with a JSON body ``{"type": "error", "error":
{"type": …, "message": …}}``; an ``error`` event inside a streamed 200 response carries
the same body, and stands for the status of its type (``overloaded_error`` → 529 …). A
prompt too long for the context window (HTTP 413, or 400 saying so) →
:class:`~we0nb.errors.ContextWindowExceeded`.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ._http import Failure

__all__ = ["describe"]

# the status an error type stands for (an ``error`` event arrives inside a 200 response)
_TYPE_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529}
_CONTEXT_TEXT = re.compile(
    r"prompt is too long|context (window|length|limit)|exceeds? (the )?(model'?s? )?context|"
    r"too many (input )?tokens", re.IGNORECASE)


def describe(sdk: Any, exc: BaseException) -> Optional[Failure]:
    """What an error of the ``anthropic`` SDK means (None: not a server's error)."""
    if not isinstance(exc, sdk.APIStatusError):
        return None
    response: Any = getattr(exc, "response", None)
    body = getattr(exc, "body", None)
    err = body.get("error") if isinstance(body, dict) else None
    etype = err.get("type") if isinstance(err, dict) and isinstance(err.get("type"), str) else None
    text = err.get("message") if isinstance(err, dict) else None
    if not isinstance(text, str) or not text:
        text = body.strip()[:500] if isinstance(body, str) and body.strip() else str(getattr(exc, "message", exc))
    status = getattr(exc, "status_code", None)
    in_stream = not isinstance(status, int) or status < 400
    if in_stream or not isinstance(status, int):
        status = _TYPE_STATUS.get(etype or "", 500)
    context = status == 413 or (status == 400 and bool(_CONTEXT_TEXT.search(text)))
    return Failure(text, status, kind=etype, in_stream=in_stream, context=context,
                   headers=None if in_stream else response.headers)

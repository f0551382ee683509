"""When an HTTP model adapter tries again: the server's ``Retry-After`` hint, else a backoff.

Shared by the provider adapters so they wait the same way (the OpenAI adapter still has its
own copy of :func:`retry_after`).
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from typing import Any, Optional

__all__ = ["retry_after", "backoff"]


def retry_after(headers: Any) -> Optional[float]:
    """Seconds the server asked to wait (``retry-after-ms``, ``retry-after`` as seconds or an
    HTTP date), or None when it did not say."""
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


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: about ``base × 2**attempt``, at most ``cap``."""
    return min(base * (2 ** attempt), cap) * (1 - 0.25 * random.random())

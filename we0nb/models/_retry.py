"""When an HTTP model adapter tries again: the server's ``Retry-After`` hint, else a backoff.

One :class:`RetryPolicy` serves every adapter built on :class:`~we0nb.models._http.HttpModel`,
so they all wait the same way.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["RetryPolicy", "retry_after", "backoff", "RETRY_STATUS", "is_retry_status"]

#: statuses below 500 worth asking again for: a timeout, a conflict, a rate limit
RETRY_STATUS = (408, 409, 429)


def is_retry_status(status: int) -> bool:
    """Whether an HTTP status says that trying again later may help (408, 409, 429, 5xx)."""
    return status in RETRY_STATUS or status >= 500


def retry_after(headers: Optional[Mapping[str, str]]) -> Optional[float]:
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


@dataclass(frozen=True)
class RetryPolicy:
    """How often to ask again and how long to wait in between.

    ``max_retries`` retries at most; waits ``base_delay`` seconds doubled per attempt, capped
    at ``max_delay``, unless the server said how long (``Retry-After``): a wait it asks for
    longer than ``max_retry_after`` is not waited for (the error goes to the caller)."""

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, headers: Optional[Mapping[str, str]]) -> Optional[float]:
        """Seconds to wait before retry number ``attempt + 1`` of a failure worth retrying, or
        None to give up. ``headers`` are the failed response's (None: there was no response)."""
        if attempt >= self.max_retries:
            return None
        if headers is not None:
            if headers.get("x-should-retry") == "false":
                return None
            after = retry_after(headers)
            if after is not None:
                return after if after <= self.max_retry_after else None
        return backoff(attempt, self.base_delay, self.max_delay)

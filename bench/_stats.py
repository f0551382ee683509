"""The one way the benchmarks print a spread of runs: min / median / max."""

from __future__ import annotations

import statistics
from typing import Sequence


def spread(xs: Sequence[float], digits: int = 2, width: int = 6, unit: str = "") -> str:
    """``min … median … max`` of ``xs``, each with ``unit`` after it."""
    def f(v: float) -> str:
        return f"{v:{width}.{digits}f}{unit}"

    return f"min {f(min(xs))}  median {f(statistics.median(xs))}  max {f(max(xs))}"

"""The scores at the persistence port: what ``batch.score`` found for each item and scorer.

A score is keyed by ``(batch, item, scorer)``: scoring again with the same scorer skips what
is scored, and a scorer is identified by its name. ``judge_session_id`` names the session of a
model judge's verdict (None for a function). :class:`ScoreStore` is the capability a store has
when it keeps scores; the scoring code (:mod:`we0nb.batch.score`) uses a store through it alone.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence, runtime_checkable

__all__ = ["ScoreRecord", "ScoreStore", "score_store"]


@dataclass(frozen=True)
class ScoreRecord:
    """One item's score by one scorer, as stored."""

    batch: str
    item: int
    scorer: str
    session_id: str
    value: float
    passed: Optional[bool] = None
    reason: str = ""
    judge_session_id: Optional[str] = None
    created: float = 0.0


@runtime_checkable
class ScoreStore(Protocol):
    """Scores of batch items: written once per (batch, item, scorer), read by batch."""

    @abc.abstractmethod
    async def write_scores(self, scores: Sequence[ScoreRecord]) -> None:
        """Write ``scores`` in one transaction; a score already stored for the same
        ``(batch, item, scorer)`` is replaced."""

    @abc.abstractmethod
    async def read_scores(self, batch: str, scorer: Optional[str] = None) -> list[ScoreRecord]:
        """The scores of ``batch`` (only ``scorer``'s when given), by item then scorer."""


def score_store(store: object) -> ScoreStore:
    """``store`` as a :class:`ScoreStore`, or NotImplementedError saying what to use instead."""
    if isinstance(store, ScoreStore):
        return store
    raise NotImplementedError(
        f"{type(store).__name__} does not keep scores; use MemoryPersistence or SqlPersistence "
        "(or implement the ScoreStore capability, we0nb.persistence.scores.ScoreStore)."
    )

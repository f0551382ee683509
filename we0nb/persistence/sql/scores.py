"""Scores on SQL (``we0_scores``): rows in and out, for the store and for the frames' reader."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..scores import ScoreRecord
from . import statements as q
from .driver import Driver, Params
from .tables import cut

__all__ = ["SqlScores", "score_row", "score_from_row", "read_scores"]


def score_row(s: ScoreRecord) -> Params:
    return {"batch": s.batch, "item": s.item, "scorer": s.scorer, "session_id": s.session_id, "value": s.value,
            "passed": s.passed, "reason": cut(s.reason) or "", "judge_session_id": s.judge_session_id,
            "created": s.created}


def score_from_row(row: Any) -> ScoreRecord:
    batch, item, scorer, sid, value, passed, reason, judge, created = row
    return ScoreRecord(batch=batch, item=int(item), scorer=scorer, session_id=sid, value=float(value),
                       passed=None if passed is None else bool(passed), reason=reason or "",
                       judge_session_id=judge, created=float(created))


class SqlScores:
    """The :class:`~we0nb.persistence.scores.ScoreStore` of one database, through its driver."""

    def __init__(self, db: Driver) -> None:
        self.db = db

    async def write_scores(self, scores: Sequence[ScoreRecord]) -> None:
        if scores:
            await self.db.transaction([(q.SCORE_UPSERT, [score_row(s) for s in scores])])

    async def read_scores(self, batch: str, scorer: Optional[str] = None) -> list[ScoreRecord]:
        if scorer is None:
            rows = await self.db.fetchall(q.SCORE_LIST, {"b": batch})
        else:
            rows = await self.db.fetchall(q.SCORE_LIST_BY, {"b": batch, "scorer": scorer})
        return [score_from_row(r) for r in rows]


def read_scores(conn: Any, batch: str) -> list[ScoreRecord]:
    """The scores of ``batch`` through a synchronous SQLAlchemy connection (none without the table)."""
    from sqlalchemy import inspect, select

    from . import tables as S

    if not inspect(conn).has_table(S.scores.name):
        return []
    T = S.scores
    rows = conn.execute(select(*[T.c[n] for n in q.SCORE_COLUMNS]).where(T.c.batch == batch)
                        .order_by(T.c.item, T.c.scorer))
    return [score_from_row(tuple(r)) for r in rows]

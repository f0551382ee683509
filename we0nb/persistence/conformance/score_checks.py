"""Checks of :class:`~we0nb.persistence.scores.ScoreStore`: scores written, replaced and read by batch."""

from __future__ import annotations

from ..._ids import new_id
from ..scores import ScoreRecord
from .harness import Check, Harness, check, equal

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
scores = check(CHECKS, "scores")


@scores
async def scores_round_trip_by_batch_item_and_scorer(h: Harness) -> None:
    """Scores read back as written, by item then scorer, only the batch's (and only a scorer's when
    asked); another store on the same data sees them (a second process)."""
    b, other = new_id("bat"), new_id("bat")
    rows = [ScoreRecord(b, 1, "exact", "ses_1", 1.0, True, "same", None, 2.0),
            ScoreRecord(b, 0, "judge", "ses_0", 0.0, False, "wrong \u00e9", "judge_x", 3.0),
            ScoreRecord(b, 0, "exact", "ses_0", 0.25, None, "", None, 4.0),
            ScoreRecord(other, 0, "exact", "ses_9", 1.0, True, "", None, 5.0)]
    await h.store.write_scores(rows)
    q = h.fresh()
    equal(await q.read_scores(b), [rows[2], rows[1], rows[0]], "a batch's scores, by item then scorer")
    equal(await q.read_scores(b, "exact"), [rows[2], rows[0]], "one scorer's scores")
    equal(await q.read_scores(new_id("bat")), [], "the scores of a batch without any")


@scores
async def a_score_written_again_replaces_the_first(h: Harness) -> None:
    b = new_id("bat")
    await h.store.write_scores([ScoreRecord(b, 0, "s", "ses_0", 0.0, False, "first", None, 1.0)])
    again = ScoreRecord(b, 0, "s", "ses_0", 1.0, True, "second", "judge_y", 2.0)
    await h.store.write_scores([again])
    equal(await h.fresh().read_scores(b), [again], "the score after it was written again")

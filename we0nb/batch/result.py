"""BatchResult: a batch's items as they are stored, and their DataFrame.

``batch.df`` (and :func:`we0nb.batch_df`) has one row per item: ``item`` (0-based),
``session_id``, ``status`` (categorical, every status of :data:`BATCH_STATUSES`),
``prompt``, ``text``, ``output`` (structured output as JSON), ``error``, ``steps``,
``tool_calls``, ``input_tokens``, ``output_tokens``, ``cost`` (USD, what its model calls
cost; NaN when one of them has no known price), ``attempts``, ``started``, ``finished``
(UTC datetimes) and ``duration`` (the time its runs took, summed).
pandas is imported only when a frame is asked for.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Optional

from .._text import readable_error
from ..models.pricing import format_cost
from ..persistence.batches import BATCH_STATUSES, BatchItem, ItemCost
from .prompts import prompt_text

__all__ = ["BatchResult", "items_frame", "prompt_text", "FRAME_COLUMNS"]

FRAME_COLUMNS = ("item", "session_id", "status", "prompt", "text", "output", "error", "steps", "tool_calls",
                 "input_tokens", "output_tokens", "cost", "attempts", "started", "finished", "duration")


@dataclass
class BatchResult:
    """What ``await agent.batch(...)`` returns: the batch's items when the call ended.

    ``stopped`` says why the call ended early: ``"aborted"`` (the abort event),
    ``"max_failures"``, ``"max_cost"`` (the budget was spent: no new item was started), or
    None (every item ended). Counts are by status over the whole batch (every worker's
    items), as stored when the call returned; ``costs`` what each item's model calls cost.
    """

    name: str
    items: list[BatchItem] = field(repr=False)
    stopped: Optional[str] = None
    costs: list[ItemCost] = field(default_factory=list, repr=False)
    #: the agent that ran it (its store keeps the scores; ``score`` needs it)
    agent: Any = field(default=None, repr=False, compare=False)

    @property
    def cost(self) -> Optional[float]:
        """What the batch's model calls cost so far, USD (None when one of them has no known price)."""
        total = 0.0
        for c in self.costs:
            if c.unpriced:
                return None
            total += c.priced
        return total

    @property
    def counts(self) -> dict[str, int]:
        """Items by status (only the statuses present)."""
        out: dict[str, int] = {}
        for it in self.items:
            out[it.status] = out.get(it.status, 0) + 1
        return {s: out[s] for s in BATCH_STATUSES if s in out}

    def __len__(self) -> int:
        return len(self.items)

    @property
    def done(self) -> bool:
        """Every item ended (none pending, running or aborted)."""
        return all(it.status not in ("pending", "running", "aborted") for it in self.items)

    @property
    def failed(self) -> list[BatchItem]:
        return [it for it in self.items if it.status == "failed"]

    @property
    def df(self) -> Any:
        """The items as a pandas DataFrame (see the module docstring)."""
        return items_frame(self.items, self.costs)

    async def score(self, scorers: Any, *, expected: Any = None, concurrency: int = 8, progress: bool = True) -> Any:
        """Score the finished items (``stop``, ``compact``) with ``scorers`` — functions of a case
        returning a bool, a float or a ``Score``, ``scorer(fn, name=...)``, ``judge(model, rubric)`` —
        ``concurrency`` at a time; a ``ScoreResult``. ``expected`` (a list, a Series or a DataFrame
        column, one value per item by position) is handed to the scorers as ``case.expected``.
        Scores are persisted; scoring again with the same scorer skips what is scored (see
        :mod:`we0nb.batch.score`, and ``scores_df`` / ``experiments_df``)."""
        from .score import score_batch

        return await score_batch(self, scorers, expected=expected, concurrency=concurrency, progress=progress)

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items())
        stopped = f", stopped={self.stopped!r}" if self.stopped else ""
        cost = f", cost={format_cost(self.cost)}" if self.costs else ""
        return f"BatchResult(name={self.name!r}, items={len(self.items)}, {counts}{cost}{stopped})"

    def _repr_html_(self) -> str:
        counts = "".join(f"<td>{html.escape(k)}</td><td><b>{v}</b></td>" for k, v in self.counts.items())
        stopped = f" — stopped: {html.escape(self.stopped)}" if self.stopped else ""
        if self.costs:
            stopped = f" — cost {html.escape(format_cost(self.cost))}{stopped}"
        errors = "".join(f"<li>item {it.item}: {html.escape(readable_error(it.error or '', 200))}</li>"
                         for it in self.failed[:5])
        more = f"<li>… {len(self.failed) - 5} more</li>" if len(self.failed) > 5 else ""
        return (f"<div class='we0-batch'><b>Batch {html.escape(self.name)}</b>: {len(self.items)} items{stopped}"
                f"<table><tr>{counts}</tr></table>{'<ul>' + errors + more + '</ul>' if errors else ''}</div>")


def items_frame(items: list[BatchItem], costs: Optional[list[ItemCost]] = None) -> Any:
    """One row per item, typed (categorical status, UTC datetimes, timedelta durations); ``costs``
    (by item) give the ``cost`` column (NaN when unknown, or when not given)."""
    import pandas as pd

    by_item = {c.item: c.cost for c in costs or ()}
    cost = [by_item.get(it.item, 0.0 if costs is not None else None) for it in items]

    def times(values: list[Optional[float]]) -> Any:
        return pd.to_datetime(pd.Series(values, dtype="float64"), unit="s", utc=True).astype("datetime64[us, UTC]")

    df = pd.DataFrame({
        "item": pd.Series([it.item for it in items], dtype="int64"),
        "session_id": pd.Series([it.session_id for it in items], dtype="string"),
        "status": pd.Categorical([it.status for it in items], categories=list(BATCH_STATUSES)),
        "prompt": pd.Series([prompt_text(it.prompt) for it in items], dtype="string"),
        "text": pd.Series([it.text for it in items], dtype="string"),
        "output": pd.Series([it.output for it in items], dtype="string"),
        "error": pd.Series([it.error for it in items], dtype="string"),
        "steps": pd.Series([it.steps for it in items], dtype="Int64"),
        "tool_calls": pd.Series([it.tool_calls for it in items], dtype="Int64"),
        "input_tokens": pd.Series([it.input_tokens for it in items], dtype="Int64"),
        "output_tokens": pd.Series([it.output_tokens for it in items], dtype="Int64"),
        "cost": pd.Series([float("nan") if c is None else c for c in cost], dtype="float64"),
        "attempts": pd.Series([it.attempts for it in items], dtype="Int64"),
        "started": times([it.started for it in items]),
        "finished": times([it.finished for it in items]),
        "duration": pd.to_timedelta(pd.Series([it.duration for it in items], dtype="float64"), unit="s"),
    })
    return df[list(FRAME_COLUMNS)]

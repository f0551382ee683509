"""Scores as DataFrames: ``scores_df`` (one row per item and scorer), ``experiments_df`` (one
row per batch and scorer, with a 95% bootstrap interval of the mean) and ``plot_experiments``.

They read what the other frames read (an agent, a persistence, a SQLAlchemy Engine, a URL): a
SQL database straight from SQL (``we0_scores``, and the batch tables), any other store through
its port. Two prompts or two models run as two batches on the same items compare as rows.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, cast

import numpy as np
import pandas as pd

from ..batch.score import scores_frame
from ..persistence.scores import ScoreRecord
from .batch_frames import _infos, _items, _read
from .plots import _new_axes, _themed

__all__ = ["scores_df", "experiments_df", "plot_experiments", "EXPERIMENT_COLUMNS", "bootstrap_ci"]

EXPERIMENT_COLUMNS = ("batch", "scorer", "n", "mean", "pass_rate", "ci_low", "ci_high", "cost", "duration")
#: resamples of the bootstrap interval (fixed seed: the same scores give the same interval)
RESAMPLES = 2000


def _scores(p: Any, name: str) -> list[ScoreRecord]:
    from ..persistence.scores import score_store

    return _read(p, lambda store: score_store(store).read_scores(name), lambda reader: reader.scores(name))


def scores_df(source: Any, batch: str) -> pd.DataFrame:
    """One row per item and scorer of batch ``batch``: ``item``, ``session_id``, ``scorer``,
    ``value``, ``passed`` (nullable boolean), ``reason``, ``judge_session_id``. ValueError when the
    store has no such batch."""
    if not isinstance(batch, str):
        raise TypeError(f"scores_df(source, batch=...): expected a batch name, got {type(batch).__name__}.")
    got = _scores(source, batch)
    if not got:
        known = [i.name for i in _infos(source)]
        if batch not in known:
            _items(source, batch)  # (ValueError naming the known batches)
    return scores_frame(got)


def bootstrap_ci(values: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of ``values`` (NaN, NaN for none)."""
    v = np.asarray(values, dtype="float64")
    if v.size == 0:
        return float("nan"), float("nan")
    if np.all(v == v[0]):
        return float(v[0]), float(v[0])
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def experiments_df(source: Any, names: Any) -> pd.DataFrame:
    """One row per batch and scorer: ``batch``, ``scorer``, ``n`` (items scored), ``mean`` of the
    values, ``pass_rate`` (share passed among scores that say; NaN when none does), ``ci_low`` /
    ``ci_high`` (a 95% bootstrap interval of the mean), and the batch's ``cost`` (USD, NaN when a
    call's price is unknown) and ``duration`` (its items' run time, summed). Batches in the order
    of ``names``, scorers by name."""
    from .batch_frames import batch_df

    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError("experiments_df(source, names): names must be a non-empty list of batch names.")
    rows: list[dict[str, Any]] = []
    for name in names:
        items = batch_df(source, name)  # (ValueError: no such batch)
        cost = float(cast(Any, items["cost"].sum(skipna=False))) if len(items) else 0.0  # (a scalar; stubs: Series too)
        duration = items["duration"].sum()
        scored = scores_frame(_scores(source, name))
        for scorer in sorted(set(scored["scorer"].astype(str))):
            s = scored[scored["scorer"] == scorer]
            values = s["value"].to_numpy(dtype="float64")
            passed = s["passed"].dropna()
            lo, hi = bootstrap_ci(values)
            rows.append({"batch": name, "scorer": scorer, "n": len(s), "mean": float(values.mean()),
                         "pass_rate": float(passed.astype(float).mean()) if len(passed) else float("nan"),
                         "ci_low": lo, "ci_high": hi, "cost": cost, "duration": duration})
    df = pd.DataFrame(rows, columns=list(EXPERIMENT_COLUMNS))
    return df.astype({"batch": "string", "scorer": "string", "n": "int64", "mean": "float64",
                      "pass_rate": "float64", "ci_low": "float64", "ci_high": "float64", "cost": "float64",
                      "duration": "timedelta64[ns]"})


@_themed
def plot_experiments(source: Any, names: Optional[Any] = None, *, ax: Any = None) -> Any:
    """Means with their 95% intervals, per scorer (one panel each) and batch (one bar each).

    ``source``: an ``experiments_df`` frame, or what it reads (then ``names`` are the batches).
    Returns the matplotlib Figure."""
    df = source if isinstance(source, pd.DataFrame) else experiments_df(source, names)
    if df.empty:
        raise ValueError("plot_experiments: no scores to plot; score the batches first (await batch.score([...])).")
    scorers = list(dict.fromkeys(df["scorer"]))
    if ax is None:
        fig, axes = _new_axes(len(scorers), figsize=(3.2 * len(scorers) + 1.0, 3.2))
    else:
        axes = list(np.atleast_1d(ax))
        if len(axes) < len(scorers):
            raise ValueError(f"plot_experiments(ax=...): {len(scorers)} scorers need {len(scorers)} axes.")
        fig = axes[0].figure
    palette = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"]
    for a, scorer in zip(axes, scorers):
        s = cast(pd.DataFrame, df[df["scorer"] == scorer])  # (a boolean mask selects rows: a frame)
        x = np.arange(len(s))
        means = s["mean"].to_numpy(dtype="float64")
        err = np.vstack([means - s["ci_low"].to_numpy(dtype="float64"), s["ci_high"].to_numpy(dtype="float64") - means])
        a.bar(x, means, color=[palette[i % len(palette)] for i in range(len(s))], alpha=0.85)
        a.errorbar(x, means, yerr=np.clip(err, 0, None), fmt="none", ecolor="#808080", capsize=4)
        a.set_xticks(x, [str(b) for b in s["batch"]], rotation=20, ha="right")
        a.set_title(str(scorer))
        a.set_ylabel("mean (95% CI)")
        a.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig

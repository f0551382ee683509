"""Plots of persisted transcripts (matplotlib): a session timeline and tool latency/failures.

Both functions return the matplotlib ``Figure``. It is closed in pyplot's registry, so a
notebook shows it exactly once — as the cell's value (``plot_tools(agent)`` on the last
line) — and a script can ``fig.savefig(...)`` it. Pass ``ax=`` to draw into your own axes.
They read the data through :mod:`we0nb.notebook.frames`, so they accept everything the
frames accept (a persistence, an agent, an Engine, a URL).
"""

from __future__ import annotations

from typing import Any, Optional, cast

import numpy as np
import pandas as pd

from .._call_facts import COMPLETED_ON_RESUME, MAY_HAVE_RUN, NEVER_STARTED
from .frames import SessionIds, TimeLike, messages_df, tool_calls_df

__all__ = ["plot_timeline", "plot_tools", "STEP_COLORS", "TOOL_COLORS", "APPROVAL_COLOR", "DENIED_COLOR", "tool_outcome", "THEME",
           "INK"]

#: colours by status (colour-blind-safe Okabe–Ito palette)
TOOL_COLORS = {
    "completed": "#009E73",
    "error": "#D55E00",
    "interrupted": "#E69F00",
    "running": "#0072B2",
    "pending": "#999999",
}
STEP_COLORS = {
    "completed": "#56B4E9",
    "error": "#D55E00",
    "recovered": "#CC79A7",
    "unfinished": "#999999",
}
#: the wait for a person's decision on a call that needed approval
APPROVAL_COLOR = "#F0E442"
OUTCOMES = ("completed", "reconciled", "error", "denied", "in_doubt", "interrupted", "unfinished")
#: a call a person denied: it never ran and did not fail (reddish purple, apart from error's vermilion)
DENIED_COLOR = "#CC79A7"
_OUTCOME_COLORS = {"completed": TOOL_COLORS["completed"], "reconciled": "#56B4E9", "error": TOOL_COLORS["error"],
                   "denied": DENIED_COLOR, "in_doubt": "#882255", "interrupted": TOOL_COLORS["interrupted"],
                   "unfinished": TOOL_COLORS["pending"]}


#: text, axes, edges and grid on a transparent background: mid-grey reads at about 4:1 on both
#: JupyterLab's light (white) and dark (#111111–#212121) backgrounds, so a plot follows either theme
INK = "#808080"
THEME = {
    "figure.facecolor": (0.0, 0.0, 0.0, 0.0), "axes.facecolor": (0.0, 0.0, 0.0, 0.0),
    "savefig.facecolor": (0.0, 0.0, 0.0, 0.0), "savefig.edgecolor": (0.0, 0.0, 0.0, 0.0),
    "text.color": INK, "axes.labelcolor": INK, "axes.titlecolor": INK, "axes.edgecolor": INK,
    "xtick.color": INK, "ytick.color": INK, "grid.color": INK, "legend.labelcolor": INK,
}


def _themed(fn: Any) -> Any:
    """Draw under :data:`THEME` (``theme="both"``, the default), or the current matplotlib style (``theme=None``)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, theme: Optional[str] = "both", **kwargs: Any) -> Any:
        if theme is None:
            return fn(*args, **kwargs)
        if theme != "both":
            raise ValueError(f"{fn.__name__}(theme=...): expected 'both' (readable on light and dark) or None "
                             f"(your matplotlib style), got {theme!r}.")
        import matplotlib

        with matplotlib.rc_context(cast(Any, THEME)):
            return fn(*args, **kwargs)

    return wrapper


def _new_axes(ncols: int = 1, figsize: Optional[tuple[float, float]] = None):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
    plt.close(fig)  # shown once, as the value it is returned as (not again by the inline backend)
    return fig, list(axes[0])


def tool_outcome(calls: pd.DataFrame) -> pd.Series:
    """Each tool call's outcome: ``completed``, ``reconciled`` (completed on resume by its tool's
    reconcile), ``error`` (failed), ``denied`` (a person said no: it never ran, and counts as no
    failure), ``in_doubt`` (interrupted while running: it may have run), ``interrupted`` (any
    other interrupt) or ``unfinished``."""
    out = pd.Series("unfinished", index=calls.index, dtype=object)
    out[calls["status"] == "completed"] = "completed"
    if "reconciled" in calls:
        out[calls["reconciled"] & (calls["status"] == "completed")] = "reconciled"
    out[(calls["status"] == "error") & ~calls["interrupted"]] = "error"
    if "approval" in calls:
        out[calls["approval"] == "denied"] = "denied"
    out[calls["interrupted"]] = "interrupted"
    if "in_doubt" in calls:
        out[calls["interrupted"] & calls["in_doubt"].fillna(False).astype(bool)] = "in_doubt"
    return pd.Series(pd.Categorical(out, categories=list(OUTCOMES)), index=calls.index, name="outcome")


def _legend_label(outcome: str, calls: pd.DataFrame) -> str:
    """An outcome as the legend names it, in the words people read everywhere
    (:func:`we0nb.messages.effect_label`): "interrupted" says "never started" only when every such
    call's stored ``in_doubt`` says so."""
    if outcome == "reconciled":
        return COMPLETED_ON_RESUME
    if outcome == "in_doubt":
        return f"interrupted: {MAY_HAVE_RUN}"
    if outcome == "interrupted" and "in_doubt" in calls:
        cut = calls.loc[calls["interrupted"], "in_doubt"]
        cut = cut[cut.ne(True).fillna(True).astype(bool)]  # (the in doubt ones have their own bar)
        if len(cut) and cut.notna().all():
            return f"interrupted: {NEVER_STARTED}"
    return outcome


def _step_status(msg: pd.Series) -> str:
    if pd.isna(msg["completed"]):
        return "unfinished"
    reason = msg["error_reason"]
    if pd.isna(reason):
        return "completed"
    return "recovered" if reason == "UnfinishedAssistantMessage" else "error"


def _call_status(call: pd.Series) -> str:
    if call["interrupted"]:
        return "interrupted"
    return str(call["status"])


class _Clock:
    """Seconds since the session's first message; the end of the plot for what never ended
    (now, while a call awaits a decision: the wait goes on)."""

    def __init__(self, msgs: pd.DataFrame, calls: pd.DataFrame):
        self.t0 = msgs["created"].min()
        times = pd.concat([msgs["created"], msgs["completed"], calls["start"], calls["end"],
                           calls["decided"]]).dropna()
        last = times.max()
        if bool((calls["approval"] == "requested").any()):
            last = max(last, pd.Timestamp.now(tz="UTC"))
        self.end = (last - self.t0).total_seconds()
        self.min_width = max(self.end, 1e-3) * 0.004   # the thinnest bar that still shows

    def __call__(self, ts: Any) -> float:
        return float("nan") if pd.isna(ts) else (ts - self.t0).total_seconds()


def _step_bar(ax: Any, lane: int, m: pd.Series, clock: _Clock) -> float:
    """One step (model call) as a bar; returns its start."""
    status = _step_status(m)
    left = clock(m["created"])
    right = clock(m["completed"]) if status != "unfinished" else clock.end
    ax.barh(lane, max(right - left, clock.min_width), left=left, height=0.7, color=STEP_COLORS[status],
            edgecolor=INK, linewidth=0.4, hatch="//" if status == "unfinished" else None, label=f"step {status}")
    return left


def _wait_bar(ax: Any, lane: int, c: pd.Series, step_end: float, clock: _Clock) -> float:
    """The wait for a person's decision: from the end of the step that asked (the run stopped
    there) to the decision, or to the end of the plot (hatched) while it awaits. Returns its end."""
    awaiting = pd.isna(c["decided"])
    end = clock.end if awaiting else clock(c["decided"])
    ax.barh(lane, max(end - step_end, clock.min_width), left=step_end, height=0.5, color=APPROVAL_COLOR,
            edgecolor=INK, linewidth=0.4, hatch="xx" if awaiting else None, label="approval wait")
    return end


def _call_bar(ax: Any, lane: int, c: pd.Series, step_start: float, clock: _Clock) -> None:
    """One tool call: unfinished runs to the end (hatched), never started is a thin bar, recalled is dotted."""
    status = _call_status(c)
    start, end = clock(c["start"]), clock(c["end"])
    unfinished = status in ("pending", "running")
    if np.isnan(start):
        start = end if not np.isnan(end) else step_start
    if np.isnan(end):
        end = clock.end if unfinished else start
    hatch = "//" if unfinished else (".." if c["recalled"] else None)
    ax.barh(lane, max(end - start, clock.min_width), left=start, height=0.5, color=TOOL_COLORS[status],
            edgecolor=INK, linewidth=0.4, hatch=hatch, label=f"tool {status}")


def _timeline_lanes(ax: Any, msgs: pd.DataFrame, calls: pd.DataFrame, clock: _Clock) -> list[str]:
    """Draw every step and its calls, one lane each; user messages as dashed lines. The lane labels."""
    labels: list[str] = []
    by_msg = {mid: g for mid, g in calls.groupby("message_id", sort=False, observed=True)}
    for _, m in msgs.iterrows():
        if m["role"] == "user":
            ax.axvline(clock(m["created"]), color=INK, linestyle="--", linewidth=0.8, zorder=0)
            continue
        step_start = _step_bar(ax, len(labels), m, clock)
        step_end = step_start if pd.isna(m["completed"]) else clock(m["completed"])
        labels.append(f"step {sum(1 for x in labels if x.startswith('step')) + 1}")
        for _, c in by_msg.get(m["message_id"], pd.DataFrame()).iterrows():
            lane_start, approval = step_start, None if pd.isna(c["approval"]) else c["approval"]
            if approval is not None:
                lane_start = _wait_bar(ax, len(labels), c, step_end, clock)
            if not (approval == "requested" and c["status"] == "pending"):  # awaiting: only the wait
                _call_bar(ax, len(labels), c, lane_start, clock)
            labels.append(f"  {c['tool']}")
    return labels


def _timeline_frame(ax: Any, labels: list[str], title: str) -> None:
    from matplotlib.patches import Patch

    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel("seconds since the first message")
    ax.set_title(title)
    handles = [Patch(facecolor=c, edgecolor=INK, label=f"step {k}") for k, c in STEP_COLORS.items()]
    handles += [Patch(facecolor=c, edgecolor=INK, label=f"tool {k}") for k, c in TOOL_COLORS.items()]
    handles.append(Patch(facecolor=APPROVAL_COLOR, edgecolor=INK, label="approval wait"))
    drawn = {c.get_label() for c in ax.containers}  # the legend names only what the plot shows
    handles = [h for h in handles if h.get_label() in drawn]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    ax.grid(axis="x", alpha=0.3)


@_themed
def plot_timeline(p: Any, session_id: str, *, ax: Any = None, title: Optional[str] = None) -> Any:
    """The steps and tool calls of one session as bars over time, coloured by status.

    One lane per step (model call: created → completed; an unfinished step runs to the
    end of the plot, hatched) followed by one lane per tool call of that step (start →
    end; a call that never started is a thin bar at the time it ended, an unfinished one
    runs to the end, hatched; recalled calls are dotted). A call that needed a person's
    approval first shows the wait for the decision (yellow: from the end of the step that
    asked to the decision; while it still awaits, hatched, to now). User messages are dashed
    vertical lines. The x axis is seconds since the session's first message.
    ``theme="both"`` (default) draws mid-grey on a transparent background, readable on
    light and dark notebook themes; ``theme=None`` keeps your matplotlib style.
    Returns the Figure.
    """
    if not isinstance(session_id, str):
        raise TypeError("plot_timeline(p, session_id): session_id must be one session id (a string).")
    msgs = messages_df(p, session_id)
    if msgs.empty:
        raise ValueError(f"Session {session_id!r} has no messages to plot.")
    calls = tool_calls_df(p, session_id)
    if ax is None:
        n_lanes = int(cast(Any, (msgs["role"] == "assistant").sum())) + len(calls)
        fig, (ax,) = _new_axes(1, figsize=(10, max(2.0, 0.32 * n_lanes + 1.2)))
    else:
        fig = ax.figure
    labels = _timeline_lanes(ax, msgs, calls, _Clock(msgs, calls))
    _timeline_frame(ax, labels, title if title is not None else f"session {session_id}")
    fig.tight_layout()
    return fig


@_themed
def plot_tools(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None,
               axes: Any = None) -> Any:
    """Tool latency and failures across sessions: two charts, one bar row per tool.

    Left: latency per tool — the median duration of its finished calls, with a whisker to
    the 90th percentile (seconds). Right: the calls of each tool stacked by outcome
    (completed, error, denied, interrupted, unfinished), labelled with the failure rate
    (errors + interrupts over all calls; a denied call is a person's decision, not a failure). ``axes`` = two matplotlib axes to draw into.
    ``theme`` as for :func:`plot_timeline`. Returns the Figure.
    """
    calls = tool_calls_df(p, session_id, since=since, until=until)
    if axes is None:
        n_tools = max(1, int(cast(Any, calls["tool"].nunique())))
        fig, axes = _new_axes(2, figsize=(11, max(2.0, 0.45 * n_tools + 1.3)))
    else:
        axes = list(axes)
        if len(axes) != 2:
            raise ValueError("plot_tools(axes=...): expected two axes (latency, outcomes).")
        fig = axes[0].figure
    lat_ax, out_ax = axes
    if calls.empty:
        for a in axes:
            a.text(0.5, 0.5, "no tool calls", ha="center", va="center", transform=a.transAxes)
            a.set_axis_off()
        return fig
    tools = sorted(calls["tool"].dropna().unique().tolist())
    y = np.arange(len(tools))
    secs = calls["duration"].dt.total_seconds()
    med = secs.groupby(calls["tool"], observed=True).median().reindex(tools)
    p90 = secs.groupby(calls["tool"], observed=True).quantile(0.9).reindex(tools)
    med_v = med.fillna(0.0).to_numpy(dtype=float)
    whisker = np.clip((p90 - med).fillna(0.0).to_numpy(dtype=float), 0.0, None)
    lat_ax.barh(y, med_v, xerr=[np.zeros_like(whisker), whisker], color="#56B4E9", edgecolor=INK,
                linewidth=0.4, capsize=3)
    lat_ax.set_yticks(y, tools)
    lat_ax.invert_yaxis()
    lat_ax.set_xlabel("duration, s (median; whisker: 90th percentile)")
    lat_ax.set_title("tool latency")
    lat_ax.grid(axis="x", alpha=0.3)

    outcome = tool_outcome(calls)
    counts = pd.crosstab(calls["tool"].astype(object), outcome).reindex(index=tools, columns=list(OUTCOMES),
                                                                        fill_value=0)
    left = np.zeros(len(tools))
    for name in OUTCOMES:
        vals = counts[name].to_numpy(dtype=float)
        out_ax.barh(y, vals, left=left, color=_OUTCOME_COLORS[name], edgecolor=INK, linewidth=0.4,
                    label=_legend_label(name, calls))
        left += vals
    total = counts.sum(axis=1).to_numpy(dtype=float)
    failed = (counts["error"] + counts["interrupted"] + counts["in_doubt"]).to_numpy(dtype=float)
    for yi, (tot, bad) in enumerate(zip(total, failed)):
        out_ax.text(tot, yi, f"  {bad / tot:.0%} failed" if tot else "", va="center", fontsize="small")
    out_ax.set_yticks(y, tools)
    out_ax.invert_yaxis()
    out_ax.set_xlabel("calls")
    out_ax.set_title("tool calls by outcome")
    out_ax.set_xlim(0, max(1.0, float(total.max())) * 1.25)
    out_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    return fig

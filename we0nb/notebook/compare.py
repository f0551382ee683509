"""Sessions side by side: ``compare_df`` (one row per session and model step) and ``compare``.

Built from the other frames (:func:`~we0nb.messages_df` and :func:`~we0nb.parts_df`), so it reads
any source they read (an agent, a persistence, a database URL) and, on SQL, straight from SQL.
A step is one model call: an assistant message, numbered from 1 within its session.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, cast

import pandas as pd

from .frames import messages_df, parts_df
from .html import esc

__all__ = ["compare_df", "compare", "Comparison", "COMPARE_COLUMNS"]

COMPARE_COLUMNS = ("session_id", "step", "text", "tool_calls", "input_tokens", "output_tokens", "duration", "cost",
                   "model_id", "message_id")


def _ids(session_ids: Any) -> list[str]:
    if isinstance(session_ids, str):
        return [session_ids]
    if isinstance(session_ids, (bytes, dict)) or not isinstance(session_ids, Sequence) and not hasattr(
            session_ids, "__iter__"):
        raise TypeError(f"compare: session_ids must be a list of session ids, got {type(session_ids).__name__}.")
    ids = list(session_ids)
    if not ids or not all(isinstance(s, str) for s in ids):
        raise ValueError("compare: session_ids must be a non-empty list of session ids (strings).")
    return ids


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    """One column by its name (a Series; the stubs say it may be a DataFrame)."""
    return cast(pd.Series, frame[name])


def compare_df(source: Any, session_ids: Any) -> pd.DataFrame:
    """One row per session and step (model call): ``session_id``, ``step`` (from 1), ``text``,
    ``tool_calls`` (the called tools' names, in order), ``input_tokens``, ``output_tokens``,
    ``duration``, ``cost`` (USD, NaN when unknown), then ``model_id`` and ``message_id``.

    Rows are grouped by session in the order of ``session_ids``, steps in order. A session
    that does not exist raises ValueError."""
    ids = _ids(session_ids)
    msgs = messages_df(source, ids)
    known = set(msgs["session_id"])
    missing = [s for s in ids if s not in known]
    if missing:
        from .frames import sessions_df

        there = set(sessions_df(source, missing)["session_id"])
        gone = [s for s in missing if s not in there]
        if gone:
            raise ValueError(f"compare: session {gone[0]!r} is not in this store; pass ids from sessions_df(source).")
    assistant = cast(pd.DataFrame, msgs[msgs["role"] == "assistant"])  # (a boolean mask selects rows: a frame)
    steps = assistant.sort_values(["session_id", "message_id"])
    parts = parts_df(source, ids)
    parts = parts.sort_values(["message_id", "part_id"])
    # (one column aggregated per group is a Series; the stubs allow a DataFrame too)
    texts = cast(pd.Series, parts[parts["type"] == "text"].groupby("message_id", observed=True)["text"].agg(
        lambda s: "".join(x for x in s if isinstance(x, str))))
    tools = cast(pd.Series, parts[parts["type"] == "tool"].groupby("message_id", observed=True)["tool"].agg(
        lambda s: [str(x) for x in s]))
    called: dict[Any, list[str]] = tools.to_dict()
    rank = {s: i for i, s in enumerate(ids)}
    steps = steps.assign(_rank=_col(steps, "session_id").map(rank)).sort_values(["_rank", "message_id"], kind="stable")
    out = pd.DataFrame({
        "session_id": steps["session_id"].astype("string"),
        "step": steps.groupby("session_id", observed=True).cumcount().add(1).astype("int64"),
        "text": _col(steps, "message_id").map(texts).fillna("").astype("string"),
        "tool_calls": [list(called.get(m, [])) for m in steps["message_id"]],
        "input_tokens": steps["input_tokens"],
        "output_tokens": steps["output_tokens"],
        "duration": steps["duration"],
        "cost": steps["cost"].astype("float64"),
        "model_id": steps["model_id"],
        "message_id": steps["message_id"],
    })
    return out.reset_index(drop=True)


class Comparison:
    """Two or more sessions side by side (one column each, one row per step); a cell that differs
    from the first session's same step is highlighted. Every text is escaped."""

    def __init__(self, frame: pd.DataFrame, session_ids: list[str], calls: Optional[dict[str, list[str]]] = None):
        self.df = frame
        self.session_ids = session_ids
        #: message id → its calls as ``tool(input JSON)``, in order (compared and shown)
        self.calls = calls or {}

    def _cells(self) -> tuple[int, dict[tuple[str, int], Any]]:
        rows: Iterable[Any] = self.df.itertuples(index=False)  # (named tuples: one attribute per column)
        cells = {(r.session_id, int(r.step)): r for r in rows}
        steps = int(cast(Any, self.df["step"].max())) if len(self.df) else 0  # (a scalar: the stubs say Series too)
        return steps, cells

    def _key(self, r: Any) -> tuple[Any, ...]:
        return (r.text, tuple(self._calls(r)))

    def _calls(self, r: Any) -> list[str]:
        return self.calls.get(r.message_id) or list(r.tool_calls)

    def _repr_html_(self) -> str:
        steps, cells = self._cells()
        head = "".join(f"<th>{esc(s)}</th>" for s in self.session_ids)
        rows = []
        for k in range(1, steps + 1):
            first = cells.get((self.session_ids[0], k))
            tds = []
            for s in self.session_ids:
                r = cells.get((s, k))
                if r is None:
                    tds.append('<td class="we0-cmp-none">—</td>')
                    continue
                differs = first is None or self._key(r) != self._key(first)
                style = ' style="background:#fff3c4"' if differs and s != self.session_ids[0] else ""
                tools = ", ".join(self._calls(r))
                cost = "" if pd.isna(r.cost) else f" · ${r.cost:.6f}"
                tok = f"{_num(r.input_tokens)} in / {_num(r.output_tokens)} out"
                tds.append(f'<td{style} class="we0-cmp{" we0-cmp-diff" if style else ""}">'
                           f'<div style="white-space:pre-wrap">{esc(str(r.text))}</div>'
                           + (f"<div><code>{esc(tools)}</code></div>" if tools else "")
                           + f'<div style="color:#666;font-size:85%">{esc(tok + cost)}</div></td>')
            rows.append(f"<tr><th>step {k}</th>{''.join(tds)}</tr>")
        return (f'<table class="we0-compare" style="vertical-align:top"><thead><tr><th></th>{head}</tr></thead>'
                f"<tbody>{''.join(rows)}</tbody></table>")

    def __repr__(self) -> str:
        steps, cells = self._cells()
        lines = [f"Comparison of {len(self.session_ids)} sessions ({steps} steps at most)"]
        for k in range(1, steps + 1):
            first = cells.get((self.session_ids[0], k))
            for s in self.session_ids:
                r = cells.get((s, k))
                if r is None:
                    continue
                mark = "*" if first is not None and s != self.session_ids[0] and self._key(r) != self._key(first) else " "
                calls = self._calls(r)
                tools = f" [{', '.join(calls)}]" if calls else ""
                lines.append(f"{mark} step {k} {s}: {_short(str(r.text))}{tools}")
        return "\n".join(lines)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/html": self._repr_html_(), "text/plain": repr(self)}


def _num(v: Any) -> str:
    return "?" if pd.isna(v) else str(int(v))


def _short(s: str, n: int = 60) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def compare(source: Any, session_ids: Any) -> Comparison:
    """Show sessions side by side in a notebook: text, tool calls (with their arguments), tokens and
    cost per step, the cells that differ from the first session highlighted (the data: ``.df``,
    :func:`compare_df`)."""
    ids = _ids(session_ids)
    frame = compare_df(source, ids)
    calls: dict[str, list[str]] = {}
    if _col(frame, "tool_calls").map(len).any():
        from .frames import tool_calls_df

        tc = tool_calls_df(source, ids).sort_values(["message_id", "part_id"])
        for mid, tool, inp in zip(tc["message_id"], tc["tool"], tc["input"]):
            calls.setdefault(str(mid), []).append(f"{tool}({inp})")
    return Comparison(frame, ids, calls)

"""Persisted transcripts as pandas DataFrames.

``sessions_df``, ``messages_df``, ``parts_df`` and ``tool_calls_df`` turn what a
persistence holds into one row per entity; ``session_summary`` aggregates them per
session and ``expand_json`` opens a JSON column into columns.

Every view takes ``p``: a :class:`~we0nb.MemoryPersistence`, a
:class:`~we0nb.SqlPersistence`, a :class:`~we0nb.We0Agent` (its ``.persistence``), a
SQLAlchemy ``Engine`` or ``AsyncEngine``, or a database URL string. The views are plain
synchronous calls, on purpose: they work in any notebook cell, also while the kernel's
event loop is running, and they return when the frame is built (a cell waits for them
as for any computation; nothing runs in the background).

* SQL databases: each view is **one** SQL query, read in bulk by
  :mod:`we0nb.persistence.sql.columns` (no message/part object, dict or Python loop per
  row), chunk by chunk into Arrow/NumPy arrays. A URL or Engine must name a database with
  the we0nb tables (``ValueError`` otherwise); a URL naming a SQLite file that does not
  exist is refused, never created. Every database error is a
  :class:`~we0nb.PersistenceError` worded as SqlPersistence words it.
* Any other persistence (MemoryPersistence): its public async port
  (``list_sessions``/``load_transcript``), run on a worker thread when a loop is running;
  the flattened columns come from the same functions SqlPersistence writes them with.

Both routes go through the same typing step (:mod:`.frame_types`), so the same history
gives the same frame (columns, dtypes, values — text holding NUL characters included)
whatever the backend.

**Corrupt rows**: a row whose JSON document does not parse does not break the frame. Its
row is kept (its flat columns — ids, type, tool, status, times, flags — are valid), the
values only the document holds (text, tool input/output/error/metadata) are NA (a tool call's
``attempts`` 0, ``reconciled`` False, its key derived from its ids), and a
``RuntimeWarning`` names it (session, message, part ids, table and why), as
:class:`~we0nb.CorruptRecordError` does for a transcript.

Conventions: stable id columns (``session_id``, ``message_id``, ``part_id``) in every
frame so they join; a 1-based ``order`` (messages within their session, parts within
their message, tool calls within their session); tz-aware UTC datetimes
(``datetime64[us, UTC]``); durations as ``timedelta64[us]``; categoricals for role, part
type, status, tool, interrupt reason, outcome and approval; nullable ``Int64`` for tokens; the
``string`` dtype for text; nested JSON (tool input, metadata) as compact JSON strings (as
pydantic writes them, non-ASCII kept). Rows are sorted by session id (code-point order),
then history order (ids sort in creation order).

``since``/``until`` select by creation time: sessions by their own ``created``, messages
by theirs, parts and tool calls by the ``created`` time of the message they belong to.
``since`` is inclusive, ``until`` exclusive, compared in whole microseconds as the frames
show times (a time read off a frame selects its own row); both accept a
datetime/Timestamp (naive means UTC), an ISO string, or epoch seconds.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import warnings
from typing import Any, Callable, Iterable, Optional, Union, cast

import numpy as np
import pandas as pd

from ..persistence.columns import ColumnReader, ColumnReads
from ..persistence.memory import MemoryPersistence
from ..persistence.memory_columns import TranscriptColumns
from ..persistence.sql.columns import CorruptRow, open_reader, persistence_of
from .frame_types import (
    APPROVALS, MESSAGE_COLUMNS, PART_COLUMNS, SESSION_COLUMNS, STATUSES, TD_DTYPE, TIME_DTYPE, TOOL_CALL_COLUMNS, build, convert,
)

__all__ = [
    "sessions_df",
    "messages_df",
    "parts_df",
    "tool_calls_df",
    "session_summary",
    "expand_json",
    "SESSION_COLUMNS",
    "MESSAGE_COLUMNS",
    "PART_COLUMNS",
    "TOOL_CALL_COLUMNS",
    "SUMMARY_COLUMNS",
]

SessionIds = Union[None, str, Iterable[str]]
TimeLike = Union[None, str, float, int, _dt.datetime, pd.Timestamp]


# --------------------------------------------------------------------------- arguments


def _session_ids(session_id: SessionIds) -> Optional[list[str]]:
    if session_id is None:
        return None
    if isinstance(session_id, str):
        return [session_id]
    if isinstance(session_id, bytes):
        raise TypeError("session_id: expected a string or a list of strings, got bytes.")
    try:
        ids = list(session_id)
    except TypeError:
        raise TypeError(f"session_id: expected a string or a list of strings, got {type(session_id).__name__}.") from None
    for s in ids:
        if not isinstance(s, str):
            raise TypeError(f"session_id: expected strings, got {type(s).__name__} ({s!r}).")
    return list(dict.fromkeys(ids))


def _us(seconds: float) -> int:
    """Epoch seconds → whole microseconds, rounding half up: how every frame shows a time."""
    return math.floor(seconds * 1e6 + 0.5)


#: the farthest time bound sent to a store, in epoch microseconds (both ways)
_FAR = 2 ** 62


def _bound(value: TimeLike, name: str) -> Optional[int]:
    """A time bound as epoch microseconds (naive datetimes and strings are taken as UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a datetime, an ISO string or epoch seconds, got a bool.")
    if isinstance(value, (int, float, np.integer, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}: {value!r} is not a time.")
        # (past ±2**62 µs, ~146,000 years, every store gives the same answer as at the limit: the
        # SQL stores' 64-bit integers could not take the value itself)
        return max(-_FAR, min(_FAR, _us(float(value))))
    if isinstance(value, (str, _dt.datetime, _dt.date, pd.Timestamp, np.datetime64)):
        try:
            ts = pd.Timestamp(value)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{name}: cannot read {value!r} as a time ({e}).") from None
        if ts is pd.NaT:
            raise ValueError(f"{name}: {value!r} is not a time.")
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        return (ts.as_unit("ns").value + 500) // 1000
    raise TypeError(f"{name}: expected a datetime, an ISO string or epoch seconds, got {type(value).__name__}.")


# --------------------------------------------------------------------------- stores without SQL


def _load(p: Any, ids: Optional[list[str]]) -> tuple[list, dict]:
    """Sessions (sorted by id) and their transcripts, through the port; synchronously (see :mod:`.sync`)."""
    from .sync import run_sync

    async def load() -> tuple[list, dict]:
        sessions = await p.list_sessions()
        if ids is not None:
            wanted = set(ids)
            sessions = [s for s in sessions if s.id in wanted]
        sessions.sort(key=lambda s: s.id)
        return sessions, {s.id: await p.load_transcript(s.id) for s in sessions}

    return run_sync(load)


def _store_reader(store: Any, ids: Optional[list[str]]) -> ColumnReader:
    """The column reads of a store without SQL: its own :class:`ColumnReader` when it has
    :class:`ColumnReads` (a store of your own), else its transcripts, loaded through the port
    (MemoryPersistence too: only the sessions asked for are loaded, where its reader reads all)."""
    if isinstance(store, ColumnReads) and not isinstance(store, MemoryPersistence):
        return store.column_reader()
    return _transcript_columns(store, ids)


def _transcript_columns(store: Any, ids: Optional[list[str]]) -> TranscriptColumns:
    """The column reads of a store through its port: its transcripts, loaded once, read as the store
    conformance suite checks a :class:`ColumnReader` against them."""
    sessions, transcripts = _load(store, ids)
    return TranscriptColumns(type(store).__name__, lambda: [transcripts[s.id] for s in sessions], list,
                             lambda name: [])


def _session_cost(costs: Iterable[Optional[float]]) -> Optional[float]:
    """A session's cost: the sum of its model calls' costs, None when any of them is unknown."""
    total = 0.0
    for c in costs:
        if c is None:
            return None
        total += c
    return total


def _sessions(reader: Any, ids, since, until, convert) -> Any:
    """The sessions' columns, with ``cost`` summed from their messages' (a second query)."""
    fetched = reader.sessions(ids, since, until)
    if since is not None or until is not None:  # (the selected sessions' every message counts)
        ids = [sid for chunk in fetched.chunks for sid in chunk["session_id"]]
    # (a reader with ColumnReader's methods only, not a subclass, lacks the default: its messages have them)
    costs = reader.message_costs(ids) if hasattr(reader, "message_costs") else reader.messages(ids)
    by_session: dict[str, list] = {}
    for chunk in costs.chunks:
        for sid, role, cost in zip(chunk["session_id"], chunk["role"], chunk["cost"]):
            if role == "assistant":
                by_session.setdefault(sid, []).append(cost)
    fetched.names.append("cost")
    for i, chunk in enumerate(fetched.chunks):
        chunk["cost"] = tuple(_session_cost(by_session.get(sid, ())) for sid in chunk["session_id"])
        fetched.chunks[i] = convert(chunk)
    fetched.corrupt.extend(r for r in costs.corrupt if r not in fetched.corrupt)
    return fetched


# --------------------------------------------------------------------------- public views


def _view(view: str, p: Any, session_id: SessionIds, since: TimeLike, until: TimeLike, spec: dict,
          group: Optional[str], read: Callable[..., Any]) -> pd.DataFrame:
    ids, lo, hi = _session_ids(session_id), _bound(since, "since"), _bound(until, "until")
    if ids == []:
        return build([], spec, group)
    reader: Any = open_reader(p) or _store_reader(persistence_of(p), ids)
    with reader:
        fetched = read(reader, ids, lo, hi, lambda chunk: convert(chunk, spec))
    if fetched.corrupt:
        _warn_corrupt(view, reader.where, fetched.corrupt)
    return build(fetched.chunks, spec, group)


def _warn_corrupt(view: str, where: str, rows: list[CorruptRow]) -> None:
    shown = "; ".join(str(r) for r in rows[:3]) + (f"; and {len(rows) - 3} more" if len(rows) > 3 else "")
    warnings.warn(
        f"{view}: {len(rows)} corrupt record{'s' if len(rows) > 1 else ''} in {where}: {shown}. "
        "The frame keeps their rows, with NA for what only their JSON holds; fix or delete those rows "
        "(ids above) to see it.", RuntimeWarning, stacklevel=4)


def sessions_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None,
                batch: Optional[str] = None) -> pd.DataFrame:
    """One row per session: id, title, created/updated (UTC), duration, message count, revert
    point, and ``cost`` (USD: its model calls' costs summed; NaN when one of them is unknown).

    ``batch``: only the sessions of that batch's items (see :func:`~we0nb.batch_df`).
    """
    if batch is not None:
        from .batch_frames import batch_session_ids

        ids = batch_session_ids(p, batch)
        wanted = _session_ids(session_id)
        session_id = ids if wanted is None else [s for s in ids if s in set(wanted)]
    return _view("sessions_df", p, session_id, since, until, SESSION_COLUMNS, None, _sessions)


def messages_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None) -> pd.DataFrame:
    """One row per message: role, times, duration, model, finish reason, error, tokens (Int64) and
    ``cost`` (USD, float; NaN for user messages and for a model call whose cost is unknown)."""
    return _view("messages_df", p, session_id, since, until, MESSAGE_COLUMNS, "session_id",
                 lambda reader, ids, lo, hi, convert: reader.messages(ids, lo, hi, convert))


def parts_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None) -> pd.DataFrame:
    """One row per part (text, reasoning, tool, step start/finish, compaction).

    ``text`` holds a text/reasoning part's text or a compaction's summary; tool parts
    carry ``tool`` and ``status`` (their call id, input, output, error and the
    interrupt/recall flags are in :func:`tool_calls_df`, which joins on ``part_id``).
    """
    return _view("parts_df", p, session_id, since, until, PART_COLUMNS, "message_id",
                 lambda reader, ids, lo, hi, convert: reader.parts(ids, lo, hi, convert))


def tool_calls_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None,
                  until: TimeLike = None) -> pd.DataFrame:
    """One row per tool call: what people read first, then times, then the ids that join.

    Columns: ``tool``, ``status``, ``outcome``, ``input`` (JSON), ``output``, ``error``,
    ``duration``, ``interrupted``, ``interrupt_reason``, ``in_doubt``, ``recalled``,
    ``reconciled``, ``attempts``, ``approval``, ``approval_reason``, ``approved_input`` (JSON),
    ``decided``, ``metadata`` (JSON), ``attachments`` (how many the call's result has: an MCP
    server's images, audio, files, links; 0 for none), ``start``, ``end``, ``session_id``, ``order``,
    ``message_id``, ``part_id``, ``call_id``, ``idempotency_key``.

    ``outcome`` says what became of a finished call (status completed or error):
    ``"keep"`` — it finished in its own run and its result was kept; ``"recall"`` — a
    resume ran it again (``recalled``: a read-only or idempotent call that had not finished);
    ``"reconciled"`` — a resume asked its tool's reconcile, which found it had run
    (``reconciled``; its output is the reconcile's); ``"in_doubt"`` — it was interrupted
    while running: it may have run, nobody can tell; ``"interrupt"`` — it was stopped before
    it started and never run (``interrupted``; ``interrupt_reason`` is ``"resume"``,
    ``"prompt"``, ``"blocked"`` or ``"fork"``; ``error`` holds what the model was told). It is
    NA while the call is unfinished (pending, running).

    The exactly-once facts (SPEC §11), as the engine wrote them in the call's metadata:
    ``idempotency_key`` (every call has one, from its first write), ``attempts`` (executions
    started; 0 for a call never executed), ``in_doubt`` (nullable: True — interrupted while
    running, it may have run; False — interrupted before it started, it had no effect; NA for
    a call that was not interrupted) and ``reconciled``. ``order`` counts the calls of each
    session from 1.
    """
    return _view("tool_calls_df", p, session_id, since, until, TOOL_CALL_COLUMNS, "session_id",
                 lambda reader, ids, lo, hi, convert: reader.parts(ids, lo, hi, convert, tools_only=True))


# --------------------------------------------------------------------------- summary

SUMMARY_COLUMNS: dict[str, str] = {
    "session_id": "string",
    "title": "string",
    "created": TIME_DTYPE,
    "updated": TIME_DTYPE,
    "messages": "int64",
    "steps": "int64",
    "unfinished_steps": "int64",
    "step_errors": "int64",
    "tool_calls": "int64",
    "pending": "int64",
    "running": "int64",
    "completed": "int64",
    "error": "int64",
    "errors": "int64",
    "interrupts": "int64",
    "recalls": "int64",
    "requested": "int64",
    "approved": "int64",
    "denied": "int64",
    "wall_time": TD_DTYPE,
    "step_time": TD_DTYPE,
    "tool_time": TD_DTYPE,
    "input_tokens": "Int64",
    "output_tokens": "Int64",
    "reasoning_tokens": "Int64",
    "cached_tokens": "Int64",
}


def session_summary(p: Any, session_id: SessionIds = None, *, since: TimeLike = None,
                    until: TimeLike = None) -> pd.DataFrame:
    """One row per session: steps, tool calls by status, errors, interrupts, recalls, times, tokens.

    * ``steps`` — assistant messages (one per model call); ``unfinished_steps`` those never
      completed; ``step_errors`` those with an error (a model failure or a recovered one).
    * ``pending``/``running``/``completed``/``error`` — tool calls by status;
      ``errors`` — failed calls (status error, not interrupted); ``interrupts`` —
      interrupted calls; ``recalls`` — calls a resume executed again.
    * ``requested``/``approved``/``denied`` — tool calls by ``approval``: awaiting a
      person's decision, approved, denied (their sum: the calls that needed approval).
    * ``wall_time`` — first message created → last message completed (or created);
      ``step_time`` / ``tool_time`` — summed step and tool-call durations.
    * tokens — summed over steps (``<NA>`` for a session without steps).

    ``since``/``until`` select sessions by their creation time; the counts cover each
    selected session's whole history. Indexed by position; ``session_id`` is a column.
    """
    sessions = sessions_df(p, session_id, since=since, until=until)
    ids = sessions["session_id"].tolist()
    selected = session_id is not None or since is not None or until is not None
    msgs = messages_df(p, ids if selected else None)
    calls = tool_calls_df(p, ids if selected else None)
    if not selected:  # rows of sessions that appeared since sessions_df was read
        msgs = msgs[msgs["session_id"].isin(ids)]
        calls = calls[calls["session_id"].isin(ids)]
    out = sessions[["session_id", "title", "created", "updated", "messages"]].set_index("session_id")
    asst = msgs[msgs["role"] == "assistant"]
    g = asst.groupby("session_id", observed=True, sort=False)
    out["steps"] = g.size()
    out["unfinished_steps"] = asst["completed"].isna().groupby(asst["session_id"]).sum()
    out["step_errors"] = asst["error_reason"].notna().groupby(asst["session_id"]).sum()
    cg = calls.groupby("session_id", observed=True, sort=False)
    out["tool_calls"] = cg.size()
    by_status = calls.groupby(["session_id", "status"], observed=False).size().unstack("status")
    for st in STATUSES:
        out[st] = by_status[st] if st in by_status else 0
    failed = (calls["status"] == "error") & ~calls["interrupted"]
    out["errors"] = failed.groupby(calls["session_id"]).sum()
    out["interrupts"] = calls["interrupted"].groupby(calls["session_id"]).sum()
    out["recalls"] = calls["recalled"].groupby(calls["session_id"]).sum()
    by_approval = calls.groupby(["session_id", "approval"], observed=False).size().unstack("approval")
    for value in APPROVALS:
        out[value] = by_approval[value] if value in by_approval else 0
    last = msgs["completed"].fillna(msgs["created"])
    mg = msgs.assign(_last=last).groupby("session_id", sort=False)
    out["wall_time"] = cast(pd.Series, mg["_last"].max()) - cast(pd.Series, mg["created"].min())
    out["step_time"] = asst.groupby("session_id", sort=False)["duration"].sum()
    out["tool_time"] = cg["duration"].sum()
    for col in ("input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens"):
        out[col] = asst.groupby("session_id", sort=False)[col].sum(min_count=1)
    out = out.reset_index()
    for col, dtype in SUMMARY_COLUMNS.items():
        if dtype == "int64":
            out[col] = out[col].fillna(0).astype("int64")
        elif dtype == TD_DTYPE:
            s = out[col]
            if col in ("step_time", "tool_time"):
                s = s.fillna(pd.Timedelta(0))
            out[col] = s.astype(TD_DTYPE)
        else:
            out[col] = out[col].astype(dtype)
    return cast(pd.DataFrame, out[list(SUMMARY_COLUMNS)])


# --------------------------------------------------------------------------- JSON columns


def expand_json(df: pd.DataFrame, column: str, *, prefix: Optional[str] = None, max_level: Optional[int] = None,
                keep: bool = False) -> pd.DataFrame:
    """Open the JSON column ``column`` into one column per key (nested keys joined by ``.``).

    New columns are named ``f"{prefix}{key}"`` (``prefix`` defaults to ``column + "."``)
    and placed where ``column`` was (kept too with ``keep=True``). Missing keys and
    missing values give NA; a value that is not a JSON object goes to ``f"{prefix}value"``.
    ``max_level`` limits how deep nested objects are flattened (deeper ones stay dicts).
    Returns a new frame; the index is kept.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expand_json(df, column): df must be a DataFrame, got {type(df).__name__}.")
    if column not in df.columns:
        raise KeyError(f"expand_json: no column {column!r}; columns are {list(df.columns)}.")
    pre = f"{column}." if prefix is None else prefix
    records: list[dict] = []
    for i, v in enumerate(df[column].tolist()):
        if v is None or (not isinstance(v, (str, bytes, dict, list)) and pd.isna(v)):
            records.append({})
            continue
        if isinstance(v, (str, bytes)):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise ValueError(f"expand_json: row {df.index[i]!r} of {column!r} is not JSON ({e}).") from None
        records.append(v if isinstance(v, dict) else {"value": v})
    if records:
        flat = pd.json_normalize(records, max_level=max_level, sep=".")
    else:
        flat = pd.DataFrame()
    flat.index = df.index
    flat.columns = [f"{pre}{c}" for c in flat.columns]
    flat = flat.convert_dtypes()
    clash = [c for c in flat.columns if c in df.columns and c != column]
    if clash:
        raise ValueError(f"expand_json: columns {clash} already exist; pass prefix= to name them apart.")
    pos = list(df.columns).index(column)
    left = df.iloc[:, : pos + (1 if keep else 0)]
    right = df.iloc[:, pos + 1:]
    return pd.concat([left, flat, right], axis=1)

"""Persisted transcripts as pandas DataFrames.

``sessions_df``, ``messages_df``, ``parts_df`` and ``tool_calls_df`` turn what a
persistence holds into one row per entity; ``session_summary`` aggregates them per
session and ``expand_json`` opens a JSON column into columns.

Every view takes ``p``: a :class:`~we0nb.MemoryPersistence`, a
:class:`~we0nb.SqlPersistence`, a :class:`~we0nb.We0Agent` (its ``.persistence``), a
SQLAlchemy ``Engine`` or a database URL string. They are synchronous, so they work in any
notebook cell, also while the kernel's event loop is running.

* SQL databases (SqlPersistence, an Engine, a URL): each view is **one** SQL query
  (SQLAlchemy Core) over the flattened columns of :mod:`we0nb.persistence.sql.tables`; its
  rows are fetched in chunks with the DB-API cursor and turned column-wise into
  Arrow/NumPy arrays — no message/part object, dict or Python loop per row. The few
  values that live only in the JSON ``data`` column (text, tool input/output/error/
  metadata) are extracted by the database (``json_extract`` on SQLite, ``#>``/``#>>`` on
  PostgreSQL; other databases: parsed here). Rows are sorted after the fetch (Arrow), so
  the order never depends on the database's collation. On SQLite, categoricals with fixed
  categories (type, status, interrupt reason) come as small integer codes, and an
  unfiltered ``parts_df``/``tool_calls_df`` on a database file is read by two connections
  in parallel from one snapshot: the text columns packed by SQLite on a helper thread,
  the rest row by row (see "SQLite: two connections" below).
* Any other persistence (MemoryPersistence): its public async port
  (``list_sessions``/``load_transcript``), run on a worker thread when a loop is running.

Both routes go through the same typing step, so the same history gives the same frame
(columns, dtypes, values) whatever the backend.

Conventions: stable id columns (``session_id``, ``message_id``, ``part_id``) in every
frame so they join; a 1-based ``order`` (messages within their session, parts within
their message, tool calls within their session); tz-aware UTC datetimes
(``datetime64[us, UTC]``); durations as ``timedelta64[us]``; categoricals for role, part
type, status, tool and interrupt reason; nullable ``Int64`` for tokens; the ``string``
dtype for text; nested JSON (tool input, metadata) as compact JSON strings (as pydantic
writes them, non-ASCII kept). Rows are sorted by session id (code-point order), then
history order (ids sort in creation order).

``since``/``until`` select by creation time: sessions by their own ``created``, messages
by theirs, parts and tool calls by the ``created`` time of the message they belong to.
``since`` is inclusive, ``until`` exclusive, compared in whole microseconds as the frames
show times (a time read off a frame selects its own row); both accept a
datetime/Timestamp (naive means UTC), an ISO string, or epoch seconds.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import math
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import pandas as pd

from ..persistence.sql.tables import message_columns, part_columns

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

# --------------------------------------------------------------------------- column specs
#
# kind: "id"/"str"/"json" → string; "time" → datetime64[us, UTC] from epoch seconds;
# "int" → Int64; "count"/"order" → int64; "bool" → bool; "cat:<name>" → categorical;
# ("td", start, end) → end - start as timedelta64[us] (derived, not read).

ROLES = ("user", "assistant")
PART_TYPES = ("text", "reasoning", "tool", "step-start", "step-finish", "compaction")
STATUSES = ("pending", "running", "completed", "error")
INTERRUPT_REASONS = ("resume", "prompt", "blocked")
_FIXED_CATEGORIES = {"role": ROLES, "type": PART_TYPES, "status": STATUSES, "interrupt_reason": INTERRUPT_REASONS}

SESSION_COLUMNS: dict[str, Any] = {
    "session_id": "id",
    "title": "str",
    "created": "time",
    "updated": "time",
    "duration": ("td", "created", "updated"),
    "messages": "count",
    "revert_message_id": "str",
}

MESSAGE_COLUMNS: dict[str, Any] = {
    "session_id": "id",
    "message_id": "id",
    "order": "order",
    "role": "cat:role",
    "created": "time",
    "completed": "time",
    "duration": ("td", "created", "completed"),
    "parent_id": "str",
    "model_id": "str",
    "finish_reason": "str",
    "error_reason": "str",
    "error_message": "str",
    "input_tokens": "int",
    "output_tokens": "int",
    "reasoning_tokens": "int",
    "cached_tokens": "int",
    "summary": "bool",
}

PART_COLUMNS: dict[str, Any] = {
    "session_id": "id",
    "message_id": "id",
    "part_id": "id",
    "order": "order",
    "type": "cat:type",
    "start": "time",
    "end": "time",
    "duration": ("td", "start", "end"),
    "text": "str",
    "tool": "cat:tool",
    "status": "cat:status",
}

TOOL_CALL_COLUMNS: dict[str, Any] = {
    "session_id": "id",
    "message_id": "id",
    "part_id": "id",
    "call_id": "str",
    "order": "order",
    "tool": "cat:tool",
    "status": "cat:status",
    "input": "json",
    "output": "str",
    "error": "str",
    "metadata": "json",
    "interrupted": "bool",
    "interrupt_reason": "cat:interrupt_reason",
    "recalled": "bool",
    "start": "time",
    "end": "time",
    "duration": ("td", "start", "end"),
}

_TIME_DTYPE = "datetime64[us, UTC]"
_TD_DTYPE = "timedelta64[us]"
_STRING = pd.StringDtype()


# --------------------------------------------------------------------------- typing step


def _arrow(values: Any, typ: Any) -> Any:
    """An Arrow array of ``typ`` from a sequence of Python scalars (None = null), built in C++."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values if values.type == typ else values.cast(typ)
    if isinstance(values, (pd.Categorical, pd.api.extensions.ExtensionArray, pd.Series)):
        values = np.asarray(values, dtype=object)
    if isinstance(values, np.ndarray) and values.dtype == object:
        return pa.array(values, type=typ, from_pandas=True)
    return pa.array(values, type=typ)


def _categorical(arr: Any, column: str) -> pd.Categorical:
    """Categorical with string categories: the fixed ones first (role, type …), others sorted.

    ``arr`` is a string array or a dictionary array (codes read from SQL, see
    :func:`_coded`); only the values that occur become categories, either way.
    """
    import pyarrow as pa

    enc = arr if pa.types.is_dictionary(arr.type) else arr.dictionary_encode()
    values = enc.dictionary.to_pylist()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype("int64")
    used = np.zeros(len(values) + 1, dtype=bool)
    used[codes] = True  # code -1 marks the last slot
    present = [v for v, u in zip(values, used) if u]
    fixed = _FIXED_CATEGORIES.get(column)
    if fixed is not None:
        cats = list(fixed) + sorted(v for v in present if v not in fixed)
    else:
        cats = sorted(present)
    pos = {c: i for i, c in enumerate(cats)}
    remap = np.array([pos.get(v, -1) for v in values] + [-1], dtype="int64")  # code -1 → last entry → -1
    dtype = pd.CategoricalDtype(pd.Index(cats, dtype=_STRING))
    return pd.Categorical.from_codes(remap[codes], dtype=dtype)


def _integers(arr: Any) -> Any:
    mask = arr.is_null().to_numpy(zero_copy_only=False)
    data = arr.fill_null(0).to_numpy(zero_copy_only=False).astype("int64")
    return pd.arrays.IntegerArray(data, mask)


def _to_time(seconds: np.ndarray) -> pd.DatetimeIndex:
    # epoch seconds → whole microseconds, rounding half up (the same arithmetic on every route)
    us = np.floor(seconds * 1e6 + 0.5)
    return pd.to_datetime(us, unit="us", utc=True).as_unit("us")


def _order(keys: Any) -> np.ndarray:
    """1-based position within runs of equal consecutive keys (rows are sorted by group)."""
    import pyarrow.compute as pc

    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype="int64")
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = pc.not_equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    idx = np.arange(n, dtype="int64")
    start = np.maximum.accumulate(np.where(new, idx, 0))
    return idx - start + 1


_SORT_KEYS = ("session_id", "message_id", "part_id")


def _build(raw: dict[str, Any], spec: dict[str, Any], group: Optional[str]) -> pd.DataFrame:
    """Type raw columns (sequences of Python scalars, None for missing) per ``spec``.

    Every route (SQL or port) ends here: columns become Arrow/NumPy arrays, rows are
    sorted by the id columns (session, message, part — code-point order, as Python
    sorts), then typed; this step makes no Python object per row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(next(iter(raw.values()))) if raw else 0
    base: dict[str, Any] = {}
    for name, kind in spec.items():
        if isinstance(kind, tuple) or kind == "order":
            continue
        values = raw.get(name)
        if values is None:
            values = [None] * n
        if kind.startswith("cat:") and isinstance(values, pa.DictionaryArray):
            base[name] = values  # codes read from SQL: typed by _categorical
        elif kind in ("id", "str", "json") or kind.startswith("cat:"):
            base[name] = _arrow(values, pa.large_string())
        elif kind == "time":
            base[name] = np.array(values, dtype="float64")  # None → NaN
        elif kind == "int":
            base[name] = _arrow(values, pa.int64())
        elif kind == "count":
            base[name] = np.array(values, dtype="int64").reshape(n)
        elif kind == "bool":
            base[name] = np.array(values, dtype=bool).reshape(n)
        else:  # pragma: no cover - a spec typo
            raise AssertionError(kind)
    keys = [k for k in _SORT_KEYS if k in base]
    if n > 1 and keys:
        order = pc.sort_indices(pa.table({k: base[k] for k in keys}), sort_keys=[(k, "ascending") for k in keys])
        idx = order.to_numpy()
        if not np.array_equal(idx, np.arange(n)):
            base = {k: (v.take(order) if isinstance(v, pa.Array) else v[idx]) for k, v in base.items()}
    cols: dict[str, Any] = {}
    for name, kind in spec.items():
        if isinstance(kind, tuple):
            continue
        if kind == "order":
            cols[name] = _order(base[group]) if group else np.arange(1, n + 1, dtype="int64")
        elif kind in ("id", "str", "json"):
            cols[name] = pd.array(base[name], dtype=_STRING)
        elif kind == "time":
            cols[name] = _to_time(base[name])
        elif kind == "int":
            cols[name] = _integers(base[name])
        elif kind.startswith("cat:"):
            cols[name] = _categorical(base[name], name)
        else:
            cols[name] = base[name]
    out: dict[str, Any] = {}
    for name, kind in spec.items():
        if isinstance(kind, tuple):
            _, a, b = kind
            out[name] = (cols[b] - cols[a]).as_unit("us")
        else:
            out[name] = cols[name]
    return pd.DataFrame(out, copy=False)


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


def _bound(value: TimeLike, name: str) -> Optional[int]:
    """A time bound as epoch microseconds (naive datetimes and strings are taken as UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a datetime, an ISO string or epoch seconds, got a bool.")
    if isinstance(value, (int, float, np.integer, np.floating)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name}: {value!r} is not a time.")
        return _us(float(value))
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


def _in_window(t: Optional[float], since: Optional[int], until: Optional[int]) -> bool:
    if since is None and until is None:
        return True
    if t is None:
        return False
    us = _us(t)
    return (since is None or us >= since) and (until is None or us < until)


# --------------------------------------------------------------------------- sources


class _Sql:
    """A synchronous SQLAlchemy engine to query, and whether we own (dispose) it."""

    def __init__(self, engine: Any, owned: bool):
        self.engine = engine
        self.owned = owned

    def __enter__(self) -> "_Sql":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.owned:
            self.engine.dispose()


class _Port:
    def __init__(self, persistence: Any):
        self.persistence = persistence


def _sync_url(url: Any) -> Any:
    """A SQLAlchemy URL with a synchronous driver (``sqlite+aiosqlite`` → ``sqlite`` …)."""
    from sqlalchemy.engine import make_url

    u = make_url(str(url)) if not hasattr(url, "drivername") else url
    backend = u.get_backend_name()
    driver = u.get_driver_name() if "+" in u.drivername else ""
    if backend in ("postgres", "postgresql"):
        if driver in ("", "asyncpg", "psycopg_async", "psycopg"):
            u = u.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        if driver in ("aiosqlite", "pysqlite_async"):
            u = u.set(drivername="sqlite")
    elif backend in ("mysql", "mariadb") and driver in ("aiomysql", "asyncmy"):
        u = u.set(drivername=f"{backend}+pymysql")
    return u


def _open_url(url: Any) -> Any:
    """A synchronous engine on ``url``, refusing a SQLite file that does not exist."""
    import os

    import sqlalchemy as sa

    u = _sync_url(url)
    if u.get_backend_name() == "sqlite":
        db = u.database or ""
        if db and db != ":memory:" and not db.startswith("file:") and not os.path.exists(db):
            raise ValueError(f"No SQLite database at {db!r} (from {u.render_as_string(hide_password=True)!r}).")
    return sa.create_engine(u)


def _check_tables(sql: _Sql) -> None:
    """A database given as an Engine or URL must hold the we0nb tables."""
    import sqlalchemy as sa

    from ..persistence.sql import tables as S

    if not sa.inspect(sql.engine).has_table(S.parts.name):
        where = sql.engine.url.render_as_string(hide_password=True)
        if sql.owned:
            sql.engine.dispose()
        raise ValueError(f"{where!r} has no we0nb tables ({S.parts.name} …): is it a SqlPersistence database?")


def _source(p: Any) -> Union[_Sql, _Port]:
    from ..persistence.base import Persistence

    if not isinstance(p, (Persistence, str)) and hasattr(p, "persistence") and isinstance(
            getattr(p, "persistence"), Persistence):
        p = p.persistence  # a We0Agent
    if isinstance(p, Persistence):
        engine_factory = getattr(p, "sync_engine", None)
        if callable(engine_factory):
            return _Sql(engine_factory(), owned=False)
        return _Port(p)
    try:
        import sqlalchemy as sa
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency
        sa = None
    src: Optional[_Sql] = None
    if sa is not None:
        if isinstance(p, sa.engine.Engine):
            src = _Sql(p, owned=False)
        elif isinstance(p, sa.engine.URL):
            src = _Sql(_open_url(p), owned=True)
    if src is None and isinstance(p, str):
        if "://" not in p:
            raise ValueError(f"{p!r} is not a database URL (expected e.g. 'sqlite:///we0.db').")
        src = _Sql(_open_url(p), owned=True)
    if src is not None:
        _check_tables(src)
        return src
    raise TypeError(
        "Expected a We0Agent, a persistence (MemoryPersistence, SqlPersistence), a SQLAlchemy Engine "
        f"or a database URL, got {type(p).__name__}."
    )


def _run_sync(make_coro: Callable[[], Any]) -> Any:
    """Run the port's coroutines from sync code: plain ``asyncio.run`` outside a loop, a
    worker thread with its own loop inside one (a notebook cell) — see :mod:`.sync`."""
    from .sync import run_sync

    return run_sync(make_coro)


# --------------------------------------------------------------------------- port (memory) build


def _dump(obj: Any) -> str:
    import pydantic_core

    return pydantic_core.to_json(obj).decode()


async def _load_port(p: Any, ids: Optional[list[str]], need_transcripts: bool):
    sessions = await p.list_sessions()
    if ids is not None:
        wanted = set(ids)
        sessions = [s for s in sessions if s.id in wanted]
    sessions.sort(key=lambda s: s.id)
    if not need_transcripts:
        return sessions, {}
    transcripts = {s.id: await p.load_transcript(s.id) for s in sessions}
    return sessions, transcripts


def _port_messages(transcripts: dict, since: Optional[float], until: Optional[float]):
    for sid in sorted(transcripts):
        for m in transcripts[sid].messages:
            if _in_window(m.info.time.created, since, until):
                yield sid, m


def _port_sessions(p: Any, ids, since, until) -> dict[str, list]:
    sessions, transcripts = _run_sync(lambda: _load_port(p, ids, True))
    raw: dict[str, list] = {k: [] for k in SESSION_COLUMNS if not isinstance(SESSION_COLUMNS[k], tuple)}
    for s in sessions:
        if not _in_window(s.time.created, since, until):
            continue
        raw["session_id"].append(s.id)
        raw["title"].append(s.title)
        raw["created"].append(s.time.created)
        raw["updated"].append(s.time.updated)
        raw["messages"].append(len(transcripts[s.id].messages))
        raw["revert_message_id"].append(s.revert.message_id if s.revert is not None else None)
    return raw


def _port_messages_raw(p: Any, ids, since, until) -> dict[str, list]:
    _, transcripts = _run_sync(lambda: _load_port(p, ids, True))
    names = [k for k, v in MESSAGE_COLUMNS.items() if not isinstance(v, tuple) and v != "order"]
    raw: dict[str, list] = {k: [] for k in names}
    for sid, m in _port_messages(transcripts, since, until):
        info = m.info
        # the SQL columns' flattening, so both routes give the same frame
        row = message_columns(info)
        row["session_id"] = sid
        row["message_id"] = info.id
        for k in names:
            raw[k].append(row[k])
    return raw


def _port_parts_raw(p: Any, ids, since, until, tools_only: bool) -> dict[str, list]:
    _, transcripts = _run_sync(lambda: _load_port(p, ids, True))
    spec = TOOL_CALL_COLUMNS if tools_only else PART_COLUMNS
    names = [k for k, v in spec.items() if not isinstance(v, tuple) and v != "order"]
    raw: dict[str, list] = {k: [] for k in names}
    for sid, m in _port_messages(transcripts, since, until):
        for part in m.parts:
            t = part.type
            if tools_only and t != "tool":
                continue
            cols = part_columns(part)  # the SQL columns' flattening (persistence.schema)
            row: dict[str, Any] = {
                "session_id": sid,
                "message_id": part.message_id,
                "part_id": part.id,
                "type": t,
                "start": cols["time_start"],
                "end": cols["time_end"],
                "text": None,
                "tool": cols["tool"],
                "call_id": cols["call_id"],
                "status": cols["status"],
                "interrupted": cols["interrupted"],
                "interrupt_reason": cols["interrupt_reason"],
                "recalled": cols["recalled"],
            }
            if t in ("text", "reasoning"):
                row["text"] = part.text
            elif t == "compaction":
                row["text"] = part.summary
            elif t == "tool":
                st = part.state
                meta = getattr(st, "metadata", None)
                row.update(
                    input=_dump(st.input),
                    output=getattr(st, "output", None),
                    error=getattr(st, "error", None),
                    metadata=_dump(meta) if meta is not None else None,
                )
            for k in names:
                raw[k].append(row[k])
    return raw


# --------------------------------------------------------------------------- SQL build


def _json_value(dialect: str, col: Any, path: Sequence[str], *, as_json: bool) -> Any:
    """A JSON member of a text column, extracted by the database: text (or JSON text)."""
    import sqlalchemy as sa

    if dialect == "sqlite":
        # json_extract gives SQL text for strings and compact JSON text for objects
        return sa.func.json_extract(col, "$." + ".".join(path))
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        doc = sa.cast(col, postgresql.JSON)  # json (not jsonb) keeps the stored text as is
        if as_json:
            return sa.cast(doc[tuple(path)], sa.Text)
        return doc[tuple(path)].astext
    return None  # read ``data`` and extract in Python (other databases)


def _py_json_value(data: Sequence[Optional[str]], path: Sequence[str], as_json: bool) -> list:
    out = []
    for d in data:
        v: Any = json.loads(d) if d else None
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if v is None:
            out.append(None)
        elif as_json:
            out.append(_dump(v))
        else:
            out.append(v if isinstance(v, str) else _dump(v))
    return out


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC (restored after; nothing here makes reference cycles)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_CHUNK = 4_096  # rows per fetch: small enough that a chunk's row objects stay in cache


def _kind_of(spec: dict[str, Any], name: str, coded: dict[str, tuple]) -> Any:
    if name in coded:
        return ("c", coded[name])
    kind = spec.get(name)
    if kind is None or isinstance(kind, tuple):
        return None  # not a frame column (e.g. ``data`` for Python-side JSON): Python values
    if kind in ("id", "str", "json") or kind.startswith("cat:"):
        return "s"
    return {"time": "f", "int": "i", "count": "n", "order": "n", "bool": "b"}[kind]


def _coded(col: Any, values: Sequence[str]) -> Any:
    """SQLite: a categorical column as small integer codes (index into ``values``; -1 for NULL).

    A value not in ``values`` comes as itself behind a ``~`` (never read as a number).
    Small Python ints are shared objects: fetching a code allocates nothing, a string
    per row does (and then has to be encoded again for Arrow).
    """
    import sqlalchemy as sa

    return sa.case({v: sa.literal_column(str(i)) for i, v in enumerate(values)}, value=col,
                   else_=sa.func.ifnull(sa.literal("~", sa.String).concat(col), sa.literal_column("-1")))


def _decode(values: Sequence[Any], known: Sequence[str]) -> list:
    """Codes and ``~``-prefixed strings (see :func:`_coded`) back to strings/None."""
    table = list(known)
    return [None if v is None or v == -1 else table[v] if type(v) is int else v[1:] for v in values]


def _convert_chunk(values: tuple, kind: Any) -> Any:
    import pyarrow as pa

    if kind == "s":
        return pa.array(values, type=pa.large_string())
    if kind == "i":
        return pa.array(values, type=pa.int64())
    if kind == "f":
        return np.array(values, dtype="float64")  # None → NaN
    if kind == "n":
        return np.array(values, dtype="int64")
    if kind == "b":
        return np.array(values, dtype=bool)  # SQLite's 0/1 and PostgreSQL's booleans alike
    if isinstance(kind, tuple):  # ("c", known values): codes, or strings when one is unknown
        try:
            return np.array(values, dtype=np.int16)  # "~…" strings and None refuse to convert
        except (TypeError, ValueError):
            return pa.array(_decode(values, kind[1]), type=pa.large_string())
    return list(values)


def _concat(chunks: list, kind: Any) -> Any:
    import pyarrow as pa

    if isinstance(kind, tuple):  # coded categorical: a dictionary array, or strings
        known = pa.array(list(kind[1]), type=pa.large_string())
        if all(isinstance(c, np.ndarray) for c in chunks):
            codes = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
            return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), known)
        table = np.array(list(kind[1]) + [None], dtype=object)  # code -1 → None
        return pa.concat_arrays([c if isinstance(c, pa.Array) else pa.array(table[c], type=pa.large_string())
                                 for c in chunks])
    if kind in ("s", "i"):
        return pa.concat_arrays(chunks) if chunks else pa.array([], type=pa.large_string() if kind == "s" else pa.int64())
    if kind is None:
        return [v for c in chunks for v in c]
    if not chunks:
        return np.zeros(0, dtype={"f": "float64", "n": "int64", "b": bool}[kind])
    return np.concatenate(chunks)


def _fetch_columns(sql: _Sql, stmt: Any, spec: dict[str, Any], coded: Optional[dict[str, tuple]] = None
                   ) -> dict[str, Any]:
    """Run ``stmt`` and return its columns as Arrow/NumPy arrays.

    Rows are fetched in chunks with the DB-API cursor and turned column-wise into arrays
    at once, so each chunk's row tuples are freed while still in cache (a million live
    row tuples cost more to allocate, scan and free than the query itself). Rows come
    unordered: the typing step sorts them by id, the same way for every database.
    Columns named in ``coded`` were selected through :func:`_coded` (value → code).
    """
    coded = coded or {}
    with sql.engine.connect() as conn:
        result = conn.execute(stmt)
        names = list(result.keys())
        cursor = getattr(result, "cursor", None)
        fetch = cursor.fetchmany if cursor is not None else (lambda size: [tuple(r) for r in result.fetchmany(size)])
        out = _fetch_rows(fetch, names, [_kind_of(spec, n, coded) for n in names])
        result.close()
    return out


def _fetch_rows(fetch: Callable[[int], list], names: list[str], kinds: list) -> dict[str, Any]:
    """Fetch all rows with ``fetch(size)`` and turn them column-wise into arrays, chunk by chunk."""
    chunks: list[list] = [[] for _ in names]
    while True:
        rows = fetch(_CHUNK)
        if not rows:
            break
        for i, col in enumerate(zip(*rows)):
            chunks[i].append(_convert_chunk(col, kinds[i]))
        del rows
    return {n: _concat(c, k) for n, c, k in zip(names, chunks, kinds)}


# ----------------------------------------------------------------- SQLite: two connections
#
# Python's sqlite3 builds a tuple and an object per value, holding the GIL: that is most
# of a big fetch, so two threads fetching rows only take turns. What runs without the GIL
# is SQLite itself — scanning, ``json_extract``, ``group_concat`` — for as long as one
# ``sqlite3_step`` lasts. So on a SQLite file an unfiltered view is read by two
# connections at once: the calling thread fetches the cheap columns row by row (codes,
# numbers, the part id), a helper thread has SQLite pack the text columns (ids, text,
# JSON members) into one string per column for each block of rows (a single step per
# block, no Python object per row), which Arrow splits. Both read the rows in primary-key
# order from the same snapshot (checked with ``PRAGMA data_version``), so the i-th text
# value belongs to the i-th row; whenever that cannot be shown (a commit slipped in
# between, a separator inside a value, an error) the text columns are read row by row on
# the first connection, in its snapshot, instead — the frame is the same either way.

_BLOCK = 262_144  # rows per packed block of the helper connection
_MIN_BLOCK = 1_024  # a block too long for SQLite is read again in smaller ones, down to this
_SEP = b"\x1f"  # the separator between packed values (checked: a block whose count differs is re-read)


def _split_ok(sql: _Sql) -> bool:
    """Whether two pooled connections of this engine reach the same SQLite file."""
    from sqlalchemy.pool import SingletonThreadPool, StaticPool

    eng = sql.engine
    if eng.dialect.name != "sqlite" or eng.dialect.driver != "pysqlite":
        return False
    db = eng.url.database or ""
    if not db or db == ":memory:" or db.startswith("file:") or eng.url.query.get("mode") == "memory":
        return False
    return not isinstance(eng.pool, (SingletonThreadPool, StaticPool))


def _literal_sql(stmt: Any, dialect: Any) -> str:
    return str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def _fetch_split(sql: _Sql, key: Any, where: list, a_cols: list, b_cols: list, spec: dict[str, Any],
                 coded: dict[str, tuple]) -> dict[str, Any]:
    """Columns ``a_cols`` row by row here, ``b_cols`` (strings) packed on a helper thread.

    Rows are those of ``key``'s table matching ``where``, in ``key`` (primary key) order.
    """
    import threading

    import sqlalchemy as sa

    dialect = sql.engine.dialect
    b_names = [c.name for c in b_cols]
    a_sql = _literal_sql(sa.select(*a_cols).where(*where).order_by(key), dialect)
    b_rows_sql = _literal_sql(sa.select(*b_cols).where(*where).order_by(key), dialect)
    nullable = [not (isinstance(c, sa.Column) and not c.nullable) for c in b_cols]

    compiled: dict[tuple[bool, int], tuple[str, str]] = {}

    def block(first: bool, size: int) -> tuple[str, str]:
        """SQL for one block of ``size`` rows: packed (count, last key, one string per column), and rows."""
        if (first, size) not in compiled:
            compiled[first, size] = _block_sql(first, size)
        return compiled[first, size]

    def _block_sql(first: bool, size: int) -> tuple[str, str]:
        cond = list(where) if first else [*where, key > sa.literal_column("?")]
        sub = sa.select(key.label("k"), *b_cols).where(*cond).order_by(key).limit(size).subquery()
        packed = [sa.func.group_concat(
            sa.case((sub.c[n].is_(None), sa.literal("", sa.String)), else_=sa.literal(".", sa.String).concat(sub.c[n]))
            if null else sub.c[n], sa.literal_column(f"x'{_SEP.hex()}'")) for n, null in zip(b_names, nullable)]
        agg = sa.select(sa.func.count(), sa.func.max(sub.c.k), *[sa.cast(p, sa.LargeBinary) for p in packed])
        rows = sa.select(*[sub.c[n] for n in b_names])
        return _literal_sql(agg, dialect), _literal_sql(rows, dialect)

    block(True, _BLOCK), block(False, _BLOCK)
    a_names = [c.name for c in a_cols]
    kinds = {n: _kind_of(spec, n, coded) for n in a_names + b_names}
    ra, rb = sql.engine.raw_connection(), sql.engine.raw_connection()
    try:
        a, b = ra.driver_connection, rb.driver_connection
        if a is b or a.in_transaction or b.in_transaction:  # not two fresh connections: one statement
            everything = _literal_sql(sa.select(*a_cols, *b_cols).where(*where).order_by(key), dialect)
            return _fetch_rows(a.execute(everything).fetchmany, a_names + b_names, [kinds[n] for n in a_names + b_names])
        helper: Optional[threading.Thread] = None
        got: dict[str, Any] = {}
        try:
            a_cur, same = _one_snapshot(a, a_sql, b, key.table.name)
            if same:
                def run() -> None:
                    try:
                        got["b"] = _read_packed(b, block, b_names, nullable)
                    except BaseException as e:  # noqa: BLE001 - the columns are read row by row instead
                        got["error"] = e

                helper = threading.Thread(target=run, name="we0nb-frames", daemon=True)
                helper.start()
            raw = _fetch_rows(a_cur.fetchmany, a_names, [kinds[n] for n in a_names])
        except BaseException:
            if helper is not None:
                b.interrupt()
            raise
        finally:
            if helper is not None:
                helper.join()
        packed = got.get("b")
        if packed is not None and all(len(v) == len(raw[a_names[0]]) for v in packed.values()):
            raw.update(packed)
        else:  # row by row, in the first connection's snapshot (still open)
            raw.update(_fetch_rows(a.execute(b_rows_sql).fetchmany, b_names, [kinds[n] for n in b_names]))
        return raw
    finally:
        for r in (ra, rb):
            try:
                r.driver_connection.rollback()
            finally:
                r.close()


def _one_snapshot(a: Any, a_sql: str, b: Any, table: str) -> tuple[Any, bool]:
    """Start ``a_sql`` on ``a`` and a read transaction on ``b``; whether both read one snapshot.

    Both open explicit transactions (a snapshot lasts until its rollback). ``PRAGMA
    data_version`` changes when another connection commits: the same value on ``b``
    before ``a``'s snapshot and inside ``b``'s own means no commit came in between.
    """
    v0 = b.execute("PRAGMA data_version").fetchone()[0]
    a.execute("BEGIN")
    cursor = a.execute(a_sql)  # its first step takes a's snapshot
    b.execute("BEGIN")
    b.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()  # takes b's
    return cursor, b.execute("PRAGMA data_version").fetchone()[0] == v0


def _read_packed(conn: Any, block: Callable[[bool, int], tuple[str, str]], names: list[str],
                 nullable: list[bool]) -> dict[str, Any]:
    """The helper's side of :func:`_fetch_split`: all packed blocks first, then Arrow splits them.

    Every call into Python here has to win the GIL from the row-fetching thread (a wait of
    up to the switch interval), so the helper makes few calls: big blocks, and one split
    per column for all blocks together.
    """
    import sqlite3

    import pyarrow as pa
    import pyarrow.compute as pc

    blocks: list[tuple[tuple, int, int, list]] = []  # parameters, block size, row count, packed columns
    last: Optional[str] = None
    size = _BLOCK
    while True:
        params = () if last is None else (last,)
        try:
            count, last_key, *packs = conn.execute(block(last is None, size)[0], params).fetchone()
        except sqlite3.DataError:  # a block's text over SQLite's length limit: smaller blocks
            if size <= _MIN_BLOCK:
                raise
            size = max(_MIN_BLOCK, size // 8)
            continue
        if not count:
            break
        blocks.append((params, size, count, packs))
        last = last_key
    counts = np.array([b[2] for b in blocks], dtype="int64")
    bad = np.zeros(len(blocks), dtype=bool)
    split = []
    for i in range(len(names)):
        blobs = [b[3][i] for b in blocks]
        bad |= np.array([x is None for x in blobs], dtype=bool)
        lists = pc.split_pattern(pa.array([x or b"" for x in blobs], type=pa.large_binary()), _SEP)
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype("int64")
        bad |= lengths != counts  # a separator inside a value
        split.append((lists, lengths))
    rows = {j: _fetch_rows(conn.execute(block(not blocks[j][0], blocks[j][1])[1], blocks[j][0]).fetchmany, names,
                           ["s"] * len(names)) for j in np.flatnonzero(bad)}
    out: dict[str, Any] = {}
    for i, (name, null) in enumerate(zip(names, nullable)):
        lists, lengths = split[i]
        values = pc.list_flatten(lists).cast(pa.large_string())  # checks the UTF-8
        if null:  # "" is NULL, "." + value a value
            values = pc.if_else(pc.equal(pc.binary_length(values), 0), pa.scalar(None, pa.large_string()),
                                pc.utf8_slice_codeunits(values, 1))
        if rows:
            starts = np.concatenate([[0], np.cumsum(lengths)])
            values = pa.concat_arrays([rows[j][name] if j in rows else values.slice(starts[j], lengths[j])
                                       for j in range(len(blocks))])
        out[name] = values
    return out


def _time_filter(stmt: Any, col: Any, since: Optional[int], until: Optional[int]) -> Any:
    """Keep rows whose time, in whole microseconds as the frames show it, is in [since, until).

    ``floor(t * 1e6 + 0.5) >= since`` ⟺ ``t * 1e6 + 0.5 >= since`` for an integer bound:
    the same double arithmetic as the frames and the port route, so a time read off a
    frame selects its own row. A coarse bound on the bare column comes first (indexable).
    """
    exact = col * 1e6 + 0.5
    if since is not None:
        stmt = stmt.where(col >= (since - 2) / 1e6, exact >= since)
    if until is not None:
        stmt = stmt.where(col < (until + 2) / 1e6, exact < until)
    return stmt


def _sql_sessions(sql: _Sql, ids, since, until) -> dict[str, Any]:
    import sqlalchemy as sa

    from ..persistence.sql import tables as S

    s, m = S.sessions, S.messages
    n_messages = sa.select(sa.func.count()).where(m.c.session_id == s.c.id).scalar_subquery()
    stmt = sa.select(
        s.c.id.label("session_id"), s.c.title, s.c.created, s.c.updated,
        n_messages.label("messages"), s.c.revert_message_id,
    )
    if ids is not None:
        stmt = stmt.where(s.c.id.in_(ids))
    stmt = _time_filter(stmt, s.c.created, since, until)
    return _fetch_columns(sql, stmt, SESSION_COLUMNS)


def _sql_messages(sql: _Sql, ids, since, until) -> dict[str, Any]:
    import sqlalchemy as sa

    from ..persistence.sql import tables as S

    m = S.messages
    stmt = sa.select(
        m.c.session_id, m.c.id.label("message_id"), m.c.role, m.c.created, m.c.completed, m.c.parent_id,
        m.c.model_id, m.c.finish_reason, m.c.error_reason, m.c.error_message, m.c.input_tokens,
        m.c.output_tokens, m.c.reasoning_tokens, m.c.cached_tokens, m.c.summary,
    )
    if ids is not None:
        stmt = stmt.where(m.c.session_id.in_(ids))
    stmt = _time_filter(stmt, m.c.created, since, until)
    return _fetch_columns(sql, stmt, MESSAGE_COLUMNS)


def _sql_parts(sql: _Sql, ids, since, until, tools_only: bool) -> dict[str, Any]:
    import sqlalchemy as sa

    from ..persistence.sql import tables as S

    pt, m = S.parts, S.messages
    dialect = sql.engine.dialect.name
    # SQLite: categoricals with fixed categories as codes (see _coded)
    coded = {"status": STATUSES, "type": PART_TYPES, "interrupt_reason": INTERRUPT_REASONS} \
        if dialect == "sqlite" else {}

    def cat(col: Any, name: str) -> Any:
        return _coded(col, coded[name]).label(name) if name in coded else col.label(name)

    cols = [pt.c.session_id, pt.c.message_id, pt.c.id.label("part_id"), pt.c.tool, cat(pt.c.status, "status"),
            pt.c.time_start.label("start"), pt.c.time_end.label("end")]
    if tools_only:
        cols += [pt.c.call_id, pt.c.interrupted, cat(pt.c.interrupt_reason, "interrupt_reason"), pt.c.recalled]
    # members that only the JSON document holds: (name, path, as_json)
    if tools_only:
        wanted = [("input", ("state", "input"), True), ("output", ("state", "output"), False),
                  ("error", ("state", "error"), False), ("metadata", ("state", "metadata"), True)]
    else:
        cols.append(cat(pt.c.type, "type"))
        wanted = [("text", ("text",), False), ("summary", ("summary",), False)]
    exprs = {name: _json_value(dialect, pt.c.data, path, as_json=as_json) for name, path, as_json in wanted}
    in_python = any(e is None for e in exprs.values())
    if in_python:
        cols.append(pt.c.data)
    elif tools_only:
        cols.extend(e.label(name) for name, e in exprs.items())
    else:
        # only text/reasoning parts carry text, only compaction parts a summary: one column
        cols.append(sa.case((pt.c.type.in_(("text", "reasoning")), exprs["text"]),
                            (pt.c.type == "compaction", exprs["summary"]), else_=sa.null()).label("text"))
    if not in_python and ids is None and since is None and until is None and _split_ok(sql):
        # to the helper: what costs SQLite the most (JSON) and, for parts, the two repeated
        # ids, so that both connections take about as long
        heavy = {"input", "output", "error", "metadata"} if tools_only else {"session_id", "message_id", "text"}
        return _fetch_split(sql, pt.c.id, [pt.c.type.concat("") == "tool"] if tools_only else [],
                            [pt.c.id.label("part_id")] + [c for c in cols if c.name not in heavy | {"part_id"}],
                            [c for c in cols if c.name in heavy], TOOL_CALL_COLUMNS if tools_only else PART_COLUMNS,
                            coded)
    stmt = sa.select(*cols)
    if tools_only:
        # ``type || ''`` keeps SQLite from walking ix_we0_parts_tool and looking up a third of
        # the table's rows in index order (random reads): a sequential scan is ~1.5× cheaper;
        # a session filter still uses the session index, PostgreSQL plans it the same way
        stmt = stmt.where(pt.c.type.concat("") == "tool")
    if ids is not None:
        stmt = stmt.where(pt.c.session_id.in_(ids))
    if since is not None or until is not None:
        stmt = stmt.join(m, m.c.id == pt.c.message_id)
        stmt = _time_filter(stmt, m.c.created, since, until)
    raw = _fetch_columns(sql, stmt, TOOL_CALL_COLUMNS if tools_only else PART_COLUMNS, coded)
    if in_python:  # a database without JSON functions we know: extract here
        data = raw.pop("data")
        got = {name: _py_json_value(data, path, as_json) for name, path, as_json in wanted}
        if tools_only:
            raw.update(got)
        else:
            raw["text"] = [tx if t in ("text", "reasoning") else sm if t == "compaction" else None
                           for t, tx, sm in zip(raw["type"].to_pylist(), got["text"], got["summary"])]
    return raw


# --------------------------------------------------------------------------- public views


def _view(p: Any, session_id: SessionIds, since: TimeLike, until: TimeLike, spec: dict, group: Optional[str],
          from_sql: Callable, from_port: Callable) -> pd.DataFrame:
    ids, lo, hi = _session_ids(session_id), _bound(since, "since"), _bound(until, "until")
    if ids == []:
        return _build({}, spec, group)
    src = _source(p)
    if isinstance(src, _Sql):
        # a long id list is not sent as bound parameters (SQLite allows ~32k): filter after
        sql_ids = ids if ids is None or len(ids) <= _MAX_SQL_IDS else None
        # fetched rows are tracked tuples: with the cyclic GC on, allocating a million of
        # them triggers repeated full collections that cost more than the fetch itself
        with src, _gc_paused():
            raw = from_sql(src, sql_ids, lo, hi)
            if sql_ids is None and ids is not None:
                raw = _keep_sessions(raw, ids)
            return _build(raw, spec, group)
    return _build(from_port(src, ids, lo, hi), spec, group)


_MAX_SQL_IDS = 1000


def _keep_sessions(raw: dict[str, Any], ids: list[str]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pc.is_in(_arrow(raw["session_id"], pa.large_string()), value_set=pa.array(ids, pa.large_string()))
    keep = mask.to_numpy(zero_copy_only=False)
    out: dict[str, Any] = {}
    for name, v in raw.items():
        if isinstance(v, pa.Array):
            out[name] = v.filter(mask)
        elif isinstance(v, np.ndarray):
            out[name] = v[keep]
        else:
            out[name] = [x for x, k in zip(v, keep) if k]
    return out


def sessions_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None,
                batch: Optional[str] = None) -> pd.DataFrame:
    """One row per session: id, title, created/updated (UTC), duration, message count, revert point.

    ``batch``: only the sessions of that batch's items (see :func:`~we0nb.batch_df`).
    """
    if batch is not None:
        from .batch_frames import batch_session_ids

        ids = batch_session_ids(p, batch)
        wanted = _session_ids(session_id)
        session_id = ids if wanted is None else [s for s in ids if s in set(wanted)]
    return _view(p, session_id, since, until, SESSION_COLUMNS, None,
                 lambda src, ids, lo, hi: _sql_sessions(src, ids, lo, hi),
                 lambda src, ids, lo, hi: _port_sessions(src.persistence, ids, lo, hi))


def messages_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None) -> pd.DataFrame:
    """One row per message: role, times, duration, model, finish reason, error, tokens (Int64)."""
    return _view(p, session_id, since, until, MESSAGE_COLUMNS, "session_id",
                 lambda src, ids, lo, hi: _sql_messages(src, ids, lo, hi),
                 lambda src, ids, lo, hi: _port_messages_raw(src.persistence, ids, lo, hi))


def parts_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None, until: TimeLike = None) -> pd.DataFrame:
    """One row per part (text, reasoning, tool, step start/finish, compaction).

    ``text`` holds a text/reasoning part's text or a compaction's summary; tool parts
    carry ``tool`` and ``status`` (their call id, input, output, error and the
    interrupt/recall flags are in :func:`tool_calls_df`, which joins on ``part_id``).
    """
    return _view(p, session_id, since, until, PART_COLUMNS, "message_id",
                 lambda src, ids, lo, hi: _sql_parts(src, ids, lo, hi, tools_only=False),
                 lambda src, ids, lo, hi: _port_parts_raw(src.persistence, ids, lo, hi, tools_only=False))


def tool_calls_df(p: Any, session_id: SessionIds = None, *, since: TimeLike = None,
                  until: TimeLike = None) -> pd.DataFrame:
    """One row per tool call: tool, status, input/metadata (JSON), output, error, flags, times.

    ``interrupted`` marks calls stopped without a result (``interrupt_reason`` is
    ``"resume"``, ``"prompt"`` or ``"blocked"``); ``recalled`` marks read-only calls that a
    resume executed again; ``error`` is the error text (also for interrupted calls).
    ``order`` counts the calls of each session from 1.
    """
    return _view(p, session_id, since, until, TOOL_CALL_COLUMNS, "session_id",
                 lambda src, ids, lo, hi: _sql_parts(src, ids, lo, hi, tools_only=True),
                 lambda src, ids, lo, hi: _port_parts_raw(src.persistence, ids, lo, hi, tools_only=True))


# --------------------------------------------------------------------------- summary

SUMMARY_COLUMNS: dict[str, str] = {
    "session_id": "string",
    "title": "string",
    "created": _TIME_DTYPE,
    "updated": _TIME_DTYPE,
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
    "wall_time": _TD_DTYPE,
    "step_time": _TD_DTYPE,
    "tool_time": _TD_DTYPE,
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
    last = msgs["completed"].fillna(msgs["created"])
    mg = msgs.assign(_last=last).groupby("session_id", sort=False)
    out["wall_time"] = mg["_last"].max() - mg["created"].min()
    out["step_time"] = asst.groupby("session_id", sort=False)["duration"].sum()
    out["tool_time"] = cg["duration"].sum()
    for col in ("input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens"):
        out[col] = asst.groupby("session_id", sort=False)[col].sum(min_count=1)
    out = out.reset_index()
    for col, dtype in SUMMARY_COLUMNS.items():
        if dtype == "int64":
            out[col] = out[col].fillna(0).astype("int64")
        elif dtype == _TD_DTYPE:
            s = out[col]
            if col in ("step_time", "tool_time"):
                s = s.fillna(pd.Timedelta(0))
            out[col] = s.astype(_TD_DTYPE)
        else:
            out[col] = out[col].astype(dtype)
    return out[list(SUMMARY_COLUMNS)]


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

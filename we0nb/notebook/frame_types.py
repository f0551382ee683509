"""The frames' typing step: each frame's columns, and plain columns → one typed DataFrame.

Both routes end here — chunks of columns read from SQL (:mod:`we0nb.persistence.sql.columns`)
and the columns made from transcripts loaded through a persistence's port — so the same
history gives the same frame whatever the backend. :func:`convert` turns a chunk of plain
Python columns into Arrow/NumPy arrays (no Python object per row); :func:`build` joins the
chunks, sorts the rows by their ids (code-point order, as Python sorts, whatever the
database's collation) and types each column.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import pandas as pd

from .._text import clean
from ..persistence.sql.columns import CATEGORIES

__all__ = ["ROLES", "PART_TYPES", "STATUSES", "INTERRUPT_REASONS", "APPROVALS", "OUTCOMES", "FIXED_CATEGORIES",
           "SESSION_COLUMNS", "MESSAGE_COLUMNS", "PART_COLUMNS", "TOOL_CALL_COLUMNS",
           "TIME_DTYPE", "TD_DTYPE", "convert", "build"]

ROLES = CATEGORIES["role"]
PART_TYPES = CATEGORIES["type"]
STATUSES = CATEGORIES["status"]
INTERRUPT_REASONS = CATEGORIES["interrupt_reason"]
#: a call's approval: awaiting a person's decision, approved or denied (NA: it needed none)
APPROVALS = CATEGORIES["approval"]
#: what became of a finished tool call (see :data:`TOOL_CALL_COLUMNS`; SPEC §11 added the last two)
OUTCOMES = ("keep", "recall", "interrupt", "reconciled", "in_doubt")
FIXED_CATEGORIES = {**CATEGORIES, "outcome": OUTCOMES}

# kind: "id"/"str"/"json" → string; "time" → datetime64[us, UTC] from epoch seconds;
# "usd" → float64 (NaN: unknown); "int" → Int64; "count"/"order" → int64; "bool" → bool; "nbool" → boolean
# (nullable); "cat:<name>" → categorical;
# ("td", start, end) → end - start as timedelta64[us]; ("outcome",) → from status and the
# flags (derived, not read).

SESSION_COLUMNS: dict[str, Any] = {
    "session_id": "id",
    "title": "str",
    "created": "time",
    "updated": "time",
    "duration": ("td", "created", "updated"),
    "messages": "count",
    "revert_message_id": "str",
    "forked_from": "str",
    "forked_at": "str",
    "cost": "usd",
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
    "cost": "usd",
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

# what people read first; times next; the ids that join it to the other frames last
TOOL_CALL_COLUMNS: dict[str, Any] = {
    "tool": "cat:tool",
    "status": "cat:status",
    "outcome": ("outcome",),
    "input": "json",
    "output": "str",
    "error": "str",
    "duration": ("td", "start", "end"),
    "interrupted": "bool",
    "interrupt_reason": "cat:interrupt_reason",
    "in_doubt": "nbool",
    "recalled": "bool",
    "reconciled": "bool",
    "attempts": "count",
    "approval": "cat:approval",
    "approval_reason": "str",
    "approved_input": "json",
    "decided": "time",
    "metadata": "json",
    "attachments": "count",
    "start": "time",
    "end": "time",
    "session_id": "id",
    "order": "order",
    "message_id": "id",
    "part_id": "id",
    "call_id": "str",
    "idempotency_key": "str",
}

TIME_DTYPE = "datetime64[us, UTC]"
TD_DTYPE = "timedelta64[us]"
_STRING = pd.StringDtype()
_SORT_KEYS = ("session_id", "message_id", "part_id")


def _read(kind: Any) -> Optional[str]:
    """How a column of ``kind`` is read: "s" text, "f" float, "i" nullable int, "n" int, "b" bool,
    "B" nullable bool."""
    if isinstance(kind, tuple) or kind == "order":
        return None  # derived
    if kind in ("id", "str", "json") or kind.startswith("cat:"):
        return "s"
    return {"time": "f", "usd": "f", "int": "i", "count": "n", "bool": "b", "nbool": "B"}[kind]


# --------------------------------------------------------------------------- chunks


def _strings(values: Any) -> Any:
    import pyarrow as pa

    try:
        return pa.array(values, type=pa.large_string())
    except (pa.ArrowTypeError, pa.ArrowInvalid, UnicodeEncodeError):
        # a document holding a number where text belongs, or a lone surrogate escape that the engine
        # never writes (it repairs them: see we0nb._text) but a row edited by hand can hold
        return pa.array([v if v is None else clean(v) if isinstance(v, str) else str(v) for v in values],
                        type=pa.large_string())


def convert(chunk: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A chunk of plain columns (sequences of Python values, None for missing) as arrays."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name, values in chunk.items():
        how = _read(spec.get(name, "str"))
        if how is None:
            continue
        if how == "s":
            out[name] = _strings(values)
        elif how == "i":
            out[name] = pa.array(values, type=pa.int64())
        elif how == "B":
            out[name] = pa.array(values, type=pa.bool_())
        else:
            out[name] = np.array(values, dtype=_NUMPY[how]).reshape(len(values))
    return out


_NUMPY: dict[str, Any] = {"f": "float64", "n": "int64", "b": bool}


def _join(parts: list, how: str) -> Any:
    """One column from its chunks: a (chunked) Arrow array or a NumPy array."""
    import pyarrow as pa

    if how in ("s", "i", "B"):  # chunked: joining a million strings would copy them all again
        return pa.chunked_array(parts, type={"s": pa.large_string(), "i": pa.int64(), "B": pa.bool_()}[how])
    if not parts:
        return np.zeros(0, dtype={"f": "float64", "n": "int64", "b": bool}[how])
    return np.concatenate(parts)


# --------------------------------------------------------------------------- typing


def _categorical(col: Any, name: str) -> pd.Categorical:
    """Categorical with string categories: the fixed ones first (role, type …), others sorted.

    Only the values that occur become categories, besides the fixed ones.
    """
    import pyarrow as pa

    fixed = FIXED_CATEGORIES.get(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    enc = col.dictionary_encode()
    values = enc.dictionary.to_pylist()
    codes = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype("int64")
    used = np.zeros(len(values) + 1, dtype=bool)
    used[codes] = True  # code -1 marks the last slot
    present = [v for v, u in zip(values, used) if u]
    if fixed is not None:
        cats = list(fixed) + sorted(v for v in present if v not in fixed)
    else:
        cats = sorted(present)
    pos = {c: i for i, c in enumerate(cats)}
    remap = np.array([pos.get(v, -1) for v in values] + [-1], dtype="int64")  # code -1 → last entry → -1
    return pd.Categorical.from_codes(remap[codes], dtype=_cat_dtype(cats))


def _cat_dtype(cats: list[str]) -> pd.CategoricalDtype:
    return pd.CategoricalDtype(pd.Index(cats, dtype=_STRING))


def _integers(arr: Any) -> Any:
    mask = np.asarray(arr.is_null(), dtype=bool)
    data = np.asarray(arr.fill_null(0), dtype="int64")
    return pd.arrays.IntegerArray(data, mask)


def _booleans(arr: Any) -> Any:
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    mask = np.asarray(arr.is_null(), dtype=bool)
    data = np.asarray(arr.fill_null(False), dtype=bool)
    return pd.arrays.BooleanArray(data, mask)


def _to_time(seconds: np.ndarray) -> pd.DatetimeIndex:
    """Epoch seconds → UTC times in whole microseconds, rounding half up (the same arithmetic
    on every route); NaN → NaT. Built as int64 microseconds: ~10x cheaper than to_datetime."""
    us = np.floor(seconds * 1e6 + 0.5)
    ints = np.where(np.isnan(us), np.iinfo(np.int64).min, us).astype("int64")  # int64 min is NaT
    return pd.DatetimeIndex(ints.view("datetime64[us]")).tz_localize("UTC")


def _order(keys: Any) -> np.ndarray:
    """1-based position within runs of equal consecutive keys (rows are sorted by group)."""
    import pyarrow.compute

    pc: Any = pyarrow.compute  # (its functions are made at import time: no static names to check)

    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype="int64")
    new = np.empty(n, dtype=bool)
    new[0] = True
    new[1:] = np.asarray(pc.not_equal(keys.slice(1), keys.slice(0, n - 1)), dtype=bool)
    idx = np.arange(n, dtype="int64")
    start = np.maximum.accumulate(np.where(new, idx, 0))
    return idx - start + 1


def _outcome(status: pd.Categorical, interrupted: np.ndarray, recalled: np.ndarray, in_doubt: Any,
             reconciled: np.ndarray) -> pd.Categorical:
    """What became of a finished call (completed or error), NA while unfinished: ``in_doubt``
    (interrupted while running), ``interrupt`` (any other interrupt), ``reconciled`` (completed by
    its reconcile), ``recall`` (executed again by a resume), else ``keep``."""
    doubt = np.asarray(in_doubt.fillna(False), dtype=bool)
    codes = np.where(interrupted, np.where(doubt, 4, 2), np.where(reconciled, 3, np.where(recalled, 1, 0)))
    finished = np.asarray(pd.Series(status).isin(["completed", "error"]), dtype=bool)
    return pd.Categorical.from_codes(np.where(finished, codes, -1), dtype=_cat_dtype(list(OUTCOMES)))


def _in_order(keys: list) -> bool:
    """Whether the rows are already sorted by ``keys`` (no nulls): a few vector compares, no sort."""
    import pyarrow.compute

    pc: Any = pyarrow.compute  # (its functions are made at import time: no static names to check)

    n = len(keys[0])
    ok = None
    for col in reversed(keys):  # ok_i: row i <= row i+1, from the last key to the first
        a, b = col.slice(0, n - 1), col.slice(1)
        ok = pc.less_equal(a, b) if ok is None else pc.or_(pc.less(a, b), pc.and_(pc.equal(a, b), ok))
    return bool(pc.all(ok).as_py())


def _sorted(base: dict[str, Any], n: int) -> dict[str, Any]:
    """Rows in id order (session, message, part); most reads already are, then nothing moves."""
    import pyarrow as pa
    import pyarrow.compute

    pc: Any = pyarrow.compute  # (its functions are made at import time: no static names to check)

    keys = [k for k in _SORT_KEYS if k in base]
    if n < 2 or not keys or _in_order([base[k] for k in keys]):
        return base
    order = pc.sort_indices(pa.table({k: base[k] for k in keys}), sort_keys=[(k, "ascending") for k in keys])
    idx = order.to_numpy()

    def take(v: Any) -> Any:
        return v.take(order) if isinstance(v, (pa.Array, pa.ChunkedArray)) else v[idx]

    return {k: take(v) for k, v in base.items()}


def build(chunks: list[dict[str, Any]], spec: dict[str, Any], group: Optional[str]) -> pd.DataFrame:
    """The typed frame of ``spec`` from converted chunks (see :func:`convert`).

    ``group`` is the column that ``order`` counts within (None: the whole frame).
    """
    n = sum(len(next(iter(c.values()))) for c in chunks if c)
    base: dict[str, Any] = {}
    for name, kind in spec.items():
        how = _read(kind)
        if how is None:
            continue
        base[name] = _join([c[name] for c in chunks], how)
    base = _sorted(base, n)
    cols: dict[str, Any] = {}
    for name, kind in spec.items():
        if kind == "order":
            cols[name] = _order(base[group]) if group else np.arange(1, n + 1, dtype="int64")
        elif isinstance(kind, tuple):
            continue
        elif kind in ("id", "str", "json"):
            cols[name] = pd.array(base[name], dtype=_STRING)
        elif kind == "time":
            cols[name] = _to_time(base[name])
        elif kind == "int":
            cols[name] = _integers(base[name])
        elif kind == "nbool":
            cols[name] = _booleans(base[name])
        elif kind.startswith("cat:"):
            cols[name] = _categorical(base[name], name)
        else:
            cols[name] = base[name]
    out: dict[str, Any] = {}
    for name, kind in spec.items():
        if kind == ("outcome",):
            out[name] = _outcome(cols["status"], cols["interrupted"], cols["recalled"], cols["in_doubt"],
                                 cols["reconciled"])
        elif isinstance(kind, tuple):
            out[name] = (cols[kind[2]] - cols[kind[1]]).as_unit("us")
        else:
            out[name] = cols[name]
    return pd.DataFrame(out, copy=False)

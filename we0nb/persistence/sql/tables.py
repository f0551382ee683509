"""The SQL schema (SQLAlchemy Core), shared by SqlPersistence and the data-frame views.

Each row keeps the full JSON document (``data``, the exact pydantic dump) plus the
columns that queries, indexes and data frames need. Times are epoch seconds (floats).

Column semantics (SqlPersistence fills them, the frames read them):

* ``we0_parts.status`` — the tool state's status for ``type == "tool"``, else NULL;
  ``time_start``/``time_end`` — the tool state's times, a text/reasoning part's times, or
  the step part's ``time`` (both); ``interrupted``/``interrupt_reason``/``recalled`` —
  ``state.metadata["interrupted"]``, ``["reason"]`` (of an interrupted call), ``["recalled"]`` of tool parts.
* ``we0_messages`` — the message's fields flattened; token columns NULL for user messages.
* ``we0_messages.model_view`` — the message as the model sees it (``we0nb.models.view``),
  written with its final write; a trigger on ``we0_parts`` and every rewrite of the message
  reset it to NULL, so a view never outlives the rows it was made from.
* ordering — ids sort in creation order (see ``we0nb._ids``), so ``ORDER BY id`` is history.
* strings — every flattened string column holds :func:`cut` of its field: a NUL character
  becomes U+FFFD (PostgreSQL text cannot hold NUL) and a value longer than its column is
  cut; ``data`` keeps the exact value. Ids are stored as they are (keys); session ids are at
  most :data:`SESSION_ID_MAX` characters (schema version 3 widened the columns from 64).

The DDL beyond these tables (triggers, upgrades of older versions) is in ``schema.py``.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text

__all__ = ["SCHEMA_VERSION", "SESSION_ID_MAX", "metadata", "meta", "sessions", "messages", "parts", "leases",
           "batches", "batch_items", "scores", "cut", "session_columns", "message_columns", "part_columns"]

#: bump when the tables change; a database with a higher version is refused, an older one
#: is upgraded in place (``schema.py``)
SCHEMA_VERSION = 9

#: the longest session id (characters). Every session-id column has this width (schema 3;
#: PostgreSQL enforces it), and ``build_request`` refuses longer ids up front.
SESSION_ID_MAX = 255

metadata = MetaData()

meta = Table(
    "we0_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

sessions = Table(
    "we0_sessions",
    metadata,
    Column("id", String(SESSION_ID_MAX), primary_key=True),
    Column("title", Text, nullable=False, default=""),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("revert_message_id", String(64), nullable=True),
    Column("data", Text, nullable=False),
)

messages = Table(
    "we0_messages",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(SESSION_ID_MAX), nullable=False),
    Column("role", String(16), nullable=False),
    Column("created", Float, nullable=False),
    Column("completed", Float, nullable=True),
    Column("parent_id", String(64), nullable=True),
    Column("model_id", String(128), nullable=True),
    Column("finish_reason", String(32), nullable=True),
    Column("error_reason", String(128), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("input_tokens", Integer, nullable=True),
    Column("output_tokens", Integer, nullable=True),
    Column("reasoning_tokens", Integer, nullable=True),
    Column("cached_tokens", Integer, nullable=True),
    Column("summary", Boolean, nullable=False, default=False),
    Column("data", Text, nullable=False),
    Column("model_view", Text, nullable=True),
    Index("ix_we0_messages_session", "session_id", "id"),
    sqlite_with_rowid=False,
)

parts = Table(
    "we0_parts",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("session_id", String(SESSION_ID_MAX), nullable=False),
    Column("message_id", String(64), nullable=False),
    Column("type", String(16), nullable=False),
    Column("tool", String(128), nullable=True),
    Column("call_id", String(128), nullable=True),
    Column("status", String(16), nullable=True),
    Column("time_start", Float, nullable=True),
    Column("time_end", Float, nullable=True),
    Column("interrupted", Boolean, nullable=False, default=False),
    Column("interrupt_reason", String(16), nullable=True),
    Column("recalled", Boolean, nullable=False, default=False),
    Column("data", Text, nullable=False),
    # the only index beside the key: every tool part write maintained a tool index too (schema
    # 2-8), which no query of we0nb used (the frames scan the table, ~1.5x cheaper than its
    # random reads), for a WAL page per commit; schema 9 drops it
    Index("ix_we0_parts_session", "session_id", "message_id", "id"),
    sqlite_with_rowid=False,
)

leases = Table(
    "we0_leases",
    metadata,
    Column("session_id", String(SESSION_ID_MAX), primary_key=True),
    Column("owner", String(256), nullable=False),
    Column("host", String(128), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("expires", Float, nullable=False),
)

# batches (schema 4): a named list of prompts, one session per item (``we0nb.batch``). An
# item is claimable when ``queued`` and ``expires`` < now; a claim sets ``status`` running,
# ``owner``/``host``/``pid`` and an ``expires`` the owner keeps renewing (see
# ``we0nb.persistence.batches``). Counts are the item's session totals.
batches = Table(
    "we0_batches",
    metadata,
    Column("name", String(SESSION_ID_MAX), primary_key=True),
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("items", Integer, nullable=False),
    Column("fingerprint", String(64), nullable=False),
)

batch_items = Table(
    "we0_batch_items",
    metadata,
    Column("batch", String(SESSION_ID_MAX), primary_key=True),
    Column("item", Integer, primary_key=True, autoincrement=False),
    Column("session_id", String(SESSION_ID_MAX), nullable=False),
    Column("prompt", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("queued", Boolean, nullable=False),
    Column("owner", String(256), nullable=True),
    Column("host", String(128), nullable=True),
    Column("pid", Integer, nullable=True),
    Column("expires", Float, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("started", Float, nullable=True),
    Column("finished", Float, nullable=True),
    Column("duration", Float, nullable=False),
    Column("text", Text, nullable=True),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("steps", Integer, nullable=False),
    Column("tool_calls", Integer, nullable=False),
    Column("input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    # the token of the claim that took the item last (schema 7): chosen by the claimer, so a
    # claim whose answer was lost finds its own rows (``we0nb.persistence.sql.pg_retry``)
    Column("claim", String(64), nullable=True),
    # what a claim looks for: the first queued items of a batch, in item order, whose claim
    # expired (``expires`` in the index: the running items it passes over are skipped without
    # reading their rows; schema 6 — 4 and 5 had (batch, queued, expires), which sorted every
    # queued item on each claim)
    Index("ix_we0_batch_items_next", "batch", "queued", "item", "expires"),
    Index("ix_we0_batch_items_session", "session_id"),
)


# scores (schema 7): what ``batch.score`` found per item and scorer (``we0nb.persistence.scores``);
# ``passed`` NULL for a scorer that gave a number only, ``judge_session_id`` the verdict's session
scores = Table(
    "we0_scores",
    metadata,
    Column("batch", String(SESSION_ID_MAX), primary_key=True),
    Column("item", Integer, primary_key=True, autoincrement=False),
    Column("scorer", String(128), primary_key=True),
    Column("session_id", String(SESSION_ID_MAX), nullable=False),
    Column("value", Float, nullable=False),
    Column("passed", Boolean, nullable=True),
    Column("reason", Text, nullable=False),
    Column("judge_session_id", String(SESSION_ID_MAX), nullable=True),
    Column("created", Float, nullable=False),
)


# --------------------------------------------------------------------------- flattening
# The one definition of the flattened columns: SqlPersistence writes them, and the
# data-frame views apply them to in-memory transcripts, so both routes give one frame.


#: what a NUL character becomes in a flattened column (PostgreSQL text cannot hold NUL);
#: the ``data`` JSON keeps the exact value (``\u0000``), so every object round-trips
NUL_REPLACEMENT = "\ufffd"


def cut(s: Optional[str], n: Optional[int] = None) -> Optional[str]:
    """A string as its flattened column holds it: NUL → U+FFFD, at most ``n`` characters.

    Every backend stores the same value (SQLite could keep a NUL, PostgreSQL cannot), and
    the frames apply these functions to in-memory transcripts too: one frame everywhere.
    """
    if s is None:
        return None
    if "\x00" in s:
        s = s.replace("\x00", NUL_REPLACEMENT)
    if n is not None and len(s) > n:
        return s[:n]
    return s


def session_columns(s: Any) -> dict[str, Any]:
    """A session's flattened columns (all but ``data``)."""
    return {
        "id": s.id,
        "title": cut(s.title),
        "created": s.time.created,
        "updated": s.time.updated,
        "revert_message_id": s.revert.message_id if s.revert is not None else None,
    }


def message_columns(m: Any) -> dict[str, Any]:
    """A message's flattened columns (all but ``data``)."""
    err = m.error
    row = {
        "id": m.id,
        "session_id": m.session_id,
        "role": m.role,
        "created": m.time.created,
        "completed": m.time.completed,
        "error_reason": cut(err.reason, 128) if err is not None else None,
        "error_message": cut(err.message) if err is not None else None,
    }
    if m.role == "assistant":
        u = m.usage  # type: ignore[union-attr]
        row.update(
            parent_id=m.parent_id,  # type: ignore[union-attr]
            model_id=cut(m.model_id, 128),  # type: ignore[union-attr]
            finish_reason=cut(m.finish_reason, 32),  # type: ignore[union-attr]
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            reasoning_tokens=u.reasoning_tokens,
            cached_tokens=u.cached_tokens,
            summary=bool(m.summary),  # type: ignore[union-attr]
        )
    else:
        row.update(parent_id=None, model_id=None, finish_reason=None, input_tokens=None,
                   output_tokens=None, reasoning_tokens=None, cached_tokens=None, summary=False)
    return row


def part_columns(p: Any) -> dict[str, Any]:
    """A part's flattened columns (all but ``data``), as the module docstring describes."""
    ptype = p.type
    tool = call_id = status = reason = None
    start = end = None
    interrupted = recalled = False
    if ptype == "tool":
        st = p.state
        tool, call_id, status = cut(p.tool, 128), cut(p.call_id, 128), st.status
        t = getattr(st, "time", None)
        if t is not None:
            start, end = t.start, t.end
        md = getattr(st, "metadata", None)
        if md:
            interrupted = md.get("interrupted") is True
            recalled = md.get("recalled") is True
            r = md.get("reason")  # (an interrupt's; a denial's reason is its approval's, not this column's)
            reason = cut(r, 16) if interrupted and isinstance(r, str) else None
    elif ptype == "text" or ptype == "reasoning":
        t = p.time
        if t is not None:
            start, end = t.start, t.end
    else:  # step-start, step-finish, compaction: a single time
        start = end = p.time
    return {
        "id": p.id,
        "session_id": p.session_id,
        "message_id": p.message_id,
        "type": ptype,
        "tool": tool,
        "call_id": call_id,
        "status": status,
        "time_start": start,
        "time_end": end,
        "interrupted": interrupted,
        "interrupt_reason": reason,
        "recalled": recalled,
    }

"""The SQL schema (SQLAlchemy Core), shared by SqlPersistence and the data-frame views.

Each row keeps the full JSON document (``data``, the exact pydantic dump) plus the
columns that queries, indexes and data frames need. Times are epoch seconds (floats).

Column semantics (SqlPersistence fills them, the frames read them):

* ``we0_parts.status`` — the tool state's status for ``type == "tool"``, else NULL;
  ``time_start``/``time_end`` — the tool state's times, a text/reasoning part's times, or
  the step part's ``time`` (both); ``interrupted``/``interrupt_reason``/``recalled`` —
  ``state.metadata["interrupted"]``, ``["reason"]``, ``["recalled"]`` of tool parts.
* ``we0_messages`` — the message's fields flattened; token columns NULL for user messages.
* ``we0_messages.model_view`` — the message as the model sees it (``we0nb.models.view``),
  written with its final write; a trigger on ``we0_parts`` and every rewrite of the message
  reset it to NULL, so a view never outlives the rows it was made from.
* ordering — ids sort in creation order (see ``we0nb._ids``), so ``ORDER BY id`` is history.
"""

from __future__ import annotations

from typing import Any, Optional

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, Text, text

__all__ = ["SCHEMA_VERSION", "metadata", "meta", "sessions", "messages", "parts", "leases",
           "cut", "message_columns", "part_columns", "triggers", "upgrade"]

#: bump when the tables change; a database with a higher version is refused, an older one
#: is upgraded in place (:func:`upgrade`)
SCHEMA_VERSION = 2

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
    Column("id", String(64), primary_key=True),
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
    Column("session_id", String(64), nullable=False),
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
    Column("session_id", String(64), nullable=False),
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
    Index("ix_we0_parts_session", "session_id", "message_id", "id"),
    # tool calls by tool and status, for analytics; partial, so the writes of the other
    # parts (step marks, text) do not maintain it
    Index("ix_we0_parts_tool", "tool", "status", sqlite_where=text("type = 'tool'"),
          postgresql_where=text("type = 'tool'")),
    sqlite_with_rowid=False,
)

leases = Table(
    "we0_leases",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("owner", String(256), nullable=False),
    Column("host", String(128), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("expires", Float, nullable=False),
)


# --------------------------------------------------------------------------- DDL beyond the tables

_STALE = "UPDATE we0_messages SET model_view = NULL WHERE id = NEW.message_id AND model_view IS NOT NULL"


def triggers(dialect: str) -> list[str]:
    """The statements that make a part write drop its message's model view."""
    if dialect == "sqlite":
        return [f"CREATE TRIGGER IF NOT EXISTS we0_parts_view_{op.lower()} AFTER {op} ON we0_parts "
                f"BEGIN {_STALE}; END" for op in ("INSERT", "UPDATE")]
    if dialect == "postgresql":
        # the messages table of the trigger's own schema, whatever the writer's search_path
        return [
            "CREATE OR REPLACE FUNCTION we0_parts_view_stale() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "EXECUTE 'UPDATE ' || quote_ident(TG_TABLE_SCHEMA) || '.we0_messages SET model_view = NULL "
            "WHERE id = $1 AND model_view IS NOT NULL' USING NEW.message_id; RETURN NULL; END $$",
            "DROP TRIGGER IF EXISTS we0_parts_view ON we0_parts",
            "CREATE TRIGGER we0_parts_view AFTER INSERT OR UPDATE ON we0_parts "
            "FOR EACH ROW EXECUTE FUNCTION we0_parts_view_stale()",
        ]
    return []


def _create_index(index: Index, dialect: str) -> str:
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex

    d = sqlite.dialect() if dialect == "sqlite" else postgresql.dialect()
    return str(CreateIndex(index).compile(dialect=d))


def upgrade(version: int, dialect: str) -> list[str]:
    """The statements that bring a database at schema ``version`` to :data:`SCHEMA_VERSION`."""
    out: list[str] = []
    if version < 2:  # 1 → 2: the model-view cache; the tool index made partial
        out.append("ALTER TABLE we0_messages ADD COLUMN model_view TEXT")
        out.extend(triggers(dialect))
        out.append("DROP INDEX IF EXISTS ix_we0_parts_tool")
        tool_index = next(i for i in parts.indexes if i.name == "ix_we0_parts_tool")
        out.append(_create_index(tool_index, dialect))
    return out


# --------------------------------------------------------------------------- flattening
# The one definition of the flattened columns: SqlPersistence writes them, and the
# data-frame views apply them to in-memory transcripts, so both routes give one frame.


def cut(s: Optional[str], n: int) -> Optional[str]:
    """Fit a value to its column's length (PostgreSQL enforces them); ``data`` keeps it whole."""
    if s is not None and len(s) > n:
        return s[:n]
    return s


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
        "error_message": err.message if err is not None else None,
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
            r = md.get("reason")
            reason = cut(r, 16) if isinstance(r, str) else None
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

"""A tool call's exactly-once facts (SPEC §11), read from the SQL tables in bulk.

The engine writes ``idempotency_key``, ``attempt``, ``in_doubt`` and ``reconciled`` into a tool
state's metadata; :class:`~we0nb.messages.ToolPart` is the one reading of them. Here the database
extracts each member only when its JSON type is the one the engine writes (so a member of
another type reads as absent on every backend, as it does through ``ToolPart``), and
:func:`exactly_once_columns` turns the extracted values into the frame's columns through the
same functions ``ToolPart`` uses (:func:`~we0nb.messages.in_doubt_of` …).
"""

from __future__ import annotations

from typing import Any, Sequence

from ...messages import attempts_of, call_key_of, in_doubt_of

__all__ = ["MEMBERS", "typed", "member_of", "exactly_once_columns"]

#: the §11 metadata members a tool call's row reads, and the JSON type each must have
MEMBERS = (("idempotency_key", "string"), ("attempt", "integer"), ("in_doubt", "boolean"), ("reconciled", "boolean"))


def typed(dialect: str, col: Any, path: Sequence[str], kind: str) -> Any:
    """A member of ``data`` when its JSON type is ``kind``, else NULL: a string or an integer as
    such (PostgreSQL: an integer as text), a boolean as the text ``true``/``false``."""
    import sqlalchemy as sa

    if dialect == "sqlite":
        where = "$." + ".".join(path)
        jtype = sa.func.json_type(col, where)
        if kind == "boolean":
            return jtype  # 'true' / 'false' for a boolean, another type's name otherwise
        return sa.case((jtype == ("text" if kind == "string" else "integer"), sa.func.json_extract(col, where)),
                       else_=sa.null())
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        member = sa.cast(col, postgresql.JSON)[tuple(path)]
        want = "number" if kind == "integer" else kind
        return sa.case((sa.func.json_typeof(member) == want, member.astext), else_=sa.null())
    return None


_BOOLEANS = {"true": True, "false": False}


def _json_value(doc: dict, path: Sequence[str]) -> Any:
    v: Any = doc
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v


def member_of(doc: dict, path: Sequence[str], kind: str) -> Any:
    """A member read off a parsed document, as :func:`typed` gives it."""
    v = _json_value(doc, path)
    if kind == "boolean":
        return ("true" if v else "false") if isinstance(v, bool) else None
    if kind == "integer":
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return v if isinstance(v, str) else None


def _int_of(v: Any) -> Any:
    """An integer member as :func:`typed` gives it (PostgreSQL: text; a non-integer number → None)."""
    if v is None or isinstance(v, int):
        return v
    try:
        return int(v)
    except ValueError:
        return None


def exactly_once_columns(chunk: dict[str, Any]) -> dict[str, Any]:
    """The exactly-once columns from the members :data:`MEMBERS` read: the key (derived for a call
    stored before keys were written), ``attempts``, ``in_doubt`` and ``reconciled``, each through
    the reading :class:`~we0nb.messages.ToolPart` uses."""
    keys, attempts = chunk.pop("_idempotency_key"), chunk.pop("_attempt")
    doubts, reconciled = chunk.pop("_in_doubt"), chunk.pop("_reconciled")
    chunk["idempotency_key"] = tuple(k if k is not None else call_key_of(s, p, None)
                                     for k, s, p in zip(keys, chunk["session_id"], chunk["part_id"]))
    chunk["attempts"] = tuple(attempts_of(_int_of(a)) for a in attempts)
    chunk["in_doubt"] = tuple(in_doubt_of(bool(i), _BOOLEANS.get(d)) for i, d in zip(chunk["interrupted"], doubts))
    chunk["reconciled"] = tuple(r == "true" for r in reconciled)
    return chunk

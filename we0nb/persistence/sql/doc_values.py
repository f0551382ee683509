"""A frame column's value read off a row's parsed JSON document, in Python: for the rows the
database cannot extract from (a document holding a NUL, a corrupt one; see :mod:`.columns`),
and the tool calls' columns the reader finishes here (approval details, exactly-once facts,
the attachment count)."""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

__all__ = ["attachment_count", "dump", "json_member", "tool_call_columns", "approval_columns", "part_text",
           "cost_of", "error_message"]

TEXT_TYPES = ("text", "reasoning")


def attachment_count(doc: dict) -> int:
    state = doc.get("state")
    found = state.get("attachments") if isinstance(state, dict) else None
    return len(found) if isinstance(found, list) else 0


def dump(obj: Any) -> str:
    import pydantic_core

    return pydantic_core.to_json(obj).decode()


def json_member(doc: dict, path: Sequence[str], as_json: bool) -> Optional[str]:
    v: Any = doc
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    if v is None:
        return None
    return v if isinstance(v, str) and not as_json else dump(v)


def tool_call_columns(chunk: dict[str, Any]) -> dict[str, Any]:
    """The approval columns, then the exactly-once ones (:func:`.call_facts.exactly_once_columns`), and
    the attachment count."""
    from .call_facts import exactly_once_columns

    chunk = exactly_once_columns(approval_columns(chunk))
    chunk["attachments"] = tuple(0 if v is None else int(v) for v in chunk["attachments"])  # (a corrupt row: 0)
    return chunk


def approval_columns(chunk: dict[str, Any]) -> dict[str, Any]:
    """A tool call's approval columns, from ``approval`` and its ``approval_detail`` document.

    The database extracts two members per row (most rows have no approval: their detail is
    NULL); the few details there are parse here: ``approval_reason`` (the reason a person gave
    with a denial, else why the call needed approval), ``approved_input`` (the arguments a
    person corrected when approving, compact JSON) and ``decided`` (epoch seconds).
    """
    details = chunk.pop("approval_detail")
    n = len(details)
    reason: list[Any] = [None] * n
    approved: list[Any] = [None] * n
    decided: list[Any] = [None] * n
    for i, text in enumerate(details):
        if text is None:
            continue
        try:
            d = json.loads(text)
        except ValueError:
            d = None
        if not isinstance(d, dict):
            continue
        approval = chunk["approval"][i]
        if approval is not None:
            reason[i] = d.get("reason" if approval == "denied" else "why")
        if d.get("input") is not None:
            approved[i] = dump(d["input"])
        t = d.get("decided")
        decided[i] = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    chunk.update(approval_reason=tuple(reason), approved_input=tuple(approved), decided=tuple(decided))
    return chunk


def part_text(doc: dict) -> Optional[str]:
    t = doc.get("type")
    return json_member(doc, ("text",), False) if t in TEXT_TYPES else \
        json_member(doc, ("summary",), False) if t == "compaction" else None


def cost_of(doc: dict) -> Optional[float]:
    v = doc.get("cost")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def error_message(doc: dict) -> Optional[str]:
    return json_member(doc, ("error", "message"), False)

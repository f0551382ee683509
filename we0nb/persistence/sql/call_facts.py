"""A tool call's exactly-once facts (SPEC §11), as columns of the SQL reader's tool-call rows.

The engine writes ``idempotency_key``, ``attempt``, ``in_doubt`` and ``reconciled`` into a tool
state's metadata; :class:`~we0nb.messages.ToolPart` is the one reading of them. The reader
already fetches each call's metadata as compact JSON text (the database extracts it, or it is
read off the parsed document), so the facts are read from that text, here, with the functions
``ToolPart`` uses — the same answer on every backend, with the JSON types kept (a ``1`` is not
``true``). Parsing the small metadata text costs less than asking the database to parse each
row's whole document again for every member (SQLite, 50 000 tool rows, interleaved, best of 5:
the read took 1.15 s with the members extracted in SQL against 0.69 s without; with this, 0.67 s).
"""

from __future__ import annotations

from typing import Any

from ...messages import attempts_of, call_key_of, in_doubt_of

__all__ = ["exactly_once_columns"]


def _metadata(text: Any) -> dict[str, Any]:
    import pydantic_core

    if not isinstance(text, str):
        return {}  # (a corrupt row: its document did not parse)
    try:
        got = pydantic_core.from_json(text)
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def exactly_once_columns(chunk: dict[str, Any]) -> dict[str, Any]:
    """``idempotency_key`` (derived for a call stored before keys were written), ``attempts``,
    ``in_doubt`` and ``reconciled`` of each row, from its ``metadata`` and ``interrupted`` columns."""
    keys, attempts, doubts, reconciled = [], [], [], []
    for sid, pid, interrupted, text in zip(chunk["session_id"], chunk["part_id"], chunk["interrupted"],
                                           chunk["metadata"]):
        md = _metadata(text)
        keys.append(call_key_of(sid, pid, md.get("idempotency_key")))
        attempts.append(attempts_of(md.get("attempt")))
        doubts.append(in_doubt_of(bool(interrupted), md.get("in_doubt")))
        reconciled.append(md.get("reconciled") is True)
    chunk.update(idempotency_key=tuple(keys), attempts=tuple(attempts), in_doubt=tuple(doubts),
                 reconciled=tuple(reconciled))
    return chunk

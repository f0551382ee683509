"""A message as the model sees it, as compact JSON: the cache kept with each final message.

A cold start of a long session would otherwise validate every stored message and part
only to convert them back into :data:`~we0nb.models.base.ModelMessage` items. Instead the
engine stores, with a message's final write, its model view (``dump_view``); a later run
reads the views of the older messages (``load_views``) and objects only for the recent
ones. The view is derived data: SqlPersistence drops it whenever the message or any of
its parts is written again, so it can never disagree with the parts it was made from.

Format: a JSON array of items, ``["u", text]`` · ``["a", text, reasoning, [[call_id, name,
input], …]]`` · ``["t", call_id, name, content, is_error]``. An assistant item with signed
or redacted reasoning blocks has a fifth element, ``[[text, signature, redacted], …]``
(views written before it existed have four and load with no blocks).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from pydantic_core import to_json

from .base import AssistantTurn, ModelMessage, ReasoningBlock, ToolCall, ToolResult, UserTurn

__all__ = ["dump_view", "load_views"]


def dump_view(items: Sequence[ModelMessage]) -> str:
    """One message's model items as a JSON array."""
    out: list[list[Any]] = []
    for m in items:
        if isinstance(m, UserTurn):
            out.append(["u", m.text])
        elif isinstance(m, AssistantTurn):
            item: list[Any] = ["a", m.text, m.reasoning, [[c.call_id, c.name, c.input] for c in m.tool_calls]]
            if m.reasoning_blocks:
                item.append([[b.text, b.signature, b.redacted] for b in m.reasoning_blocks])
            out.append(item)
        elif isinstance(m, ToolResult):
            out.append(["t", m.call_id, m.name, m.content, 1 if m.is_error else 0])
        else:  # pragma: no cover - ModelMessage has three kinds
            raise TypeError(f"not a model message: {m!r}")
    # (pydantic-core's encoder: the compact UTF-8 text ``json.dumps(out, ensure_ascii=False,
    # separators=(",", ":"))`` makes, NaN and infinities as the same constants, in a third of
    # the time: ``JSONEncoder.encode`` builds its C encoder and a closure on every call)
    return to_json(out).decode()


def load_views(views: Sequence[str]) -> list[ModelMessage]:
    """The model items of several messages' views, in order. Raises ``ValueError`` on a bad view."""
    if not views:
        return []
    try:
        decoded = json.loads("[" + ",".join(views) + "]")
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"a stored model view is not JSON: {e}") from None
    out: list[ModelMessage] = []
    append = out.append
    try:
        for items in decoded:
            for it in items:
                kind = it[0]
                if kind == "u":
                    append(UserTurn(it[1]))
                elif kind == "a":
                    turn = AssistantTurn(it[1], it[2], [ToolCall(c[0], c[1], c[2]) for c in it[3]])
                    if len(it) > 4:
                        turn.reasoning_blocks = [ReasoningBlock(b[0], b[1], b[2]) for b in it[4]]
                    append(turn)
                elif kind == "t":
                    append(ToolResult(it[1], it[2], it[3], bool(it[4])))
                else:
                    raise ValueError(f"a stored model view has an unknown item kind {kind!r}")
    except (TypeError, IndexError, KeyError) as e:
        raise ValueError(f"a stored model view is malformed: {e}") from None
    return out

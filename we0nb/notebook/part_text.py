"""What a part says as plain strings: its status label, its input, its result, clipped text.

One place for these facts, shared by the HTML renderer (:mod:`we0nb.notebook.html`) and the
plain-text one (:mod:`we0nb.notebook.plain`); nothing here is HTML-escaped. :func:`visible` is the
one place where control and bidi characters are made visible for every rendering.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["visible", "json_visible", "clip", "to_json", "dump", "denied", "edited", "tool_status", "tool_input",
           "tool_result"]

#: C0 and C1 controls (but newline and tab) and Unicode's Bidi_Control characters
#: (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069)
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: "re.Match[str]") -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: Any) -> str:
    """``text`` with its control and bidi-control characters written as escapes (``\\x1b``, ``\\u202e``).

    Raw, ESC lets model output colour a terminal's text and U+202E reorders the line it sits on
    (a status line, an approval row); a NUL or a bell has no business in a rendering either.
    ``\\r\\n`` becomes ``\\n``. Idempotent (its output holds no such character)."""
    text = "" if text is None else str(text)
    if _HIDDEN.search(text) is None:
        return text
    return _HIDDEN.sub(_escape, text.replace("\r\n", "\n"))


def json_visible(text: str) -> str:
    """JSON text with the same characters as ``\\uXXXX`` escapes: still valid JSON with the same
    value (an editable box of arguments shows them without changing what is approved)."""
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clip(text: str, limit: int) -> str:
    text = text.replace("\r", "")
    if len(text) <= limit:
        return text
    return text[:limit] + f"… (+{len(text) - limit} chars)"


def to_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def dump(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:  # pragma: no cover - exotic objects fall back to str
            return str(value)
    return value


def denied(part: Any) -> bool:
    """The call ended as a person's denial (it never ran)."""
    st = part.state
    return st.status == "error" and st.metadata.get("denied") is True


def tool_status(part: Any, cut: bool = False) -> tuple[str, str]:
    """(css status, label) of a ToolPart. ``cut``: the run was aborted, so an unfinished call
    is shown as the store holds it: cut at the abort, to be decided by a resume. A call that
    waits for a person is not cut: it waits for the decision, whatever stopped the run."""
    status = getattr(part.state, "status", "pending")
    if part.interrupted:
        return "interrupted", f"interrupted ({part.interrupt_reason or '?'})"
    if getattr(part, "awaiting_approval", False):
        return "awaiting", "awaiting approval"
    if denied(part):
        return "denied", "denied"
    if cut and status in ("pending", "running"):
        return "unfinished", f"{status} at abort"
    return status, status


def edited(part: Any) -> bool:
    detail = getattr(part, "approval_detail", None)
    return detail is not None and detail.input is not None


def tool_input(part: Any) -> str:
    st = part.state
    raw = getattr(st, "raw", None)
    if raw is not None:
        return raw
    return to_json(getattr(st, "input", {}))


def tool_result(part: Any) -> tuple[str, bool]:
    """(text, is_error)"""
    st = part.state
    if st.status == "completed":
        return st.output, False
    if st.status == "error":
        return st.error, True
    return "", False


def effects_sentence(parts: Any) -> str:
    """What recovery knows of the effects of these calls, from their stored metadata: "1 call may
    have run · 2 never started · 1 completed on resume" ("" when there is nothing to say)."""
    counts: dict[str, int] = {}
    for p in parts:
        label = getattr(p, "effect", None) if getattr(p, "type", None) == "tool" else None
        if label is not None:
            counts[label] = counts.get(label, 0) + 1
    bits = [f"{n} call{'s' if n != 1 else ''} {label}" for label, n in counts.items()]
    return " · ".join(bits)


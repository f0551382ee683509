"""What the provider wire formats share (pure: no I/O): reading fields of the SDKs' stream
objects, and a tool call's streamed arguments as its input."""

from __future__ import annotations

import json
from typing import Any, Optional, Union

__all__ = ["get", "as_int", "tool_input"]


def get(obj: Any, name: str) -> Any:
    """A field of an SDK object or of a plain dict, extra fields included (servers add their
    own); None when absent."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if extra:
            value = extra.get(name)
    return value


def as_int(x: Any) -> Optional[int]:
    """A token count as an int (None when it is not a number)."""
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def tool_input(raw: str, empty: Optional[dict[str, Any]] = None) -> Union[dict[str, Any], str]:
    """A tool call's arguments: the JSON object ``raw`` holds, ``empty`` (or ``{}``) for no
    text, or ``raw`` itself when it is not a JSON object (the engine answers the model with
    a tool error)."""
    if not raw.strip():
        return {} if empty is None else empty
    try:
        # strict=False: a raw newline or tab inside a string (small models write them,
        # llama.cpp's JSON grammar lets them through) is taken as that character
        value = json.loads(raw, strict=False)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack (the engine says so)
        return raw
    return value if isinstance(value, dict) else raw

"""How deep a model's JSON may nest: deeper arguments are a tool error, never a crash.

Parsing, copying, validating and storing a JSON value all recurse once per level, so a value
a few thousand levels deep (a model can send ``[[[[…`` 100,000 times) would exhaust Python's
stack somewhere on its way into the transcript. Tool arguments deeper than
:data:`MAX_JSON_DEPTH` are refused where they enter; no real tool schema comes near it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_JSON_DEPTH", "too_deep", "clip_depth", "deep_message"]

#: the deepest nesting of tool arguments taken (the object of the arguments is level 1)
MAX_JSON_DEPTH = 100


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests dicts and lists more than ``limit`` levels (a loop, not recursion).

    A child is looked at as it is found (a flat object, the usual arguments, is one pass over
    its values: no generator, nothing pushed)."""
    if type(value) is dict and limit >= 1:  # (the usual arguments: a flat object, one pass, nothing pushed)
        for c in value.values():
            if isinstance(c, (dict, list)):
                break
        else:
            return False
    elif not isinstance(value, (dict, list)):
        return False
    if limit < 1:
        return True
    stack: list[tuple[Any, int]] = [(value, 1)]
    push, pop = stack.append, stack.pop
    while stack:
        v, depth = pop()
        for c in (v.values() if isinstance(v, dict) else v):
            if isinstance(c, (dict, list)):
                if depth >= limit:  # (the child is at depth + 1)
                    return True
                push((c, depth + 1))
    return False


def clip_depth(value: Any, limit: int = MAX_JSON_DEPTH + 1) -> Any:
    """``value`` cut at ``limit`` levels (what is deeper becomes ``"…"``): a too-deep value
    that can still be stored and shown, and is still too deep to be taken."""
    if not isinstance(value, (dict, list)):
        return value
    if limit <= 0:
        return "…"
    if isinstance(value, dict):
        return {str(k): clip_depth(v, limit - 1) for k, v in value.items()}
    return [clip_depth(v, limit - 1) for v in value]


def deep_message(tool_name: str) -> str:
    """What the model reads when its arguments nest too deeply."""
    return (f"Arguments for tool {tool_name!r} nest more than {MAX_JSON_DEPTH} levels deep: "
            "send a flatter JSON object.")

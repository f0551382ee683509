"""Plain-text rendering of every public we0nb object: what a terminal shows and nbval compares.

Deterministic (no times, no durations), so saved tutorial outputs compare equal run after run.
Control and bidi characters are shown as escapes (:func:`~we0nb.notebook.part_text.visible`):
raw, model output could colour a terminal or reorder a line.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .part_text import clip, denied, dump, edited, to_json, tool_input, tool_result, tool_status, visible

__all__ = ["render_text", "message_text", "tool_line", "PLAIN_TEXT_LIMIT"]

PLAIN_TEXT_LIMIT = 400   # characters of a message text in the plain summary of a transcript


def tool_line(part: Any) -> str:
    status, label = tool_status(part)
    out, is_err = tool_result(part)
    # no duration here: the plain text stays deterministic (nbval compares it)
    tail = f" -> {clip(out, 120)!r}" if out else ""
    effect = getattr(part, "effect", None)
    extra = (f" [{effect}]" if effect else "") + (" [recalled]" if part.recalled else "") + _approval_text(part)
    return f"tool {part.tool}({clip(tool_input(part), 120)}) {label}{extra}{tail}"


def _approval_text(part: Any) -> str:
    """The approval facts of a call in the plain-text line (deterministic: no times)."""
    approval, detail = getattr(part, "approval", None), getattr(part, "approval_detail", None)
    if approval is None:
        return ""
    if part.awaiting_approval:
        return f" (why: {clip(detail.why, 120)})" if detail is not None and detail.why else ""
    if approval == "approved":
        return " [approved, arguments corrected]" if edited(part) else " [approved]"
    if approval == "denied" and not denied(part):
        return " [denied]"
    return ""


def _part_line(part: Any, limit: Optional[int] = PLAIN_TEXT_LIMIT) -> Optional[str]:
    t = getattr(part, "type", None)
    if t == "text":
        return part.text if limit is None else clip(part.text, limit)
    if t == "reasoning":
        return f"(reasoning, {len(part.text)} chars)"
    if t == "tool":
        return tool_line(part)
    if t == "compaction":
        return f"(summary) {clip(part.summary, PLAIN_TEXT_LIMIT)}"
    return None


def message_text(info: Any, parts: Sequence[Any], limit: Optional[int] = PLAIN_TEXT_LIMIT) -> str:
    role = getattr(info, "role", "assistant") if info is not None else "assistant"
    head = f"[{role}]"
    if info is not None and role == "assistant":
        if info.time.completed is None:
            head += " (unfinished)"
        if info.error is not None:
            head += f" ({info.error.reason})"
    lines = [_part_line(p, limit) for p in parts]
    body = [line for line in lines if line is not None]
    if not body:
        return visible(head)
    first, rest = body[0], body[1:]
    return visible("\n".join([f"{head} {first}"] + [f"  {line}" for line in rest]))


def render_text(obj: Any) -> str:
    """A readable plain-text summary (what nbval compares, and what a terminal shows)."""
    return visible(_render_text(obj))


def _render_text(obj: Any) -> str:
    from ..messages import AssistantMessage, MessageWithParts, Session, Transcript, UserMessage

    if isinstance(obj, Transcript):
        if obj.session is None:
            return "Transcript(no session)"
        s = obj.session
        title = f" {s.title!r}" if s.title else ""
        lines = [f"Transcript {s.id}{title}: {len(obj.messages)} messages"]
        lines += [message_text(m.info, m.parts) for m in obj.messages]
        return "\n".join(lines)
    if isinstance(obj, MessageWithParts):
        return message_text(obj.info, obj.parts)
    if isinstance(obj, Session):
        title = f" {obj.title!r}" if obj.title else ""
        return f"Session {obj.id}{title}" + (" (reverted)" if obj.revert is not None else "")
    if isinstance(obj, UserMessage):
        return f"UserMessage {obj.id}"
    if isinstance(obj, AssistantMessage):
        state = "unfinished" if obj.time.completed is None else f"finish={obj.finish_reason}"
        err = f", error={obj.error.reason}" if obj.error is not None else ""
        return f"AssistantMessage {obj.id} ({state}{err})"
    t = getattr(obj, "type", None)
    if t == "text":
        return f"TextPart: {clip(obj.text, PLAIN_TEXT_LIMIT)}"
    if t == "reasoning":
        return f"ReasoningPart: {clip(obj.text, PLAIN_TEXT_LIMIT)}"
    if t == "tool":
        return "ToolPart: " + tool_line(obj)
    if t == "step-start":
        return "StepStartPart"
    if t == "step-finish":
        return f"StepFinishPart(reason={obj.reason})"
    if t == "compaction":
        return f"CompactionPart: {clip(obj.summary, PLAIN_TEXT_LIMIT)}"
    cls = type(obj).__name__
    if cls == "RunResult":
        out = f", output={clip(to_json(dump(obj.output)), 200)}" if obj.output is not None else ""
        head = f"RunResult(result={obj.result!r}, steps={obj.steps}{out}): {clip(obj.text, PLAIN_TEXT_LIMIT)}"
        return "\n".join([head] + [f"  awaiting: {tool_line(p)}" for p in getattr(obj, "approvals", None) or ()])
    if cls == "RunRequest":
        n = len(obj.messages or ())
        return f"RunRequest(mode={obj.mode!r}, session_id={obj.session_id!r}, messages={n})"
    return repr(obj)

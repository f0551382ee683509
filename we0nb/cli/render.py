"""Plain-text views of what is persisted: the transcript, the tool table, a run's events.

Everything here reads the typed data model (``ToolPart.interrupted``, ``.recalled``,
``Transcript.needs_resume`` …): the terminal says what the store holds, nothing else.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import sys
import textwrap
from typing import Any, Callable, Mapping, Optional, Sequence

from ..messages import (UNFINISHED_REASON, AssistantMessage, MessageWithParts, ReasoningPart, TextPart, ToolPart,
                        Transcript)
from ..models.pricing import format_cost

__all__ = ["ts", "printable", "table", "outcome", "tool_rows", "format_tools", "format_transcript", "session_state", "call_label",
           "approval_rows", "session_cost", "LivePrinter", "TOOL_COLUMNS"]


def ts(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


#: C0 and C1 control characters (ESC starts the terminal's escape codes), and the same but newline
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def printable(s: str, newlines: bool = False) -> str:
    """Stored text as the terminal is given it: a control character (an escape code a title or a
    model's text may hold) written as its escape (``\\x1b``), so stored data cannot drive the
    terminal. ``newlines``: keep them (a message body)."""
    pattern = _CONTROL_BUT_NEWLINE if newlines else _CONTROL
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s)


def _short(s: Any, width: int) -> str:
    s = printable(" ".join(str(s).split()))
    return s if len(s) <= width else s[: width - 3] + "..."


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))


def call_label(part: ToolPart, width: int = 60) -> str:
    """``tool({"input": …})`` on one line."""
    return f"{part.tool}({_short(_json(part.state.input), width)})"


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], widths: Optional[dict[str, int]] = None) -> str:
    """A plain-text table (cells shortened to ``widths``)."""
    widths = widths or {}
    cells = [[_short(r.get(c, ""), widths.get(c, 40)) for c in columns] for r in rows]
    w = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.ljust(w[i]) for i, v in enumerate(vals)).rstrip()

    return "\n".join([line(list(columns)), line(["-" * x for x in w])] + [line(row) for row in cells])


def outcome(part: ToolPart, message: MessageWithParts) -> str:
    """What recovery did to the call, read back from the store: keep, recall, reconciled,
    interrupt (with whether it may have run or never started) or nothing; for a call that needed
    a person's approval, the decision (approved, denied) or that it awaits one."""
    if part.interrupted:
        effect = part.effect
        return f"interrupt ({part.interrupt_reason}): {effect}" if effect else f"interrupt ({part.interrupt_reason})"
    if part.reconciled:
        return f"reconciled: {part.effect}"
    if part.recalled:
        return "recall"
    if part.awaiting_approval:
        return "(awaiting approval)"
    if part.approval == "denied":
        return "denied"
    if part.approval == "approved":
        return "approved" if part.finished else "approved (not run yet)"
    err = getattr(message.info, "error", None)
    if part.finished and err is not None and err.reason == UNFINISHED_REASON:
        return "keep"
    if not part.finished:
        return "(unfinished)"
    return "-"


def tool_rows(tr: Transcript) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for m in tr.messages:
        for p in m.tool_parts:
            st = p.state
            result = getattr(st, "output", None)
            if result is None:
                result = getattr(st, "error", "")
            t = getattr(st, "time", None)
            dur = f"{t.end - t.start:.2f}s" if t is not None and t.start is not None and t.end is not None else ""
            rows.append({"#": str(len(rows) + 1), "tool": p.tool, "status": st.status, "outcome": outcome(p, m),
                         "input": _json(st.input), "duration": dur, "output / error": result or ""})
    return rows


TOOL_COLUMNS = ("#", "tool", "status", "outcome", "input", "duration", "output / error")
TOOL_WIDTHS = {"input": 34, "output / error": 60}


def format_tools(tr: Transcript) -> str:
    rows = tool_rows(tr)
    return table(rows, TOOL_COLUMNS, TOOL_WIDTHS) if rows else "(no tool calls)"


def approval_rows(session_id: str, parts: Sequence[ToolPart]) -> list[dict[str, Any]]:
    """One row per call awaiting a decision (``we0nb approvals``, the demo)."""
    rows = []
    for p in parts:
        detail = p.approval_detail
        rows.append({"session": session_id, "call": p.call_id, "tool": p.tool, "input": _json(p.state.input),
                     "why": detail.why if detail is not None else "",
                     "requested": ts(detail.requested) if detail is not None else "-"})
    return rows


def _message_head(m: MessageWithParts) -> list[str]:
    info = m.info
    if info.role == "user":
        return [f"\n[user] {ts(info.time.created)}  {info.id}"]
    state = "UNFINISHED" if info.time.completed is None else "finished"
    extra = f"  finish={info.finish_reason}" if info.finish_reason else ""
    if info.cost is not None:
        extra += f"  cost={format_cost(info.cost)}"
    out = [f"\n[assistant] {ts(info.time.created)}  {info.id}  {state}{extra}"]
    if info.error is not None:
        out.append(printable(f"  ! {info.error.reason}: {info.error.message} {_json(info.error.metadata)}"))
    return out


def format_transcript(tr: Transcript, width: int = 88) -> str:
    """The transcript as plain text: one block per message."""
    out: list[str] = []
    if tr.session is not None:
        s = tr.session
        out.append(f"session {s.id}  created {ts(s.time.created)}  updated {ts(s.time.updated)}"
                   + (f"  title {s.title!r}" if s.title else ""))

    def wrap(s: str, ind: str) -> str:
        return textwrap.fill(s, width, initial_indent=ind, subsequent_indent=ind)

    for m in tr.messages:
        out += _message_head(m)
        for p in m.parts:
            if isinstance(p, TextPart) and p.text:
                out.append(wrap(printable(p.text, newlines=True), "  "))
            elif isinstance(p, ReasoningPart) and p.text:
                out.append(wrap("(thinking) " + printable(p.text, newlines=True), "  "))
            elif isinstance(p, ToolPart):
                oc = outcome(p, m)
                out.append(f"  -> {call_label(p)}  [{p.state.status}]" + ("" if oc == "-" else f" {oc}"))
                res = getattr(p.state, "output", None) or getattr(p.state, "error", None)
                if res:
                    out.append(wrap(_short(res, 200), "       "))
    if not tr.messages:
        out.append("(no messages)")
    return "\n".join(out)


def session_cost(tr: Transcript) -> str:
    """What the session's model calls cost: ``$0.0123 (4 model calls)``, or which are unknown."""
    costs = [m.info.cost for m in tr.messages if isinstance(m.info, AssistantMessage)]
    known = [c for c in costs if c is not None]
    calls = f"{len(costs)} model call{'s' * (len(costs) != 1)}"
    if len(known) == len(costs):
        return f"{format_cost(sum(known, 0.0))} ({calls})"
    if not known:
        return f"unknown: {calls}, none with a known price (give the model price=...)"
    return (f"unknown: {len(costs) - len(known)} of {calls} without a known price (give the model price=...); "
            f"the others {format_cost(sum(known, 0.0))}")


def session_state(tr: Transcript) -> str:
    """``empty``, ``awaiting approval`` (calls wait for a person's decision), ``needs resume`` (the
    one rule: :attr:`Transcript.needs_resume`) or ``complete``."""
    if not tr.messages:
        return "empty"
    if tr.pending_approvals:
        return "awaiting approval"
    return "needs resume" if tr.needs_resume else "complete"


class LivePrinter:
    """Prints a run's events as they arrive (text deltas inline, one line per tool change).

    ``explain(event)`` gives the reason printed after a recovery action (the caller knows
    the tools and what the store held before the resume).
    """

    def __init__(self, write: Optional[Callable[[str], Any]] = None,
                 explain: Optional[Callable[[Mapping[str, Any]], str]] = None):
        self._w = write or (lambda s: sys.stdout.write(s))  # the stdout of now, not of import time
        self._col = 0
        self._explain = explain
        self.events = 0
        self._shown: dict[str, str] = {}  # part id -> the state last printed (a state is printed once)

    def _line(self, s: str) -> None:
        if self._col:
            self._w("\n")
            self._col = 0
        self._w(s + "\n")
        sys.stdout.flush()

    def _delta(self, text: str) -> None:
        if self._col == 0:
            self._w("  ")
            self._col = 2
        self._w(text)
        self._col += len(text)
        sys.stdout.flush()

    def __call__(self, ev: Mapping[str, Any]) -> None:
        self.events += 1
        kind = ev["type"]
        if kind in ("text-delta", "reasoning-delta"):
            self._delta(ev["text"])
        elif kind == "user-message":
            self._line(f"[user] {ev['text']}")
        elif kind == "step-start":
            self._line(f"[assistant] step {ev['step']} of this run")
        elif kind == "tool":
            p = ev["part"]
            if self._shown.get(p.id) == p.state.status:
                return
            self._shown[p.id] = p.state.status
            line = f"  tool {p.tool:<12} {p.state.status:<9} {_short(_json(p.state.input), 40)}"
            res = getattr(p.state, "output", None) or getattr(p.state, "error", None)
            self._line(line + (f" -> {_short(res, 70)}" if res else ""))
        elif kind == "recovery":
            self._recovery(ev)
        elif kind == "step-finish":
            self._line(f"  (step {ev['step']} finished: {ev['finish_reason']})")
        elif kind == "approval-request":
            p = ev["part"]
            why = p.approval_detail.why if p.approval_detail is not None else ""
            self._line(f"  approval {call_label(p, 40)} awaits a person's decision" + (f": {why}" if why else ""))
        elif kind == "finish":
            self._line(f"[finish] result={ev['result'].result!r}")

    def _recovery(self, ev: Mapping[str, Any]) -> None:
        if ev["action"] == "close":
            self._line(f"  recovery close     the unfinished assistant message (error {UNFINISHED_REASON})")
            return
        why = self._explain(ev) if self._explain else ""
        self._line(f"  recovery {ev['action']:<9} {call_label(ev['part'], 40)}" + (f": {why}" if why else ""))

    def end(self) -> None:
        if self._col:
            self._w("\n")
            self._col = 0
        sys.stdout.flush()

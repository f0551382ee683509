"""The HTML renderer of every public we0nb object (the plain text is :mod:`we0nb.notebook.plain`).

Pure Python: no IPython or ipywidgets import, so the data model can call it lazily from
its ``_repr_html_``/``_repr_mimebundle_`` hooks. Everything that comes from a model or a
tool (text, reasoning, tool input/output/error, ids, titles) is HTML-escaped, its control and
bidi characters shown as escapes (:func:`esc`).

Styles use JupyterLab's CSS variables (with fallbacks), so the light and dark themes
both read well; the ``<style>`` block is scoped by the ``we0-`` class prefix and is
emitted once per top-level render, so every saved output is self-contained.

A notebook opened untrusted (a fresh clone, Binder) has its HTML sanitised, so every
element also carries an inline style that survives it (:mod:`we0nb.notebook.styles`), and
words never rely on CSS to be apart.
"""

from __future__ import annotations

import datetime as _dt
import html as _html
import re
from typing import Any, Iterable, Optional, Sequence

from .._call_facts import COMPLETED_ON_RESUME, MAY_HAVE_RUN, NEVER_STARTED
from .part_text import denied, dump, edited, to_json, tool_input, tool_result, tool_status, visible
from .plain import render_text  # re-exported: the mimebundle pairs it with the HTML
from .styles import CSS, INLINE, STYLE, inline_styles  # CSS, INLINE and inline_styles are re-exported

__all__ = [
    "esc",
    "CSS",
    "render_html",
    "render_text",
    "mimebundle",
    "wrap",
    "messages_html",
    "tool_table_html",
    "status_badge",
    "outcome_badge",
    "effect_badge",
    "approval_badge",
    "inline_styles",
    "INLINE",
]

MAX_CELL = 2000          # characters of a tool input/output shown before "… more"


def esc(value: Any) -> str:
    """Escape anything for HTML text and attribute context (quotes included); control and bidi
    characters become visible escapes (:func:`~we0nb.notebook.part_text.visible`)."""
    return _html.escape(visible(value), quote=True)


# --------------------------------------------------------------------------- small helpers


def _ts(epoch: Optional[float]) -> str:
    if epoch is None:
        return ""
    try:
        return _dt.datetime.fromtimestamp(float(epoch), _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return str(epoch)


def _dur(start: Optional[float], end: Optional[float]) -> str:
    if start is None or end is None:
        return ""
    d = max(0.0, float(end) - float(start))
    if d < 1:
        return f"{d * 1000:.0f} ms"
    if d < 120:
        return f"{d:.2f} s"
    return f"{d / 60:.1f} min"


def _clip_html(text: str, limit: int = MAX_CELL) -> str:
    """Escaped text; long text shows its head and the rest in a <details>."""
    if len(text) <= limit:
        return esc(text)
    return (f"{esc(text[:limit])}<details><summary class='we0-note'>… {len(text) - limit:,} more characters"
            f"</summary>{esc(text[limit:])}</details>")


def status_badge(status: str, label: Optional[str] = None) -> str:
    return f"<span class='we0-badge we0-s-{esc(status)}'>{esc(label or status)}</span>"


def wrap(inner: str, *, extra_class: str = "") -> str:
    """A self-contained top-level fragment: the scoped style plus the content."""
    cls = f"we0 {extra_class}".strip()
    return f"{STYLE}" + inline_styles(f"<div class='{esc(cls)}'>{inner}</div>")


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td class='we0-muted'>{esc(k)}</td><td>{v}</td></tr>" for k, v in rows)
    return f"<table class='we0-kv'>{body}</table>"


# --------------------------------------------------------------------------- tool parts


def approval_badge(part: Any) -> str:
    """A person's decision on a call, as a badge of the same size as the others ("" when none, or
    when the status badge already says it: awaiting approval, denied)."""
    approval = getattr(part, "approval", None)
    if approval == "approved":
        return f"<span class='we0-badge we0-o-approved'>{'approved, edited' if edited(part) else 'approved'}</span>"
    if approval == "denied" and not denied(part):
        return "<span class='we0-badge we0-o-denied'>denied</span>"
    return ""


def _approval_note(part: Any) -> str:
    """Why the call needs approval, the reason of a denial, the corrected arguments (escaped)."""
    approval, detail = getattr(part, "approval", None), getattr(part, "approval_detail", None)
    if approval is None or detail is None:
        return ""
    bits = []
    if approval == "requested" and part.awaiting_approval:
        bits.append(f"why: {esc(detail.why)}" if detail.why else "a person must approve or deny it")
    elif approval == "denied":
        bits.append(f"denied: {esc(detail.reason)}" if detail.reason else "denied without a reason")
        if part.state.status == "pending":
            bits.append("a resume tells the model")
    elif approval == "approved":
        if detail.input is not None:
            # (the corrected arguments named here too: until a resume runs them, the input column
            # still shows what the model asked for)
            bits.append(f"arguments corrected by a person to <span class='we0-mono'>{esc(to_json(detail.input))}</span>"
                        f"; the model asked for <span class='we0-mono'>{esc(to_json(detail.original_input))}</span>")
        if part.state.status == "pending":
            bits.append("a resume runs it")
    return f"<div class='we0-note'>{' · '.join(bits)}</div>" if bits else ""


_OUTCOME_LABELS = {"keep": "kept", "recall": "recalled"}
#: the badge class of each effect label (the words: :func:`we0nb.messages.effect_label`)
_EFFECT_CLASSES = {MAY_HAVE_RUN: "in_doubt", NEVER_STARTED: "never_started", COMPLETED_ON_RESUME: "reconciled"}


def effect_badge(part: Any) -> str:
    """What recovery knows of the call's effect, as the store says ("" when nothing to say):
    "may have run" (interrupted while running), "never started", "completed on resume"."""
    label = getattr(part, "effect", None)
    if label is None:
        return ""
    return f"<span class='we0-badge we0-o-{_EFFECT_CLASSES[label]}'>{esc(label)}</span>"


def outcome_badge(outcome: str) -> str:
    """What recovery did to a call, as a badge of the same size as "interrupted (…)": kept, recalled."""
    return f"<span class='we0-badge we0-o-{esc(outcome)}'>{esc(_OUTCOME_LABELS.get(outcome, outcome))}</span>"


def _outcome(part: Any, recovery: Optional[str], kept: bool) -> Optional[str]:
    """What recovery did to the call (None when it did nothing), from the part's typed flags."""
    if part.interrupted:
        return None  # its status badge already says "interrupted (reason)", with the same weight
    if part.recalled or recovery == "recall":
        return "recall"
    if recovery == "keep" or (kept and part.finished):
        return "keep"
    return None


_MIME = re.compile(r"[\w.+-]+/[\w.+-]+")
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def _attachments_html(state: Any) -> str:
    """Images, audio and links a tool returned beside its output (an MCP server's), inline."""
    shown = []
    for a in getattr(state, "attachments", None) or ():
        mime, data = a.mime_type or "", a.data or ""
        if a.type in ("image", "audio") and _MIME.fullmatch(mime) and mime.startswith(a.type + "/") \
                and data and _BASE64.fullmatch(data):
            src = f"data:{mime};base64,{data}"
            shown.append(f"<img src='{src}' alt='{esc(mime)}' style='max-width:240px;max-height:180px'>"
                         if a.type == "image" else f"<audio controls src='{src}'></audio>")
        elif a.type == "link" and (a.uri or "").startswith(("http://", "https://")):
            shown.append(f"<a href='{esc(a.uri)}' target='_blank' rel='noopener noreferrer'>{esc(a.name or a.uri)}</a>")
        else:
            shown.append(f"<span class='we0-muted'>{esc(a.type)}: {esc(a.name or a.uri or mime)}</span>")
    return f"<div class='we0-note'>{' '.join(shown)}</div>" if shown else ""


def progress_text(progress: Any) -> str:
    """A call's last progress (``metadata["progress"]``) in words: ``2/3 (67%) · packing``."""
    if not isinstance(progress, dict):
        return ""
    done, total, message = progress.get("progress"), progress.get("total"), progress.get("message")
    bits = []
    if isinstance(done, (int, float)):
        amount = f"{done:g}/{total:g}" if isinstance(total, (int, float)) and total else f"{done:g}"
        if isinstance(total, (int, float)) and total:
            amount += f" ({min(max(done / total, 0.0), 1.0):.0%})"
        bits.append(amount)
    if message:
        bits.append(str(message))
    return " · ".join(bits)


def _running_note(part: Any) -> str:
    """A running call's last progress (a bar when there is a total) and the question it waits on."""
    st = part.state
    if getattr(st, "status", None) != "running":
        return ""
    meta = getattr(st, "metadata", None) or {}
    out = []
    progress = meta.get("progress")
    said = progress_text(progress)
    if said and isinstance(progress, dict):
        done, total = progress.get("progress"), progress.get("total")
        bar = ""
        if isinstance(done, (int, float)) and isinstance(total, (int, float)) and total:
            pct = min(max(done / total, 0.0), 1.0) * 100
            bar = (f"<div class='we0-progress' style='height:4px;background:#e5e7eb;border-radius:2px;margin:2px 0'>"
                   f"<div style='height:4px;width:{pct:.0f}%;background:#3b82f6;border-radius:2px'></div></div>")
        out.append(f"<div class='we0-note we0-progress-note' data-progress='{esc(said)}'>{bar}{esc(said)}</div>")
    question = next((q for q in reversed(meta.get("questions") or ()) if isinstance(q, dict)
                     and q.get("status") == "awaiting"), None)
    if question is not None:
        out.append(f"<div class='we0-note we0-warn' data-question='awaiting'>asks a person: "
                   f"{esc(question.get('message', ''))}</div>")
    return "".join(out)


def tool_row_html(part: Any, recovery: Optional[str] = None, *, kept: bool = False, cut: bool = False) -> str:
    status, label = tool_status(part, cut)
    st = part.state
    t = getattr(st, "time", None)
    dur = _dur(getattr(t, "start", None), getattr(t, "end", None)) if t is not None else ""
    out, is_err = tool_result(part)
    out_html = _clip_html(out)
    if is_err:
        out_html = f"<span class='{'we0-warn' if status == 'interrupted' else 'we0-err'}'>{out_html}</span>"
    outcome = _outcome(part, recovery, kept)
    badges = " ".join(b for b in (status_badge(status, label), effect_badge(part),
                                  outcome_badge(outcome) if outcome else "", approval_badge(part)) if b)
    note = ("<div class='we0-note'>resume decides: run again if read-only, else interrupted</div>"
            if status == "unfinished" and cut else "") + _approval_note(part) + _running_note(part)
    shown = "interrupted" if part.interrupted else st.status  # as stored
    approval = f" data-approval='{esc(part.approval)}'" if getattr(part, "approval", None) else ""
    return (f"<tr data-status='{esc(shown)}'{approval}><td class='we0-cell'><code>{esc(part.tool)}</code>"
            f"<div class='we0-note we0-mono we0-id'>{esc(part.call_id)}</div></td>"
            f"<td class='we0-cell we0-io we0-mono'>{_clip_html(tool_input(part))}</td>"
            f"<td class='we0-cell'>{badges}{note}</td>"
            f"<td class='we0-cell we0-muted'>{esc(dur)}</td>"
            f"<td class='we0-cell we0-io'>{out_html}{_attachments_html(st)}</td></tr>")


def tool_table_html(parts: Sequence[Any], recovery: Optional[dict[str, str]] = None, *, kept: bool = False,
                    cut: bool = False) -> str:
    recovery = recovery or {}
    rows = "".join(tool_row_html(p, recovery.get(p.id), kept=kept, cut=cut) for p in parts)
    head = "".join(f"<th class='we0-cell we0-th'>{h}</th>" for h in ("tool", "input", "status", "duration",
                                                                   "output / error"))
    # fixed column widths: a row's content (a long JSON input, badges, an error) never resizes the
    # columns, so the table does not jump as calls go from running to finished or aborted
    cols = "".join(f"<col width='{w}' style='width:{w}'>" for w in _TOOL_COLUMNS)
    return (f"<table class='we0-tools'><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
            f"<tbody>{rows}</tbody></table>")


#: the widths of the tool table's columns: tool (and call id), input, status, duration, output / error
_TOOL_COLUMNS = ("17%", "33%", "14%", "8%", "28%")


# --------------------------------------------------------------------------- parts


def part_html(part: Any, *, streaming: bool = False) -> str:
    ptype = getattr(part, "type", None)
    if ptype == "text":
        cursor = " we0-cursor" if streaming else ""
        return f"<div class='we0-text{cursor}'>{esc(part.text)}</div>"
    if ptype == "reasoning":
        open_attr = " open" if streaming else ""
        return (f"<details class='we0-reasoning'{open_attr}><summary>reasoning ({len(part.text):,} chars)</summary>"
                f"<div class='we0-text'>{esc(part.text)}</div></details>")
    if ptype == "tool":
        return tool_table_html([part])
    if ptype == "step-start":
        return f"<div class='we0-note'>step start · {esc(_ts(part.time))}</div>"
    if ptype == "step-finish":
        u = part.usage
        return (f"<div class='we0-note'>step finish · reason {esc(part.reason)} · tokens in {u.input_tokens} / "
                f"out {u.output_tokens}</div>")
    if ptype == "compaction":
        return (f"<div class='we0-compaction'><span class='we0-role'>summary</span>"
                f"<div class='we0-text'>{esc(part.summary)}</div></div>")
    return f"<div class='we0-text'>{esc(part)}</div>"


def _parts_html(parts: Sequence[Any], *, streaming_id: Optional[str] = None,
                recovery: Optional[dict[str, str]] = None, kept: bool = False, cut: bool = False) -> str:
    """Parts in order; consecutive tool parts share one table; step markers are omitted."""
    out: list[str] = []
    tools: list[Any] = []

    def flush_tools() -> None:
        if tools:
            out.append(tool_table_html(tools, recovery, kept=kept, cut=cut))
            tools.clear()

    for p in parts:
        t = getattr(p, "type", None)
        if t == "tool":
            tools.append(p)
            continue
        flush_tools()
        if t in ("step-start", "step-finish"):
            continue
        out.append(part_html(p, streaming=(streaming_id is not None and p.id == streaming_id)))
    flush_tools()
    return "".join(out)


# --------------------------------------------------------------------------- messages


def _message_meta(info: Any) -> str:
    bits: list[str] = []
    if info.role == "assistant":
        if info.model_id:
            bits.append(f"<span class='we0-muted'>{esc(info.model_id)}</span>")
        if info.time.completed is None:
            bits.append(status_badge("unfinished"))
        elif info.finish_reason:
            bits.append(f"<span class='we0-muted'>finish: {esc(info.finish_reason)}</span>")
        u = info.usage
        if u.input_tokens or u.output_tokens:
            bits.append(f"<span class='we0-muted'>tokens {u.input_tokens} in / {u.output_tokens} out</span>")
        if getattr(info, "summary", False):
            bits.append(status_badge("compact", "summary"))
    bits.append(f"<span class='we0-muted'>{esc(_ts(info.time.created))}</span>")
    return " ".join(bits)


def _message_error(info: Any) -> str:
    err = getattr(info, "error", None)
    if err is None:
        return ""
    recovered = (err.metadata or {}).get("recovered")
    if recovered and err.reason == "UnfinishedAssistantMessage":  # not an error: a reply an abort or a crash cut
        mode = err.metadata.get("mode")
        by = {"resume": "the resume", "prompt": "the next prompt"}.get(mode, f"the {mode} run")
        return (f"<div class='we0-warn we0-note'>This reply was cut before it finished (an abort or a crash); "
                f"{esc(by)} closed it. <span class='we0-muted'>({esc(err.reason)})</span></div>")
    cls = "we0-warn" if recovered else "we0-err"
    extra = f" (recovered in {esc(err.metadata.get('mode'))} mode)" if recovered else ""
    return f"<div class='{cls} we0-note'>{esc(err.reason)}: {esc(err.message)}{extra}</div>"


def _closed_by_recovery(info: Any) -> bool:
    err = getattr(info, "error", None)
    return err is not None and bool((err.metadata or {}).get("recovered"))


def message_html(info: Any, parts: Sequence[Any] = (), *, streaming_id: Optional[str] = None,
                 recovery: Optional[dict[str, str]] = None, placeholder: bool = False, cut: bool = False) -> str:
    """One turn. ``cut``: the run showing it was aborted (unfinished calls say so)."""
    role = getattr(info, "role", "assistant") if info is not None else "assistant"
    if info is None:
        head = "<span class='we0-role'>assistant</span> <span class='we0-muted'>(earlier message)</span>"
        err = ""
    else:
        head = f"<span class='we0-role'>{esc(role)}</span> {_message_meta(info)}"
        err = _message_error(info)
    mid = f" data-message-id='{esc(info.id)}'" if info is not None else ""
    return (f"<div class='we0-turn we0-{esc(role)}'{mid}><div>{head}</div>"
            f"{_parts_html(parts, streaming_id=streaming_id, recovery=recovery, kept=_closed_by_recovery(info), cut=cut)}"
            f"{err}</div>")


def messages_html(messages: Sequence[Any], **kw: Any) -> str:
    return "".join(message_html(m.info, m.parts, **kw) for m in messages)


def _session_head(session: Any, n_messages: Optional[int] = None) -> str:
    title = f"<span class='we0-title'>{esc(session.title)}</span>" if session.title else ""
    count = f"<span class='we0-muted'>{n_messages} messages</span>" if n_messages is not None else ""
    revert = (f"<span class='we0-warn we0-note'>reverted at {esc(session.revert.message_id)}</span>"
              if session.revert is not None else "")
    bits = ["<span class='we0-role'>session</span>", f"<code>{esc(session.id)}</code>", title, count,
            f"<span class='we0-muted'>updated {esc(_ts(session.time.updated))}</span>", revert]
    return f"<div class='we0-head'>{' '.join(b for b in bits if b)}</div>"


# --------------------------------------------------------------------------- top-level HTML


def _fragment(obj: Any) -> str:
    from ..messages import (  # local import: the data model imports us lazily too
        AssistantMessage,
        MessageWithParts,
        Session,
        Transcript,
        UserMessage,
    )

    if isinstance(obj, Transcript):
        if obj.session is None:
            return "<div class='we0-muted'>Transcript: no such session (nothing persisted).</div>"
        body = messages_html(obj.messages) or "<div class='we0-muted'>(no messages)</div>"
        return _session_head(obj.session, len(obj.messages)) + body
    if isinstance(obj, MessageWithParts):
        return message_html(obj.info, obj.parts)
    if isinstance(obj, Session):
        return _session_head(obj) + _kv([("created", esc(_ts(obj.time.created)))])
    if isinstance(obj, (UserMessage, AssistantMessage)):
        rows = [("id", f"<code>{esc(obj.id)}</code>"), ("session", f"<code>{esc(obj.session_id)}</code>"),
                ("created", esc(_ts(obj.time.created)))]
        if isinstance(obj, AssistantMessage):
            rows += [("completed", esc(_ts(obj.time.completed)) or status_badge("unfinished")),
                     ("model", esc(obj.model_id)), ("finish", esc(obj.finish_reason)),
                     ("tokens", esc(f"{obj.usage.input_tokens} in / {obj.usage.output_tokens} out"))]
        return (f"<div><span class='we0-role'>{esc(obj.role)} message</span></div>" + _kv(rows)
                + _message_error(obj))
    if getattr(obj, "type", None) in ("text", "reasoning", "tool", "step-start", "step-finish", "compaction"):
        return part_html(obj)
    cls = type(obj).__name__
    if cls == "RunResult":
        u = obj.usage
        kind = {"stop": "finished", "approval": "awaiting"}.get(obj.result, "compact")
        rows = [("result", status_badge(kind, obj.result)),
                ("session", f"<code>{esc(obj.session_id)}</code>"), ("steps", esc(obj.steps)),
                ("tokens", esc(f"{u.input_tokens} in / {u.output_tokens} out"))]
        if obj.output is not None:
            rows.append(("output", f"<span class='we0-mono'>{_clip_html(to_json(dump(obj.output)))}</span>"))
        text = f"<div class='we0-text'>{esc(obj.text)}</div>" if obj.text else ""
        waiting = tool_table_html(obj.approvals) if getattr(obj, "approvals", None) else ""
        return f"<div><span class='we0-role'>run result</span></div>{_kv(rows)}{text}{waiting}"
    if cls == "RunRequest":
        rows = [("mode", esc(obj.mode)), ("session", f"<code>{esc(obj.session_id)}</code>"
                                          + (" <span class='we0-muted'>(new)</span>" if obj.new_session else "")),
                ("run", f"<code>{esc(obj.run_id)}</code>"),
                ("abort", "set" if obj.abort.is_set() else "not set")]
        msgs = "".join(f"<div class='we0-turn we0-user'><span class='we0-role'>user</span>"
                       f"<div class='we0-text'>{esc(m.text)}</div></div>" for m in (obj.messages or ()))
        return f"<div><span class='we0-role'>run request</span></div>{_kv(rows)}{msgs}"
    return f"<div class='we0-text'>{esc(repr(obj))}</div>"


def render_html(obj: Any) -> str:
    """The full, self-contained HTML of a public object (style included)."""
    return wrap(_fragment(obj))


def mimebundle(obj: Any) -> dict[str, str]:
    return {"text/html": render_html(obj), "text/plain": render_text(obj)}

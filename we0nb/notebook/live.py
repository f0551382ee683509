"""The live view of a run: one display handle, coalesced updates, an exact final render.

``await we0nb.show(agent.stream(...))`` (or ``await show(agent, "hi")``) renders the run
in the cell while it streams: text as it arrives, a tool table updated in place
(pending → running → completed/error, recovery actions in resume mode), then the exact
final state. Updates are coalesced: at most one per ``interval`` seconds (default 0.05 s,
so ≤ 20 per second) whatever the delta rate; a flush happens at the first event after a
quiet ``interval`` (so a tool's state change shows at once), on a timer while deltas keep
coming, and always at the end. A bandwidth budget (``max_bytes_per_s``, default 200 kB/s)
spaces the updates of a very long view further apart, so iopub traffic grows linearly
with the streamed text instead of quadratically.

Outside IPython (a script, a test) the view prints its final plain-text summary; tests
pass ``display=`` (a callable ``bundle -> handle``) or ``handle=`` (an object with
``update(bundle)``) to observe every update.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Union

from ..models.pricing import add_cost, format_cost
from . import html as H
from .part_text import visible
from .plain import message_text

__all__ = ["LiveView", "ipython_display"]

#: said under a run whose last reply was cut at the token limit (RunResult.truncated)
TRUNCATED = ("Truncated: the last reply was cut at the token limit (finish_reason \"length\"); "
             "raise max_tokens to get the whole answer.")

Bundle = dict[str, str]

#: the view's status label when its run ended with calls waiting for a person's decision
APPROVAL_LABEL = "awaiting approval"
#: the badge's words where they are not the status itself (a stored turn a resume continues: unfinished)
_BADGE_LABELS = {"approval": APPROVAL_LABEL, "unfinished": "needs resume"}


def approval_sentence(n: int) -> str:
    """What a run that ended with ``result == "approval"`` leaves to a person."""
    calls = "1 call awaits" if n == 1 else f"{n} calls await"
    return (f"{calls} a person's decision: approve or deny (the panel's buttons, agent.approve / agent.deny, "
            "or `we0nb approve` / `we0nb deny`); once all are decided, resume continues the turn.")


@dataclass
class _Buf:
    """A streaming text/reasoning part: chunks are joined only when rendered."""

    id: str
    type: str
    chunks: list[str] = field(default_factory=list)
    done: bool = False

    @property
    def text(self) -> str:
        if len(self.chunks) > 1:
            self.chunks = ["".join(self.chunks)]
        return self.chunks[0] if self.chunks else ""


@dataclass
class _Turn:
    info: Any  # UserMessage / AssistantMessage, or None for an earlier message we only know by id
    message_id: str
    parts: list[Any] = field(default_factory=list)


class _IPyHandle:
    """``IPython.display`` behind the tiny handle protocol of the live view."""

    def __init__(self, bundle: Bundle, display_id: Union[str, bool] = True):
        from IPython.display import display

        handle = display(bundle, raw=True, display_id=display_id)
        if handle is None:  # (IPython gives none outside a running shell or with display_id=False)
            raise RuntimeError("live view: IPython returned no display handle; show it in a Jupyter kernel.")
        self._handle = handle
        self.display_id = handle.display_id

    def update(self, bundle: Bundle) -> None:
        self._handle.update(bundle, raw=True)


def _count(n: int, noun: str) -> str:
    """``1 delta``, ``2,048 deltas``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _in_kernel() -> bool:
    try:
        from IPython.core.getipython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def ipython_display(display_id: Union[str, bool] = True) -> Optional[Callable[[Bundle], Any]]:
    """The display function used in a kernel (None outside one)."""
    if not _in_kernel():
        return None
    return lambda bundle: _IPyHandle(bundle, display_id)


class LiveView:
    """The coalesced live rendering of one or more runs (a panel feeds several into one view)."""

    def __init__(self, *, interval: float = 0.05, display: Optional[Callable[[Bundle], Any]] = None,
                 handle: Any = None, title: Optional[str] = None, clock: Callable[[], float] = time.monotonic,
                 max_bytes_per_s: Optional[float] = 200_000):
        if interval < 0:
            raise ValueError("LiveView(interval=...): expected seconds >= 0.")
        if max_bytes_per_s is not None and max_bytes_per_s <= 0:
            raise ValueError("LiveView(max_bytes_per_s=...): expected a positive number or None.")
        self.interval = float(interval)
        #: bandwidth budget: a big view is re-sent less often, so the bytes sent per second of
        #: streaming stay bounded (traffic linear in the text length, not quadratic)
        self.max_bytes_per_s = max_bytes_per_s
        self._gap = self.interval
        self.bytes_sent = 0
        self.title = title
        self._clock = clock
        self._display_fn = display
        self._handle = handle
        self._print_final = False
        self.turns: list[_Turn] = []
        self._turns_by_id: dict[str, _Turn] = {}
        self._open: Optional[_Buf] = None
        self.recovery: dict[str, str] = {}
        self.recovery_log: list[str] = []
        self.status = "idle"
        self.session_id: Optional[str] = None
        self.mode: Optional[str] = None
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.note: Optional[str] = None
        self.delta_count = 0
        self.event_count = 0
        #: what the model calls shown so far cost, USD (None once one is unknown: then not shown);
        #: a panel's view keeps the running total over its runs
        self.cost: Optional[float] = 0.0
        self.model_calls = 0
        self.updates = 0          # display messages sent (the first display included)
        self._dirty = False
        self._last_flush = float("-inf")
        self._timer: Optional[asyncio.TimerHandle] = None
        self._started_at: Optional[float] = None
        self._ended_at: Optional[float] = None

    # ------------------------------------------------------------------ display plumbing

    @property
    def handle(self) -> Any:
        return self._handle

    def open(self) -> "LiveView":
        """Create the display now (in the calling cell) if it does not exist yet."""
        if self._handle is None and not self._print_final:
            fn = self._display_fn or ipython_display()
            if fn is None:
                self._print_final = True
                return self
            bundle = self.bundle()
            self._handle = fn(bundle)
            self.updates += 1
            self.bytes_sent += len(bundle["text/html"]) + len(bundle["text/plain"])
            self._last_flush = self._clock()
            self._dirty = False
        return self

    def _send(self, final: bool = False) -> None:
        self._cancel_timer()
        self._dirty = False
        if self._handle is None:
            self._last_flush = self._clock()
            if not self._print_final:
                self.open()
            return
        bundle = self.bundle(final=final)
        self._handle.update(bundle)
        self.updates += 1
        size = len(bundle["text/html"]) + len(bundle["text/plain"])
        self.bytes_sent += size
        self._gap = self.interval
        if self.max_bytes_per_s:
            self._gap = max(self.interval, size / self.max_bytes_per_s)
        self._last_flush = self._clock()  # after the send: the gap between sends is >= interval

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self._dirty:
            self._send()

    def _touch(self) -> None:
        """Something changed: flush now if the last flush is old enough, else on the timer."""
        self._dirty = True
        now = self._clock()
        wait = self._last_flush + self._gap - now
        if wait <= 0:
            self._send()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a sync feed): the next event or close() flushes
            self._timer = loop.call_later(wait, self._on_timer)

    def refresh(self) -> None:
        """Flush any pending change now (ignores the rate limit)."""
        self._send()

    # ------------------------------------------------------------------ state from events

    def _turn(self, message_id: str, info: Any = None) -> _Turn:
        t = self._turns_by_id.get(message_id)
        if t is None:
            t = _Turn(info=info, message_id=message_id)
            self._turns_by_id[message_id] = t
            self.turns.append(t)
        elif info is not None:
            t.info = info
        return t

    def _upsert_part(self, part: Any) -> None:
        t = self._turn(part.message_id)
        for i, p in enumerate(t.parts):
            if p.id == part.id:
                t.parts[i] = part
                return
        t.parts.append(part)

    def clear_run(self) -> None:
        """Forget the last run's outcome: what the head and the footer say next is about a new run
        (a panel reuses one view for several runs; its turns and cost stay)."""
        self.error = None
        self.result = None
        self.delta_count = 0  # a resume does not carry the prompt run's count over
        self.recovery_log = []  # the footer tells what this run's recovery did, not an earlier one's

    def start(self, note: Optional[str] = None) -> None:
        """Mark a new run of this view as running (a panel reuses one view for several runs)."""
        self.clear_run()
        self.status = "running"
        self.note = note
        self._started_at = self._clock()
        self._ended_at = None
        self.open()

    def feed(self, ev: dict[str, Any]) -> None:
        """Apply one event of ``We0Agent.stream()`` and flush when due."""
        self.event_count += 1
        typ = ev.get("type")
        if typ == "text-delta" or typ == "reasoning-delta":
            self.delta_count += 1
            buf = self._open
            if buf is None or buf.id != ev["part_id"]:
                buf = self._find_buf(ev["part_id"])
            if buf is not None:
                buf.chunks.append(ev["text"])
            self._dirty = True
            if self._clock() - self._last_flush >= self._gap:
                self._send()
            elif self._timer is None:
                self._touch()
            return
        if typ in ("text-start", "reasoning-start"):
            part = ev["part"]
            buf = _Buf(part.id, part.type, [part.text] if part.text else [])
            self._turn(part.message_id).parts.append(buf)
            self._open = buf
        elif typ in ("text-end", "reasoning-end"):
            part = ev["part"]
            self._upsert_part(part)  # the exact final text replaces the streamed chunks
            if self._open is not None and self._open.id == part.id:
                self._open = None
        elif typ == "start":
            self.session_id = ev.get("session_id")
            self.mode = ev.get("mode")
            if self.status != "running":
                self.start()
        elif typ == "user-message":
            msg = ev["message"]
            t = self._turn(msg.id, msg)
            t.parts = [_Buf(msg.id + ":text", "text", [ev.get("text", "")], done=True)]
        elif typ == "recovery":
            action = ev.get("action")
            if action == "close":
                msg = ev["message"]
                self._turn(msg.id, msg)
                self.recovery_log.append("closed the unfinished assistant message")
            else:
                part = ev["part"]
                self.recovery[part.id] = str(action)
                self._upsert_part(part)
                self.recovery_log.append(f"{action} {part.tool}")
        elif typ == "step-start":
            msg = ev["message"]
            self._turn(msg.id, msg)
        elif typ == "tool":
            self._upsert_part(ev["part"])
        elif typ == "step-finish":
            msg = ev["message"]
            self._turn(msg.id, msg)
            self._priced(msg)
        elif typ == "compaction" or typ == "approval-request":
            self._upsert_part(ev["part"])
            if typ == "compaction":
                self._priced(ev["message"])
        elif typ == "finish":
            self.result = ev.get("result")
        self._touch()

    def _priced(self, message: Any) -> None:
        self.model_calls += 1
        self.cost = add_cost(self.cost, getattr(message, "cost", None))

    def show_stored(self, messages: Any) -> None:
        """Show the messages of this view as the store holds them (after an abort, say).

        ``messages`` are :class:`~we0nb.MessageWithParts` (``transcript.messages``); only those
        this view already shows are taken, with their parts exactly as persisted.
        """
        for m in messages:
            t = self._turns_by_id.get(m.info.id)
            if t is None or m.info.role != "assistant":
                continue
            t.info = m.info
            t.parts = list(m.parts)
        self._open = None
        self._touch()

    def show_turn(self, messages: Any, *, flush: bool = True) -> None:
        """Show the session's current turn as the store holds it (from its last user message on):
        a panel opened on a stored session starts from there, and a resume updates it in place.
        ``flush=False``: only take it in (the view is not displayed yet; its first display shows it)."""
        last_user = max((i for i, m in enumerate(messages) if m.info.role == "user"), default=0)
        for m in messages[last_user:]:
            self._turn(m.info.id, m.info).parts = list(m.parts)
        if self.session_id is None and messages:
            self.session_id = messages[0].info.session_id
        self._open = None
        if flush:
            self._touch()
        else:
            self._dirty = True

    def _find_buf(self, part_id: str) -> Optional[_Buf]:
        for t in reversed(self.turns):
            for p in t.parts:
                if p.id == part_id and isinstance(p, _Buf):
                    return p
        return None

    def close(self, status: str, error: Optional[BaseException] = None) -> None:
        """End the current run of the view: exact final render, now."""
        self.status = status
        self.error = error
        self._ended_at = self._clock()
        self._open = None
        self._send(final=True)
        if self._print_final:
            print(self.text(final=True))

    # ------------------------------------------------------------------ rendering

    def _elapsed(self) -> Optional[float]:
        if self._started_at is None:
            return None
        end = self._ended_at if self._ended_at is not None else self._clock()
        return end - self._started_at

    @property
    def awaiting(self) -> list[Any]:
        """The calls the last run left waiting for a person's decision and still undecided here."""
        if self.status != "approval":
            return []
        shown = {p.id: p for t in self.turns for p in t.parts if getattr(p, "type", None) == "tool"}
        parts = [shown.get(p.id, p) for p in getattr(self.result, "approvals", None) or ()]
        return [p for p in parts if p.awaiting_approval]

    def record_decision(self, part: Any) -> None:
        """Show a person's decision on a call (the call as now stored), without waiting for the resume."""
        self._upsert_part(part)
        self.refresh()

    def _head_html(self) -> str:
        bits = [H.status_badge(self.status, _BADGE_LABELS.get(self.status))]
        if self.title:
            bits.append(f"<span class='we0-title'>{H.esc(self.title)}</span>")
        if self.session_id:
            bits.append(f"<span class='we0-muted'>session</span> <code>{H.esc(self.session_id)}</code>")
        if self.mode:
            bits.append(f"<span class='we0-muted'>mode {H.esc(self.mode)}</span>")
        el = self._elapsed()
        if el is not None:
            bits.append(f"<span class='we0-muted'>{el:.1f} s</span>")
        if self.delta_count:
            bits.append(f"<span class='we0-muted'>{_count(self.delta_count, 'delta')}</span>")
        if self.model_calls and self.cost is not None:  # (unknown: nothing to show; the log said why)
            bits.append(f"<span class='we0-muted' title='the cost of the model calls shown'>cost "
                        f"{H.esc(format_cost(self.cost))}</span>")
        if self.note:
            bits.append(f"<span class='we0-muted'>{H.esc(self.note)}</span>")
        return f"<div class='we0-head' data-status='{H.esc(self.status)}'>{' '.join(bits)}</div>"

    def _turns_html(self, final: bool) -> str:
        streaming = None if final or self._open is None else self._open.id
        cut = self.status == "aborted"
        out = []
        for t in self.turns:
            if t.info is not None and t.info.role == "user":
                out.append(H.message_html(t.info, t.parts))
            else:
                out.append(H.message_html(t.info, t.parts, streaming_id=streaming, recovery=self.recovery, cut=cut))
        return "".join(out)

    def _foot_html(self) -> str:
        out = []
        if self.recovery_log:
            out.append(f"<div class='we0-note'>recovery: {H.esc('; '.join(self.recovery_log))}</div>")
        if self.status == "aborted":
            out.append("<div class='we0-note we0-warn'>Aborted: everything so far is persisted; calls cut at "
                       "the abort stay as they were stored until a resume decides them.</div>")
        if self.error is not None:
            out.append(f"<div class='we0-err'>{H.esc(type(self.error).__name__)}: {H.esc(self.error)}</div>")
        if self.awaiting:
            out.append(f"<div class='we0-note we0-warn'>{H.esc(approval_sentence(len(self.awaiting)))}</div>")
        if self.result is not None and self.status in ("finished", "approval"):
            r = self.result
            out.append(f"<div class='we0-note'>result {H.esc(r.result)} · {H.esc(r.steps)} step(s) · "
                       f"tokens {H.esc(r.usage.input_tokens)} in / {H.esc(r.usage.output_tokens)} out</div>")
            if getattr(r, "truncated", False):
                out.append(f"<div class='we0-warn'>{H.esc(TRUNCATED)}</div>")
        return "".join(out)

    def html(self, final: bool = False) -> str:
        return H.wrap(self._head_html() + self._turns_html(final) + self._foot_html(), extra_class="we0-live")

    def text(self, final: bool = False) -> str:
        head = f"we0nb run [{self.status}]"
        if self.session_id:
            head += f" session={self.session_id}"
        if not final:
            chars = sum(len(p.text) for t in self.turns for p in t.parts if getattr(p, "type", "") == "text")
            return visible(f"{head} — {_count(self.delta_count, 'delta')}, {_count(chars, 'char')} so far")
        # (each line made visible once: message_text's lines are already — the whole transcript's
        # text is not searched again)
        lines = [visible(head)]
        lines += [message_text(t.info, t.parts, limit=None) for t in self.turns]  # exact text
        if self.recovery_log:
            lines.append(visible("recovery: " + "; ".join(self.recovery_log)))
        if self.status == "aborted":
            lines.append("aborted: everything so far is persisted; unfinished calls wait for a resume")
        if self.awaiting:
            lines.append(approval_sentence(len(self.awaiting)))
        if self.error is not None:
            lines.append(visible(f"error: {type(self.error).__name__}: {self.error}"))
        if getattr(self.result, "truncated", False):
            lines.append(TRUNCATED)
        if self.model_calls and self.cost is not None:
            lines.append(f"cost: {format_cost(self.cost)} ({self.model_calls} model call{'s' * (self.model_calls != 1)})")
        return "\n".join(lines)

    def bundle(self, final: bool = False) -> Bundle:
        # the plain text of intermediate updates is a short summary (fewer bytes on iopub);
        # the final update carries the full summary (what a saved notebook and nbval keep)
        return {"text/html": self.html(final), "text/plain": self.text(final)}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Bundle:
        return self.bundle(final=self.status != "running")

    # ------------------------------------------------------------------ consuming a stream

    async def consume(self, stream: AsyncIterator[dict[str, Any]]) -> Any:
        """Feed ``stream`` to the view; returns the RunResult, or None when the run was aborted.

        A failure is shown in the view and re-raised; a cancellation of the calling task
        itself (not an abort of the run) is re-raised too.
        """
        if self.status != "running":
            self.start()
        try:
            async for ev in stream:
                self.feed(ev)
        except asyncio.CancelledError:
            self.close("aborted")
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                raise
            return None
        except BaseException as exc:
            self.close("failed", exc)
            raise
        self.close("approval" if getattr(self.result, "result", None) == "approval" else "finished")
        return self.result

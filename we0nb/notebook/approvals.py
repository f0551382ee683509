"""The approval rows of a RunPanel: each awaiting call with Approve / Deny and its arguments to edit.

A row shows the call as the store holds it — tool, call id, arguments (escaped), why it
needs approval — with a text box holding the arguments as JSON (edit them before
approving: the corrected arguments are what runs, the model's own are kept), a text box
for the reason of a denial, and the Approve / Deny buttons. A click records the decision
through ``agent.approve``/``agent.deny`` (durable when it returns); arguments that are not
JSON, not an object, or that fail the tool's schema give a message in the row and record
nothing. When no call is left undecided the panel resumes the run.

Clicks follow the panel's rule: a handler may run on another thread (a kernel subshell),
so it only reads the row's values and schedules the decision onto the kernel's loop
(``loop.call_soon_threadsafe``); nothing awaits in a handler. On ipykernel 6 the clicks
and the edits of the text boxes are read as their messages arrive
(:mod:`we0nb.notebook.clicks`), so a decision is taken while another cell runs.

Edits while another cell runs: the widgets' front end sends a text box's next edit only
once the kernel has reported its previous one ``idle``, and a kernel busy with a cell
reports nothing for comm messages it handles past that cell (ipykernel 7.4's bypass, a
subshell, ipykernel 6 until the cell ends) — so a second edit would never arrive. The
text boxes therefore send an edit when they lose focus (``continuous_update=False``),
and each edit received replaces the box by a fresh one holding the same text: every
edit is the first one of its widget, sent at once, in order before the click that
follows it.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import TYPE_CHECKING, Any, Optional

from . import clicks
from .html import esc
from .part_text import json_visible
from .styles import row_border, row_message

if TYPE_CHECKING:  # pragma: no cover
    from .panel import RunPanel

__all__ = ["ApprovalBox", "ApprovalRow", "parse_arguments"]

#: the engine's "approve(input=...): " in front of its messages (the row says which button failed)
_ENGINE_PREFIX = re.compile(r"^(approve|deny)\([^)]*\): ")


def parse_arguments(text: str, original: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The edited arguments: None when they equal the model's (approve as is), else the dict.

    Raises ValueError with a sentence for the row when the text is not a JSON object.
    """
    try:
        value = json.loads(text) if text.strip() else None
    except json.JSONDecodeError as e:
        raise ValueError(f"the arguments are not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(value, dict):
        got = "nothing" if value is None else type(value).__name__
        raise ValueError(f"the arguments must be a JSON object ({{...}}), got {got}")
    return None if value == original else value


def _pretty(value: Any) -> str:
    return json_visible(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str))


class ApprovalRow:
    """One awaiting call and its controls (``message`` says what became of the last click)."""

    def __init__(self, box: "ApprovalBox", part: Any):
        import ipywidgets as W

        self.box = box
        self.part = part
        self.call_id: str = part.call_id
        self.decision: Optional[str] = None
        #: the text boxes' latest values as their messages arrived (ipykernel 6: the edits
        #: wait behind a running cell like the click, so the click reads them from here)
        self.typed: dict[str, str] = {}
        detail = part.approval_detail
        why = detail.why if detail is not None and detail.why else "a person must approve or deny it"
        self.info = W.HTML(value=(
            f"<div style='white-space:normal'><b><code>{esc(part.tool)}</code></b> "
            f"<span style='opacity:0.75'>call {esc(part.call_id)}</span><br>"
            f"<span style='opacity:0.85'>why: {esc(why)}</span><br>"
            f"<code style='white-space:pre-wrap'>{esc(json.dumps(part.state.input, ensure_ascii=False))}"
            f"</code></div>"), layout=W.Layout(width="100%"))
        self._rows = min(12, max(2, _pretty(part.state.input).count("\n") + 1))
        self.args = self._text_box("args", _pretty(part.state.input))
        self.reason = self._text_box("reason", "")
        fixed = W.Layout(width="auto", flex="0 0 auto")
        self.approve_button = W.Button(description="Approve", icon="check", button_style="success", layout=fixed,
                                       tooltip="Record the approval (with the arguments above) and resume when "
                                               "no call is left undecided")
        self.deny_button = W.Button(description="Deny", icon="times", button_style="danger", layout=fixed,
                                    tooltip="Record the denial: the call never runs; the model is told")
        self.message = W.HTML(value="", layout=W.Layout(flex="1 1 auto", min_width="0"))
        for w, cls in ((self.approve_button, "we0-approve"), (self.deny_button, "we0-deny"),
                       (self.message, "we0-approval-message")):
            w.add_class(cls)
        self._buttons = W.HBox([self.approve_button, self.deny_button, self.message],
                               layout=W.Layout(align_items="center", width="100%"))
        # each box in a holder of its own: renewing it re-renders that holder only, never the
        # buttons (a button re-rendered between mouse-down and mouse-up would lose the click)
        self._holders = {"args": W.Box([self.args], layout=W.Layout(width="100%")),
                         "reason": W.Box([self.reason], layout=W.Layout(width="100%"))}
        self.widget = W.VBox([self.info, self._holders["args"], self._holders["reason"], self._buttons],
                             layout=W.Layout(border="1px solid rgba(128,128,128,0.4)", padding="4px", margin="4px 0",
                                             width="100%"))
        self.widget.add_class("we0-approval")
        self.approve_button.on_click(self._on_approve_click)
        self.deny_button.on_click(self._on_deny_click)
        if clicks.install():  # ipykernel 6: handle the click (and read the edits) as its message arrives
            clicks.register(self.approve_button.model_id, self._on_approve_message)
            clicks.register(self.deny_button.model_id, self._on_deny_message)

    # ------------------------------------------------------------------ the text boxes

    def _text_box(self, name: str, value: str) -> Any:
        """The arguments (JSON) or the reason box; an edit is sent when it loses focus."""
        import ipywidgets as W

        if name == "args":
            box = W.Textarea(value=value, rows=self._rows, layout=W.Layout(width="100%"), continuous_update=False,
                             description="arguments", tooltip="edit the arguments (JSON) before approving")
        else:
            box = W.Text(value=value, placeholder="reason for a denial (optional; the model is told)",
                         layout=W.Layout(width="100%"), description="reason", continuous_update=False)
        box.add_class("we0-" + name)
        box.observe(self._edited, names="value")
        if clicks.install():
            clicks.register_state(box.model_id, self._on_args_state if name == "args" else self._on_reason_state)
        return box

    def _edited(self, change: Any) -> None:
        """An edit arrived (any thread): a fresh box replaces this one (see the module docstring)."""
        name = "args" if change["owner"] is self.args else "reason" if change["owner"] is self.reason else None
        if name is not None:
            self.box.on_loop(self._renew, name, change["owner"])

    def _renew(self, name: str, old: Any, value: Optional[str] = None) -> None:
        """Replace the box ``old`` by a fresh one holding ``value`` (default: its own)."""
        if getattr(self, name) is not old:
            return  # renewed already
        old.unobserve(self._edited, names="value")
        clicks.unregister(old.model_id)  # the box stays open: its queued messages still find it
        new = self._text_box(name, old.value if value is None else value)
        new.disabled = old.disabled
        setattr(self, name, new)
        self._holders[name].children = (new,)

    # ------------------------------------------------------------------ state

    def say(self, text: str, error: bool = False) -> None:
        self.message.value = row_message(text, error)

    def set_busy(self, busy: bool) -> None:
        done = self.decision is not None
        for w in (self.approve_button, self.deny_button, self.args, self.reason):
            w.disabled = busy or done

    def decided(self, decision: str, text: str) -> None:
        self.decision = decision
        self.set_busy(False)
        self.say(text)
        self.widget.layout.border = row_border(decision == "approved")

    def close(self) -> None:
        for w in (self.approve_button, self.deny_button, self.args, self.reason):
            clicks.unregister(w.model_id)

    # ------------------------------------------------------------------ clicks (any thread)

    def _values(self) -> tuple[str, str]:
        args: str = self.args.value  # (the boxes are Any: typed here so dict.get keeps str)
        reason: str = self.reason.value
        return self.typed.get("args", args), self.typed.get("reason", reason)

    def _on_args_state(self, state: dict) -> None:
        if isinstance(state.get("value"), str):
            self.typed["args"] = state["value"]
            self._renew("args", self.args, state["value"])  # on arrival (the loop's thread): the next edit goes to a fresh box

    def _on_reason_state(self, state: dict) -> None:
        if isinstance(state.get("value"), str):
            self.typed["reason"] = state["value"]
            self._renew("reason", self.reason, state["value"])

    def _on_approve_message(self, header: dict) -> None:
        self.box.click_threads.append(threading.current_thread().name + " (on arrival)")
        self.box.schedule(self, True, *self._values())

    def _on_deny_message(self, header: dict) -> None:
        self.box.click_threads.append(threading.current_thread().name + " (on arrival)")
        self.box.schedule(self, False, *self._values())

    def _click(self, approve: bool) -> None:
        if clicks.handled(clicks.current_click_header()):
            return  # already decided when the message arrived (ipykernel 6)
        self.typed.clear()  # the edits' messages were handled in order before this click: the widgets are current
        self.box.click_threads.append(threading.current_thread().name)
        self.box.schedule(self, approve, self.args.value, self.reason.value)

    def _on_approve_click(self, _button: Any = None) -> None:
        self._click(True)

    def _on_deny_click(self, _button: Any = None) -> None:
        self._click(False)


class ApprovalBox:
    """The panel's rows for the calls awaiting a decision, and the decisions they record."""

    def __init__(self, panel: "RunPanel"):
        import ipywidgets as W

        self.panel = panel
        self.rows: list[ApprovalRow] = []
        #: names of the threads the Approve/Deny handlers ran on (a subshell shows up here)
        self.click_threads: list[str] = []
        self._lock: Optional[asyncio.Lock] = None
        self._tasks: set[asyncio.Task] = set()
        self.widget = W.VBox([], layout=W.Layout(width="100%"))
        self.widget.add_class("we0-approvals")

    @property
    def undecided(self) -> list[ApprovalRow]:
        return [r for r in self.rows if r.decision is None]

    def show(self, parts: list[Any]) -> None:
        """Rows for ``parts`` (the awaiting calls, in call order), replacing the previous ones."""
        self.clear()
        self.rows = [ApprovalRow(self, p) for p in parts]
        self.widget.children = tuple(r.widget for r in self.rows)

    def clear(self) -> None:
        for r in self.rows:
            r.close()
        self.rows = []
        self.widget.children = ()

    def row(self, call_id: str) -> Optional[ApprovalRow]:
        return next((r for r in self.rows if r.call_id == call_id), None)

    def send_state(self) -> None:
        for r in self.rows:
            for w in (r.info, r.args, r.reason, r.approve_button, r.deny_button, r.message, r.widget):
                try:
                    w.send_state()
                except Exception:  # no kernel comm (tests without a front end)
                    pass

    # ------------------------------------------------------------------ scheduling (any thread)

    def on_loop(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the kernel's loop thread (now when already there)."""
        loop = self.panel._loop
        if loop is None or self.panel._on_loop_thread():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def schedule(self, row: ApprovalRow, approve: bool, args_text: str, reason_text: str) -> None:
        """Run the decision on the kernel's loop (the handler may be on a subshell thread)."""
        loop = self.panel._loop
        if loop is None:
            row.say("no event loop to record the decision on; use `await panel.approve(call_id)` in a cell",
                    error=True)
            return
        if self.panel._on_loop_thread():
            self._start(row, approve, args_text, reason_text)
        else:
            loop.call_soon_threadsafe(self._start, row, approve, args_text, reason_text)

    def _start(self, row: ApprovalRow, approve: bool, args_text: str, reason_text: str) -> None:
        if row.decision is not None or row not in self.rows:
            return  # a second click on a decided row, or a row replaced meanwhile
        row.set_busy(True)
        row.say("recording the approval…" if approve else "recording the denial…")
        task = asyncio.get_running_loop().create_task(self._clicked(row, approve, args_text, reason_text))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _clicked(self, row: ApprovalRow, approve: bool, args_text: str, reason_text: str) -> None:
        try:
            if approve:
                try:
                    edited = parse_arguments(args_text, dict(row.part.state.input))
                except ValueError as e:
                    row.set_busy(False)
                    row.say(f"Not approved: {e}. Nothing was recorded.", error=True)
                    return
                await self.decide(row.call_id, True, input=edited)
            else:
                await self.decide(row.call_id, False, reason=reason_text.strip() or None)
        except Exception as exc:  # shown in the row: a click has nowhere else to raise
            row.set_busy(False)
            row.say(_failure(exc, "approved" if approve else "denied"), error=True)
            await self._decided_elsewhere(row)

    async def _decided_elsewhere(self, row: ApprovalRow) -> None:
        """After a refused decision: if the store says the call no longer awaits one (decided from
        another panel, the CLI, code), the row is closed and the run resumes once none is left."""
        panel = self.panel
        try:
            left = await panel.agent.pending_approvals(panel.session_id)
        except Exception:  # the store cannot be read now: the row's message already says what failed
            return
        if all(p.call_id != row.call_id for p in left):
            row.decision = "elsewhere"
            row.set_busy(False)
            panel._after_decision(len(left))

    # ------------------------------------------------------------------ decisions (on the loop)

    async def decide(self, call_id: str, approve: bool, *, input: Optional[dict[str, Any]] = None,
                     reason: Optional[str] = None) -> Any:
        """Record one decision (one at a time: each takes the session's lease to write), show it
        in its row, and resume the run when no call of the session is left undecided."""
        panel = self.panel
        if panel.session_id is None:
            raise ValueError("RunPanel has no session: nothing awaits a decision.")
        await panel._looked()
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            agent = panel.agent
            if approve:
                part = await agent.approve(panel.session_id, call_id, input=input)
            else:
                part = await agent.deny(panel.session_id, call_id, reason=reason)
            row = self.row(call_id)
            if row is not None:
                row.decided(part.approval, _recorded(part))
            panel.view.record_decision(part)
            left = await agent.pending_approvals(panel.session_id)
        panel._after_decision(len(left))
        return part


def _recorded(part: Any) -> str:
    detail = part.approval_detail
    if part.approval == "approved":
        edited = detail is not None and detail.input is not None
        return "Approved" + (" with the corrected arguments" if edited else "") + " (recorded in the store)."
    reason = detail.reason if detail is not None else None
    return "Denied" + (f": {reason}" if reason else "") + " (recorded in the store; the call never runs)."


def _failure(exc: BaseException, verb: str) -> str:
    """A failed decision, for its row: what went wrong, and that nothing was recorded."""
    from ..errors import SessionBusyError

    if isinstance(exc, SessionBusyError):
        return (f"Not {verb}: a run holds this session now; nothing was recorded. Decide once it has ended "
                f"({type(exc).__name__}: {exc}).")
    lines = [line.strip() for line in str(exc).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    text = "; ".join(lines[:4]) or type(exc).__name__
    if not isinstance(exc, (ValueError, TypeError)):
        text = f"{type(exc).__name__}: {text}"
    return f"Not {verb}: {_ENGINE_PREFIX.sub('', text)} Nothing was recorded."

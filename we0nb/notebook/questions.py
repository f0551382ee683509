"""The question rows of a RunPanel: an MCP server's question (elicitation) as a form to fill in.

While a run goes, each running call whose question awaits a person gets a row: the tool, the
call id, the server's message, and a form built from the requested schema — a text box per
string (and per number or integer: what is typed is read as one), a checkbox per boolean, a
drop-down per enum — filled with the schema's defaults (SEP-1034), then **Accept**,
**Decline** and **Cancel**. A click answers through ``agent.answer`` (the same check as from
code or the CLI): an answer that does not match the schema gives a one-line message in the row
and nothing is sent or recorded. A URL question shows its link; Accept means the person opened it.

Clicks follow the panel's rule: a handler may run on another thread (a kernel subshell), so
it only reads the values and schedules the answer onto the kernel's loop. The text boxes send
their value when they lose focus (``continuous_update=False``).
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Optional

from .._forms import FormField, form_fields, parse_field
from . import clicks
from .html import esc
from .styles import row_border, row_message

if TYPE_CHECKING:  # pragma: no cover
    from .panel import RunPanel

__all__ = ["QuestionBox", "QuestionRow", "awaiting_of"]


def awaiting_of(part: Any) -> Optional[dict[str, Any]]:
    """The question a running call waits on (its last awaiting one), or None."""
    state = getattr(part, "state", None)
    if getattr(state, "status", None) != "running":
        return None
    qs = (getattr(state, "metadata", None) or {}).get("questions") or ()
    return next((q for q in reversed(qs) if isinstance(q, dict) and q.get("status") == "awaiting"), None)


class QuestionRow:
    """One awaiting question and its form (``message`` says what became of the last click)."""

    def __init__(self, box: "QuestionBox", part: Any, question: dict[str, Any]):
        import ipywidgets as W

        self.box = box
        self.part = part
        self.call_id: str = part.call_id
        self.question = question
        self.answered: Optional[str] = None
        self.fields: list[FormField] = form_fields(question.get("schema") or {}) \
            if question.get("mode", "form") == "form" else []
        link = ""
        if question.get("mode") == "url" and str(question.get("url", "")).startswith(("http://", "https://")):
            url = esc(str(question["url"]))
            link = f"<br><a href='{url}' target='_blank' rel='noopener noreferrer'>{url}</a>"
        self.info = W.HTML(value=(
            f"<div style='white-space:normal'><b><code>{esc(part.tool)}</code></b> "
            f"<span style='opacity:0.75'>call {esc(part.call_id)} · "
            f"{esc(str(question.get('source', '')))} asks:</span><br>"
            f"<span class='we0-question-text'>{esc(str(question.get('message', '')))}</span>{link}</div>"),
            layout=W.Layout(width="100%"))
        self.inputs = {f.name: self._input(f) for f in self.fields}
        fixed = W.Layout(width="auto", flex="0 0 auto")
        self.buttons = {
            "accept": W.Button(description="Accept", icon="check", button_style="success", layout=fixed,
                               tooltip="Send the answer above to the server"),
            "decline": W.Button(description="Decline", icon="times", button_style="danger", layout=fixed,
                                tooltip="Tell the server no"),
            "cancel": W.Button(description="Cancel", icon="ban", layout=fixed,
                               tooltip="Dismiss the question (the server is told it was cancelled)"),
        }
        self.message = W.HTML(value="", layout=W.Layout(flex="1 1 auto", min_width="0"))
        self.message.add_class("we0-question-message")
        for action, b in self.buttons.items():
            b.add_class(f"we0-question-{action}")
            b.on_click(functools.partial(self._on_click, action))
            if clicks.install():
                clicks.register(b.model_id, functools.partial(self._on_message, action))
        self.widget = W.VBox([self.info, *self.inputs.values(),
                              W.HBox([*self.buttons.values(), self.message],
                                     layout=W.Layout(align_items="center", width="100%"))],
                             layout=W.Layout(border="1px solid rgba(128,128,128,0.4)", padding="4px", margin="4px 0",
                                             width="100%"))
        self.widget.add_class("we0-question")

    def _input(self, f: FormField) -> Any:
        import ipywidgets as W

        label = f.title + (" *" if f.required else "")
        style = {"description_width": "initial"}
        if f.kind == "boolean":
            w = W.Checkbox(value=bool(f.default), description=label, indent=False, style=style)
        elif f.kind == "enum":
            options = [(lbl, v) for lbl, v in zip(f.labels, f.options)]
            if not f.required and f.default is None:
                options = [("", None), *options]
            w = W.Dropdown(options=options, value=f.default if f.default in f.options else options[0][1],
                           description=label, style=style)
        else:
            w = W.Text(value="" if f.default is None else str(f.default), description=label, style=style,
                       placeholder=f.description or f.kind, continuous_update=False, layout=W.Layout(width="100%"))
        w.add_class(f"we0-field-{f.name}")
        if f.description:
            w.tooltip = f.description
        return w

    def values(self) -> dict[str, Any]:
        """The form as an answer (ValueError: a box holds something that is not its type)."""
        out: dict[str, Any] = {}
        for f in self.fields:
            w = self.inputs[f.name]
            value = parse_field(f, w.value) if isinstance(w.value, str) and f.kind != "enum" else w.value
            if value is not None:
                out[f.name] = value
        return out

    def say(self, text: str, error: bool = False) -> None:
        self.message.value = row_message(text, error)

    def set_busy(self, busy: bool) -> None:
        for w in (*self.buttons.values(), *self.inputs.values()):
            w.disabled = busy or self.answered is not None

    def done(self, action: str, text: str) -> None:
        self.answered = action
        self.set_busy(False)
        self.say(text)
        self.widget.layout.border = row_border(action == "accept")

    def close(self) -> None:
        for b in self.buttons.values():
            clicks.unregister(b.model_id)

    def _on_message(self, action: str, header: dict) -> None:
        self.box.schedule(self, action)

    def _on_click(self, action: str, _button: Any = None) -> None:
        if clicks.handled(clicks.current_click_header()):
            return  # already answered when the message arrived (ipykernel 6)
        self.box.schedule(self, action)


class QuestionBox:
    """The panel's rows for the questions its run waits on, and the answers they send."""

    def __init__(self, panel: "RunPanel"):
        import ipywidgets as W

        self.panel = panel
        self.rows: list[QuestionRow] = []
        self._tasks: set[asyncio.Task] = set()
        self.widget = W.VBox([], layout=W.Layout(width="100%"))
        self.widget.add_class("we0-questions")

    def row(self, call_id: str) -> Optional[QuestionRow]:
        return next((r for r in self.rows if r.call_id == call_id and r.answered is None), None)

    def seen(self, part: Any) -> None:
        """A ``tool`` event: a row for a new question; a row closed whose question is answered."""
        q = awaiting_of(part)
        current = next((r for r in self.rows if r.call_id == part.call_id and r.answered is None), None)
        if current is not None and (q is None or q.get("id") != current.question.get("id")):
            current.done("elsewhere", "answered" if q is None and part.state.status == "running"
                         else "the call ended without this answer")
            current.answered = "elsewhere"
        if q is not None and (current is None or q.get("id") != current.question.get("id")):
            self.rows.append(QuestionRow(self, part, q))
            self.widget.children = tuple(r.widget for r in self.rows)

    def clear(self) -> None:
        for r in self.rows:
            r.close()
        self.rows = []
        self.widget.children = ()

    def schedule(self, row: QuestionRow, action: str) -> None:
        """Answer on the kernel's loop (the handler may be on a subshell thread)."""
        try:
            content = row.values() if action == "accept" and row.fields else None
        except ValueError as e:
            self._on_loop(row.say, f"Not sent: {e}. Nothing was recorded.", True)
            return
        self._on_loop(self._start, row, action, content)

    def _on_loop(self, fn: Any, *args: Any) -> None:
        loop = self.panel._loop
        if loop is None or self.panel._on_loop_thread():
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _start(self, row: QuestionRow, action: str, content: Optional[dict[str, Any]]) -> None:
        if row.answered is not None or row not in self.rows:
            return
        row.set_busy(True)
        row.say("sending…")
        task = asyncio.get_running_loop().create_task(self._answer(row, action, content))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, row: QuestionRow, action: str, content: Optional[dict[str, Any]]) -> None:
        try:
            await self.answer(row.call_id, content, action=action)
        except Exception as exc:  # shown in the row: a click has nowhere else to raise
            row.set_busy(False)
            text = str(exc).removeprefix("answer(): ")
            row.say(text if "nothing was sent" in text.lower() else f"{text} Nothing was sent or recorded.",
                    error=True)

    async def answer(self, call_id: str, content: Optional[dict[str, Any]] = None, *,
                     action: str = "accept") -> dict[str, Any]:
        """Answer the question call ``call_id`` waits on (``agent.answer``) and show it in its row."""
        panel = self.panel
        if panel.session_id is None:
            raise ValueError("RunPanel has no session: no question awaits an answer.")
        from ..engine.questions import answer_question

        q = await answer_question(panel.agent.persistence, panel.session_id, call_id, action, content, by="panel")
        row = self.row(call_id)
        if row is not None:
            said = f"accepted: {q.get('content')}" if action == "accept" and q.get("content") is not None \
                else f"{action}ed" if action != "cancel" else "cancelled"
            row.done(action, f"{said.replace('declineed', 'declined')} — sent to the server")
        return q

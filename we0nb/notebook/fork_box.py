"""The "Fork here" row of a RunPanel: pick a message of the session, fork the session there.

A dropdown lists the session's visible messages (number, role, the start of the text; the last
one chosen), filled from the store when the panel reads the session and after each run; the
**Fork here** button calls ``agent.fork(session_id, at=message)`` (:mod:`we0nb.engine.fork`:
nothing is executed, no model is called) and the row says the new session's id and how to go on
with it (another panel on it, ``mode="resume"``, another agent). ``forks`` lists the sessions made.

Clicks follow the panel's rule: the handler may run on another thread (a kernel subshell), so it
only reads the chosen message and schedules the fork onto the kernel's loop
(``loop.call_soon_threadsafe``); nothing awaits in a handler.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Optional

from .part_text import visible
from .styles import row_message

if TYPE_CHECKING:  # pragma: no cover
    from .panel import RunPanel

__all__ = ["ForkBox", "message_label"]

#: characters of a message's text its label shows
_LABEL_TEXT = 48


def message_label(number: int, message: Any) -> str:
    """``#3 assistant: the start of its text…`` (its tools when it has no text)."""
    body = " ".join(visible(message.text).split())
    if not body:
        body = ", ".join(p.tool for p in message.tool_parts) or "(no text)"
    if len(body) > _LABEL_TEXT:
        body = body[:_LABEL_TEXT - 1] + "…"
    return f"#{number} {message.info.role}: {body}"


class ForkBox:
    """The panel's fork row: a message picker, the Fork here button, a line saying what happened."""

    def __init__(self, panel: "RunPanel"):
        import ipywidgets as W

        self.panel = panel
        #: the sessions forked from this panel, in order
        self.forks: list[str] = []
        #: names of the threads the button's handler ran on
        self.click_threads: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        fixed = W.Layout(width="auto", flex="0 0 auto")
        self.picker = W.Dropdown(options=[], description="message", layout=W.Layout(width="34em", flex="0 1 auto"))
        self.fork_button = W.Button(description="Fork here", icon="code-fork", layout=fixed, disabled=True,
                                    tooltip="Copy the session up to the chosen message into a new session "
                                            "(nothing runs); go on there with any agent")
        self.message = W.HTML(value="", layout=W.Layout(flex="1 1 auto", min_width="0"))
        for w, cls in ((self.picker, "we0-fork-picker"), (self.fork_button, "we0-fork"),
                       (self.message, "we0-fork-message")):
            w.add_class(cls)
        self.widget = W.HBox([self.picker, self.fork_button, self.message],
                             layout=W.Layout(align_items="center", width="100%", display="none"))
        self.widget.add_class("we0-fork-row")
        self.fork_button.on_click(self._on_click)

    # ------------------------------------------------------------------ state (on the loop)

    def show_messages(self, messages: list[Any]) -> None:
        """List ``messages`` (the session's visible ones, in order), the last one chosen; the row
        shows once there is one."""
        options = [(message_label(i + 1, m), m.info.id) for i, m in enumerate(messages)]
        self.picker.options = options
        if options:
            self.picker.value = options[-1][1]
        self.widget.layout.display = "flex" if options else "none"
        self.set_busy(self.panel.status == "running")

    async def refresh(self) -> None:
        """Read the session's messages from the store and list them."""
        sid = self.panel.session_id
        if sid is None:
            return
        transcript = await self.panel.agent.transcript(sid)
        self.show_messages(list(transcript.messages))

    def set_busy(self, busy: bool) -> None:
        self.fork_button.disabled = busy or not self.picker.options
        self.picker.disabled = busy

    def say(self, text: str, error: bool = False) -> None:
        self.message.value = row_message(text, error)

    # ------------------------------------------------------------------ the fork

    async def fork(self, at: Optional[str] = None, new_session_id: Optional[str] = None) -> str:
        """Fork the panel's session at message ``at`` (default: the chosen one); the new session's id."""
        panel = self.panel
        if panel.session_id is None:
            raise ValueError("RunPanel has no session to fork yet; start() a run first or create the panel "
                             "with session_id=.")
        chosen = at if at is not None else self.picker.value
        fid = await panel.agent.fork(panel.session_id, at=chosen, new_session_id=new_session_id)
        self.forks.append(fid)
        where = f" at message #{self._number(chosen)}" if chosen is not None else ""
        self.say(f"Forked the session{where} into {fid} (nothing ran). Go on there: "
                 f"RunPanel(agent, session_id={fid!r}).resume(), or agent.invoke(mode='resume', session_id={fid!r}).")
        return fid

    def _number(self, message_id: Any) -> int:
        ids = [value for _, value in self.picker.options]
        return ids.index(message_id) + 1 if message_id in ids else 0

    # ------------------------------------------------------------------ the click (any thread)

    def _on_click(self, _button: Any = None) -> None:
        self.click_threads.append(threading.current_thread().name)
        at = self.picker.value
        loop = self.panel._loop
        if loop is None:
            self.say("no event loop to fork on; use `await panel.fork(message_id)` in a cell", error=True)
            return
        if self.panel._on_loop_thread():
            self._start(at)
        else:
            loop.call_soon_threadsafe(self._start, at)

    def _start(self, at: Any) -> None:
        self.set_busy(True)
        self.say("forking…")
        task = asyncio.get_running_loop().create_task(self._clicked(at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _clicked(self, at: Any) -> None:
        try:
            await self.fork(at)
        except Exception as exc:  # shown in the row: a click has nowhere else to raise
            self.say(f"Not forked: {exc}", error=True)
        finally:
            self.set_busy(self.panel.status == "running")

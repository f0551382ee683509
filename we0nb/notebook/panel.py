"""RunPanel: Abort / Resume buttons, a status line and the live view of a session's runs.

The run goes on as a **background task on the kernel's event loop**, so the cell returns
at once and a click is handled while the run streams; ``await panel.wait()`` joins it.
Clicks may arrive on another thread (JupyterLab 4.6 sends widget messages to a kernel
subshell; ipykernel 7.0–7.3 runs the handler on a ``subshell-…`` thread), so Abort sets
a ``threading.Event`` flag and wakes the loop with ``loop.call_soon_threadsafe``, and
Resume is scheduled onto the loop the same way — nothing awaits in a handler. On
ipykernel 6, where a click would wait behind the cell that awaits the run, Abort is
handled as the message arrives (:mod:`we0nb.notebook.clicks`).

Content goes through one display handle (the live view, displayed below the widgets),
not an ``Output`` widget: updates from a task or a click keep reaching the cell that
displayed the panel, and the saved notebook shows the final transcript without a kernel.

Panels on one session know each other: a run started in one waits for the run going on
in another (two ``%%we0`` cells in a row queue), and an older panel's Resume is disabled
once a newer one runs the session. Resume first reads the store: a session whose turn is
over is not run again.

Below them, a **Fork here** row (:mod:`we0nb.notebook.fork_box`): pick a message of the session
and fork it there (``agent.fork``; nothing runs), to ask a what-if in another panel.

A run that ends with calls awaiting a person's decision (``result == "approval"``), or a
panel opened on a session whose calls await one (after a kernel restart, say), shows one
row per call with Approve / Deny (:mod:`we0nb.notebook.approvals`); when no call is left
undecided the panel resumes the run.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any, AsyncIterator, Callable, Optional

from . import clicks
from .approvals import ApprovalBox
from .fork_box import ForkBox
from .questions import QuestionBox
from .html import esc
from .part_text import effects_sentence, visible
from .live import LiveView, _in_kernel, ipython_display

__all__ = ["RunPanel", "STATUSES"]

STATUSES = ("idle", "running", "aborted", "needs resume", "awaiting approval", "finished", "failed")
_AWAITING = "awaiting approval"

_panels: "weakref.WeakSet[RunPanel]" = weakref.WeakSet()


class RunPanel:
    """A run panel bound to ``agent`` and one session.

    ``start(text)`` sends a user message (prompt mode), ``resume()`` (or the Resume button)
    continues the session in resume mode, the Abort button sets the run's abort event.
    ``status`` is one of :data:`STATUSES`; ``result`` is the last RunResult (None when the
    last run was aborted or failed), ``exception`` the last failure.
    ``last_abort_latency`` is the seconds from the Abort click (as the front end stamped
    it) to the run stopping. ``approvals`` holds the rows of the calls awaiting a decision
    (status ``"awaiting approval"``); :meth:`approve` / :meth:`deny` do what their buttons do.
    ``view``: an existing :class:`LiveView` to render into (``show()`` passes its own).
    """

    def __init__(self, agent: Any, session_id: Optional[str] = None, *, interval: float = 0.05,
                 title: Optional[str] = None, display: Optional[Callable[[dict], Any]] = None,
                 check: bool = True, view: Optional[LiveView] = None):
        if not (hasattr(agent, "stream_request") and hasattr(agent, "build_request")):
            raise TypeError(f"RunPanel(agent): expected a We0Agent, got {type(agent).__name__}.")
        if agent.output_type is not None:
            raise ValueError("RunPanel streams the run, which an agent with output_type cannot do; "
                             "use `await agent.invoke(...)` for structured output.")
        self.agent = agent
        self.session_id = session_id
        self.status = "idle"
        self.detail = ""
        self.result: Any = None
        self.exception: Optional[BaseException] = None
        self.view = view if view is not None else LiveView(interval=interval, display=display or ipython_display(),
                                                           title=title)
        self._make_widgets()
        self._task: Optional[asyncio.Task] = None
        self._abort_event: Optional[asyncio.Event] = None
        self._abort_flag = threading.Event()
        self._displayed = False
        #: the display handles of the widgets (one per display of the panel): each output's
        #: text/plain — what a saved notebook shows where widgets cannot render — follows the status
        self._widget_handles: list[Any] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[int] = None
        self._superseded = False
        self._next_run: Optional[asyncio.Future] = None  # wait(decisions=True) waits on it
        #: a run ended since the final state was last sent from a cell (see _resend_final)
        self._final_unsent = False
        #: epoch seconds of the last Abort click (the front end's stamp), of the last run's end, and the latency
        self.abort_clicked_at: Optional[float] = None
        self.ended_at: Optional[float] = None
        self.last_abort_latency: Optional[float] = None
        #: names of the threads click handlers ran on (a subshell shows up here)
        self.click_threads: list[str] = []
        _panels.add(self)
        if clicks.install():
            clicks.register(self.abort_button.model_id, self._on_abort_message)
        try:
            self._bind_loop(asyncio.get_running_loop())
        except RuntimeError:
            pass
        #: the look at the stored session the panel began with (see :meth:`_looked`)
        self._check_task: Optional[asyncio.Task] = None
        if check and session_id is not None and self._loop is not None:
            self._check_task = self._loop.create_task(self.check())
            self._check_task.add_done_callback(self._checked)

    def _make_widgets(self) -> None:
        import ipywidgets as W

        fixed = W.Layout(width="auto", flex="0 0 auto")
        self.abort_button = W.Button(description="Abort", icon="stop", button_style="danger", layout=fixed,
                                     tooltip="Stop the run; everything so far is persisted", disabled=True)
        self.resume_button = W.Button(description="Resume", icon="play", button_style="success", layout=fixed,
                                      tooltip="Continue the session in resume mode", disabled=True)
        # an HTML line that wraps: a long error never squeezes the buttons or gets cut off
        self.status_label = W.HTML(value="status: idle", layout=W.Layout(flex="1 1 auto", min_width="0"))
        self.abort_button.add_class("we0-abort")
        self.resume_button.add_class("we0-resume")
        self.status_label.add_class("we0-status")
        self.controls = W.HBox([self.abort_button, self.resume_button, self.status_label],
                               layout=W.Layout(align_items="center", width="100%"))
        self.approvals = ApprovalBox(self)
        self.questions = QuestionBox(self)
        self.forks = ForkBox(self)
        self.widget = W.VBox([self.controls, self.approvals.widget, self.questions.widget, self.forks.widget],
                             layout=W.Layout(width="100%"))
        self.widget.add_class("we0-panel")
        self.abort_button.on_click(self._on_abort_click)
        self.resume_button.on_click(self._on_resume_click)

    async def _looked(self) -> None:
        """Wait for the look at the stored session this panel began with (its turn, its rows): a
        decision or a run that came first would show its message before the user's that led to it."""
        task = self._check_task
        if task is not None and not task.done() and task is not asyncio.current_task():
            await asyncio.wait([task])  # (its failure is the status line's: see _checked)

    def _checked(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None and self.status == "idle":
            exc = task.exception()
            self._set_status("idle", f"could not read the session: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ display

    def _widget_bundle(self) -> dict:
        data = dict(self.widget._repr_mimebundle_() or {})
        data["text/plain"] = self.status_text()  # what a notebook shows where the widget cannot render
        return data

    def _ipython_display_(self) -> None:
        from IPython.display import display

        self._widget_handles.append(display(self._widget_bundle(), raw=True, display_id=True))
        handle = self.view.handle
        if handle is None:
            self.view.open()
        elif getattr(handle, "display_id", None):
            display(self.view.bundle(final=self.status != "running"), raw=True, display_id=handle.display_id)
        self._displayed = True

    def display_controls(self) -> None:
        """Display the buttons (and approval rows) alone, in this cell: the view is already shown."""
        if _in_kernel():
            from IPython.display import display

            self._widget_handles.append(display(self._widget_bundle(), raw=True, display_id=True))
        self._displayed = True

    def _display_once(self) -> None:
        if not self._displayed and _in_kernel():
            self._ipython_display_()
        self._displayed = True

    # ------------------------------------------------------------------ status

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def _on_loop_thread(self) -> bool:
        return self._loop_thread is None or threading.get_ident() == self._loop_thread

    def status_text(self) -> str:
        """The status line as plain text: ``status: … · session … · detail`` (and, while calls
        await a decision, one line per call: what a saved notebook shows without widgets)."""
        label = f"status: {self.status}"
        if self.session_id:
            label += f" · session {self.session_id}"
        if self.detail:
            label += f" · {self.detail}"
        if self._superseded and self.status != "running":
            label += " · a newer panel runs this session; use that one"
        if self.status == _AWAITING:
            from .plain import render_text

            label += "".join(f"\n  {render_text(r.part).removeprefix('ToolPart: ')}" for r in self.approvals.undecided)
        return visible(label)

    def _set_status(self, status: str, detail: str = "") -> None:
        self.status = status
        self.detail = detail
        running = status == "running"
        self.abort_button.disabled = not running
        self.forks.set_busy(running)
        self.resume_button.disabled = (running or self._superseded or self.session_id is None
                                       or status not in ("aborted", "needs resume", "failed"))
        line = self.status_text().split("\n", 1)[0]
        self.status_label.value = f"<span style='white-space:normal'>{esc(line)}</span>"
        if self._on_loop_thread():  # (a click's thread has no cell to send to: the loop's next status does)
            self._update_fallbacks()  # a run that ends by itself too: saved, the text says how it ended

    async def check(self) -> str:
        """Look at the persisted session: 'needs resume' when its last turn is not over,
        'awaiting approval' (with a row per call) when calls wait for a person's decision."""
        if self.session_id is None or self.status == "running":
            return self.status
        t = await self.agent.transcript(self.session_id)
        if t.session is not None:
            self.forks.show_messages(list(t.messages))
        if t.session is not None and self.status == "idle":
            if t.pending_approvals:
                self.view.status = "approval"  # (its badge then says what the panel says: awaiting approval)
                self.view.show_turn(t.messages)
                self._await_decisions(t.pending_approvals)
            elif t.needs_resume:
                # the turn a resume continues (the user's message, what the cut reply holds); not
                # displayed from here before the panel is: its first display shows it. Its badge
                # says what the status line says: needs resume (it said a grey "idle")
                self.view.status = "unfinished"
                self.view.show_turn(t.messages, flush=self.view.handle is not None)
                self._set_status("needs resume", "the last turn did not finish")
        return self.status

    # ------------------------------------------------------------------ approvals

    def _await_decisions(self, parts: list) -> None:
        """Show a row per awaiting call (in call order); the status says how many."""
        self.approvals.show(list(parts))
        n = len(parts)
        self._set_status(_AWAITING, f"{n} call{'s' if n != 1 else ''} await{'s' if n == 1 else ''} a decision: "
                                    "approve or deny below; the run resumes once all are decided")

    def _after_decision(self, left: int) -> None:
        """A decision was recorded (on the loop): resume once no call of the session awaits one."""
        if left:
            if self.status == _AWAITING:
                self._set_status(_AWAITING, f"{left} call{'s' if left != 1 else ''} still "
                                            f"await{'s' if left == 1 else ''} a decision")
            return
        if self.running:
            return
        try:
            self.resume()
        except Exception as exc:  # shown in the panel: a click has nowhere else to raise
            self._set_status(self.status, f"cannot resume: {exc}")

    async def approve(self, call_id: str, input: Optional[dict] = None) -> Any:
        """What the Approve button does: record the approval (``input``: corrected arguments, checked
        against the tool's schema) and resume once no call is left undecided. The stored call."""
        return await self.approvals.decide(call_id, True, input=input)

    async def deny(self, call_id: str, reason: Optional[str] = None) -> Any:
        """What the Deny button does: record the denial (the model is told ``reason``) and resume
        once no call is left undecided. The stored call."""
        return await self.approvals.decide(call_id, False, reason=reason)

    async def fork(self, at: Optional[str] = None, new_session_id: Optional[str] = None) -> str:
        """What the Fork here button does: ``agent.fork`` of this session at message ``at`` (default:
        the one chosen in the row; the last). Nothing runs. The new session's id."""
        return await self.forks.fork(at, new_session_id)

    def _siblings(self) -> list["RunPanel"]:
        """Other panels on the same session and store."""
        store = getattr(self.agent, "persistence", None)
        return [p for p in list(_panels) if p is not self and p.session_id == self.session_id
                and getattr(p.agent, "persistence", None) is store]

    def _supersede(self) -> None:
        """A newer panel runs this session: this one's Resume would act on a stale view."""
        self._superseded = True
        if not self.running:
            self._set_status(self.status, self.detail)

    # ------------------------------------------------------------------ runs

    def start(self, text: str) -> None:
        """Send ``text`` as a user message and run in the background (prompt mode)."""
        from ..engine.request import user_message

        self._launch("prompt", [user_message(text)])

    def resume(self) -> None:
        """Continue the session in resume mode, in the background (nothing runs if its turn is over)."""
        if self.session_id is None:
            raise ValueError("RunPanel.resume(): this panel has no session yet; start() a run first "
                             "or create the panel with session_id=.")
        self._launch("resume", None)

    def _launch(self, mode: str, messages: Any) -> None:
        if self._task is not None and not self._task.done():
            raise RuntimeError("A run is already going on in this panel; Abort it or `await panel.wait()` first.")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "RunPanel runs in the background on the running event loop: call it from a notebook cell "
                "(the kernel's loop) or from async code. In a script use `await agent.invoke(...)`."
            ) from None
        self._bind_loop(loop)
        abort = asyncio.Event()
        request = self.agent.build_request(abort=abort, mode=mode, session_id=self.session_id, messages=messages)
        self.session_id = request.session_id
        before = [p._task for p in self._siblings() if p.running]
        for p in self._siblings():
            p._supersede()
        self._superseded = False
        _resend_ended(loop)  # a %%we0 cell after a panel whose run ended once its own cell had
        self._abort_event = abort
        self._abort_flag.clear()
        self.abort_clicked_at = None
        self.last_abort_latency = None
        self.result = None
        self.exception = None
        self.approvals.clear()
        if self._next_run is not None and not self._next_run.done():
            self._next_run.set_result(None)
        self._display_once()
        self._set_status("running", "queued behind the run of another panel on this session" if before else "")
        self._task = loop.create_task(self._run(request, mode, before))
        self._task.add_done_callback(self._done)

    async def _nothing_to_resume(self) -> bool:
        """Read the store before a resume. When the turn goes on, show it as stored (the user's
        message, what the cut reply holds) so the run updates it in place; else say, from what
        was persisted, why nothing runs."""
        t = await self.agent.transcript(self.session_id)
        self.view.clear_run()
        if t.pending_approvals:  # resume would only end "approval" again: decide first
            self.view.show_turn(t.messages)
            self.view.note = "nothing to resume yet: calls await a person's decision"
            self.view.close("approval")
            self._await_decisions(t.pending_approvals)
            return True
        if t.needs_resume:
            self.view.show_turn(t.messages)
            return False
        if t.session is None or not t.messages:
            said = (f"session {self.session_id} is not in the store" if t.session is None
                    else f"session {self.session_id} has no messages")
            self.view.note = f"nothing to resume: {said}"
            self.view.close("idle")
            self._set_status("idle", f"nothing to resume: {said}; start() a run on it first")
            return True
        self.view.show_turn(t.messages)
        self.view.note = "nothing to resume: the session's last turn is over"
        self.view.close("finished")
        self._set_status("finished", "nothing to resume: the last turn is over")
        return True

    async def _run(self, request: Any, mode: str, before: list) -> Any:
        await self._looked()
        if before:
            await asyncio.wait(before)
            self._set_status("running")
        if self._abort_flag.is_set():
            self.view.close("aborted")
            self._set_status("aborted", "aborted before it started")
            return None
        if mode == "resume" and await self._nothing_to_resume():
            return None
        self.view.start(note=f"{mode} run")
        try:
            result = await self.view.consume(self._watch(self.agent.stream_request(request)))
        finally:
            self.ended_at = time.time()
            if self.abort_clicked_at is not None:
                self.last_abort_latency = max(0.0, self.ended_at - self.abort_clicked_at)
        self.result = result
        if result is None:
            t = await self.agent.transcript(self.session_id)
            self.view.show_stored(t.messages)  # what the store holds now: calls cut at the abort
            self.view.refresh()
            self._set_status("aborted", "everything so far is persisted; Resume continues")
        elif result.result == "approval":
            self._await_decisions(result.approvals)
        else:
            effects = effects_sentence(p for t in self.view.turns for p in t.parts)
            self._set_status("finished", f"{result.steps} step(s)" + (f" · {effects}" if effects else ""))
        try:
            await self.forks.refresh()  # (the messages a fork may start from, this run's included)
        except Exception as exc:  # the store cannot be read now: the row says so, the run's outcome stands
            self.forks.say(f"cannot list the messages: {exc}", error=True)
        return result

    async def _watch(self, stream: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """The run's events, each ``tool`` event also shown to the question rows (an MCP server's
        question becomes a form; an answered one is closed)."""
        try:
            async for ev in stream:
                if ev.get("type") == "tool":
                    self.questions.seen(ev["part"])
                yield ev
        finally:
            for row in self.questions.rows:
                if row.answered is None:
                    row.done("elsewhere", "the run ended without this answer")

    async def answer(self, call_id: str, content: Optional[dict] = None, *, action: str = "accept") -> Any:
        """What the Accept / Decline / Cancel buttons of a question do: answer the question call
        ``call_id`` waits on (checked against the requested schema: a mismatch raises ValueError and
        nothing is sent or recorded). The question as answered."""
        return await self.questions.answer(call_id, content, action=action)

    def _done(self, task: asyncio.Task) -> None:
        self._final_unsent = True
        if task.cancelled():
            if self.view.status == "running":
                self.view.close("aborted")
            self._set_status("aborted", "cancelled")
            return
        exc = task.exception()
        if exc is not None:
            self.exception = exc
            if self.view.status == "running":
                self.view.close("failed", exc)
            self._set_status("failed", f"{type(exc).__name__}: {exc}"[:500])

    async def wait(self, *, decisions: bool = False) -> Any:
        """Join the run going on (if any); the RunResult, None when aborted; re-raises a failure.

        ``decisions=True``: when the run ends with calls awaiting approval, keep waiting — for a
        person's clicks and the run they resume — until a run ends otherwise (Run All then
        pauses here until the calls are decided).
        """
        while True:
            while self._task is not None and not self._task.done():
                await asyncio.wait([self._task])
            if not (decisions and self.status == _AWAITING and self.exception is None):
                break
            self._next_run = asyncio.get_running_loop().create_future()
            await self._next_run
        self._resend_final()
        _resend_ended(asyncio.get_running_loop())  # (the panels this run queued behind, for one)
        if self.exception is not None:
            raise self.exception
        return self.result

    def _resend_final(self) -> None:
        """Re-send the final state from the calling cell: nbclient/nbconvert/nbval drop messages
        sent by a background task after its cell ended, so a saved notebook would otherwise keep
        the starting state of the view and of the widgets ("running", Abort enabled)."""
        if self.view.handle is not None and self.view.status != "running":
            self.view.handle.update(self.view.bundle(final=True))
        self._resend_widgets()
        self._final_unsent = False

    def _resend_widgets(self) -> None:
        for w in (self.abort_button, self.resume_button, self.status_label, self.approvals.widget,
                  self.forks.picker, self.forks.fork_button, self.forks.message, self.forks.widget):
            try:
                w.send_state()
            except Exception:  # no kernel comm (tests without a front end)
                pass
        self.approvals.send_state()
        self._update_fallbacks()

    def _update_fallbacks(self) -> None:
        """Each display of the widgets again, with the status line as its plain text."""
        if self._widget_handles:
            bundle = self._widget_bundle()
            for handle in self._widget_handles:
                handle.update(bundle, raw=True)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ------------------------------------------------------------------ abort / resume (any thread)

    def abort(self, *, clicked_at: Optional[float] = None) -> None:
        """Abort the run going on; safe from any thread (a click on a kernel subshell).

        ``clicked_at`` (epoch seconds) is when the user asked for it; default now.
        """
        ev, loop = self._abort_event, self._loop
        if ev is None or loop is None or not self.running or self._abort_flag.is_set():
            return
        self.abort_clicked_at = clicked_at if clicked_at is not None else time.time()
        self._abort_flag.set()
        if self._on_loop_thread():
            ev.set()
            self.abort_button.disabled = True
        else:
            loop.call_soon_threadsafe(ev.set)
            loop.call_soon_threadsafe(setattr, self.abort_button, "disabled", True)

    def _on_abort_message(self, header: dict) -> None:
        """A click that arrived while the kernel was busy with another cell (ipykernel 6)."""
        self.click_threads.append(threading.current_thread().name + " (on arrival)")
        self.abort(clicked_at=clicks.click_time(header))

    def _on_abort_click(self, _button: Any = None) -> None:
        header = clicks.current_click_header()
        if clicks.handled(header):
            return  # already aborted when the message arrived
        self.click_threads.append(threading.current_thread().name)
        self.abort(clicked_at=clicks.click_time(header) if header else None)

    def _on_resume_click(self, _button: Any = None) -> None:
        self.click_threads.append(threading.current_thread().name)
        loop = self._loop
        if loop is None:
            self._set_status(self.status, "no event loop to run on; call panel.resume() in a cell")
            return
        if self._on_loop_thread():
            self._resume_safely()
        else:
            loop.call_soon_threadsafe(self._resume_safely)

    def _resume_safely(self) -> None:
        try:
            self.resume()
        except Exception as exc:  # shown in the panel: a click has nowhere else to raise
            self._set_status(self.status, f"cannot resume: {exc}")

    def __repr__(self) -> str:
        return f"RunPanel(session_id={self.session_id!r}, status={self.status!r})"


def _resend_ended(loop: Optional[asyncio.AbstractEventLoop]) -> None:
    """Re-send, from the calling cell, the final state of every panel on ``loop`` whose run ended
    after the last such re-send: Run All of ``%%we0`` cells joins only the last panel
    (``await we0_panel.wait()``), while the earlier ones ended after their own cells, their
    final updates dropped by nbclient — the saved notebook would show them "running"."""
    for p in list(_panels):
        if p._final_unsent and p._loop is loop and loop is not None and not p.running:
            p._resend_final()

"""A batch's live view in Jupyter: a bar, the counts by status, the latest errors, an Abort button.

The view is one output: the widgets (an HTML line and the button) in a bundle that also holds
``text/html`` and ``text/plain`` forms of the same state. A saved notebook opened without its
widget state (GitHub, Binder, JupyterLab before a run) shows those — so they are rewritten as
the batch ends, and read as its final state, never as a widget's Python repr.

The HTML carries only inline styles with plain colours (what JupyterLab's sanitiser keeps),
chosen to read on light and dark themes; the batch package does not import the notebook's.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any, Iterable, Optional

__all__ = ["BatchView", "render_html", "render_text"]

#: each status's colour (white text on it reads on light and dark backgrounds)
COLORS = {"pending": "#757575", "running": "#1976d2", "stop": "#388e3c", "compact": "#f57c00",
          "approval": "#7b1fa2", "failed": "#d32f2f", "aborted": "#f57c00"}
_LINE = "rgba(128,128,128,0.45)"


def _eta(ended_now: int, started_with: int, items: int, elapsed: float) -> str:
    done_here = ended_now - started_with
    if done_here <= 0 or elapsed <= 0:
        return ""
    rate = done_here / elapsed
    left = items - ended_now
    eta = f", about {left / rate:.0f} s left" if left > 0 else ""
    return f" · {rate:.1f} items/s{eta}"


def render_text(name: str, tally: Any, errors: Iterable[str], *, state: str = "running", pace: str = "") -> str:
    """The view as plain text (a saved notebook's fallback, nbval's comparison)."""
    counts = " ".join(f"{s}={n}" for s, n in tally.ordered())
    lines = [f"batch {name!r}: {state} · {tally.ended_items}/{tally.items} ended{pace} · {counts}"]
    lines += [f"  {e}" for e in errors]
    return "\n".join(lines)


def _bar(ended: int, items: int, colour: str) -> str:
    share = 100.0 * ended / items if items else 100.0
    return (f"<div style='width:100%;max-width:40em;height:8px;border:1px solid {_LINE};border-radius:4px;"
            f"margin:4px 0'><div style='width:{share:.1f}%;height:100%;background-color:{colour};"
            f"border-radius:3px'></div></div>")


def render_html(name: str, tally: Any, errors: Iterable[str], *, state: str = "running", pace: str = "",
                note: str = "") -> str:
    """The view as HTML: title and state, a bar of the items ended, a badge per status, errors."""
    badges = " ".join(
        f"<span style='display:inline-block;padding:0 7px;margin:1px 4px 1px 0;border-radius:8px;font-size:11px;"
        f"font-weight:600;white-space:nowrap;color:#ffffff;background-color:{COLORS.get(s, '#757575')}'>"
        f"{html.escape(s)} {n}</span>" for s, n in tally.ordered())
    colour = {"aborted": "#f57c00", "failed": "#d32f2f"}.get(state, "#388e3c" if state == "finished" else "#1976d2")
    errs = "".join(f"<li style='overflow-wrap:anywhere'>{html.escape(e)}</li>" for e in errors)
    errs = (f"<div style='font-size:12px;margin-top:2px'>latest errors:<ul style='margin:2px 0'>{errs}</ul></div>"
            if errs else "")
    note = f"<div style='font-size:11px;opacity:0.8'>{html.escape(note)}</div>" if note else ""
    return (f"<div class='we0-batch-view' style='font-size:13px;line-height:1.45'>"
            f"<b>{html.escape(name)}</b> <span style='opacity:0.8'>· {html.escape(state)} · "
            f"{tally.ended_items}/{tally.items} ended{html.escape(pace)}</span>"
            f"{_bar(tally.ended_items, tally.items, colour)}<div>{badges}</div>{errs}{note}</div>")


class BatchView:
    """The widgets and the display handle of a batch's live view (see the module docstring)."""

    MAX_RATE = 4.0

    def __init__(self, name: str, stop: asyncio.Event, items: int, clock: Any = time.monotonic):
        import ipywidgets as w

        self.name, self.stop, self.items, self.clock = name, stop, items, clock
        self.loop = asyncio.get_running_loop()
        self.html = w.HTML()
        self.button = w.Button(description="Abort", button_style="danger", icon="stop",
                               tooltip="Stop the batch: items running are cut and continue on the next call")
        self.button.on_click(self._abort)
        self.box = w.VBox([self.html, self.button])
        self.box.add_class("we0-batch")
        self.handle: Any = None
        self.t0 = clock()
        self.started_with = 0
        self.last = 0.0
        self.pending: Optional[tuple[Any, list[str]]] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.renders = 0
        self.state = "running"

    def _bundle(self, tally: Any, errors: list[str], note: str = "") -> dict[str, Any]:
        data = dict(self.box._repr_mimebundle_() or {})
        pace = (_eta(tally.ended_items, self.started_with, tally.items, self.clock() - self.t0)
                if self.state == "running" else "")
        data["text/html"] = render_html(self.name, tally, errors, state=self.state, pace=pace, note=note)
        data["text/plain"] = render_text(self.name, tally, errors, state=self.state, pace=pace)
        return data

    def show(self, tally: Any, errors: Any) -> None:
        from IPython.display import display

        self.started_with = tally.ended_items
        self.html.value = render_html(self.name, tally, list(errors))
        self.handle = display(self._bundle(tally, list(errors)), raw=True, display_id=True)

    def _abort(self, _button: Any) -> None:
        # the click may arrive on another thread (a kernel subshell): set the event on its loop
        self.loop.call_soon_threadsafe(self.stop.set)
        self.button.disabled = True
        self.button.description = "Aborting…"

    def update(self, tally: Any, errors: Any) -> None:
        self.pending = (_Snapshot(tally), list(errors))
        wait = self.last + 1.0 / self.MAX_RATE - self.clock()
        if wait <= 0:
            self._render()
        elif self.timer is None:
            self.timer = self.loop.call_later(wait, self._render)

    def _render(self) -> None:
        self.timer = None
        if self.pending is None:
            return
        tally, errors = self.pending
        self.pending = None
        self.last = self.clock()
        self.renders += 1
        pace = _eta(tally.ended_items, self.started_with, tally.items, self.last - self.t0)
        self.html.value = render_html(self.name, tally, errors, state=self.state, pace=pace)

    def close(self, tally: Any, errors: Any, stopped: Optional[str] = None) -> None:
        """The final state: the widget and the saved fallback both say how the batch ended
        (``stopped``: why it ended early — ``"aborted"``, ``"max_failures"``, ``"max_cost"``)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        failed = tally.by_status.get("failed", 0)
        if stopped is None and self.stop.is_set():
            stopped = "aborted"
        self.state = "finished" if stopped is None else {"aborted": "aborted"}.get(stopped, f"stopped ({stopped})")
        # the errors are listed once, by the result (batch.failed); the view keeps the count
        note = (f"{failed} failed: their errors are in the result (batch.failed, batch.df['error'])"
                if failed else "")
        shown: list[str] = []
        self.html.value = render_html(self.name, tally, shown, state=self.state, note=note)
        self.button.disabled = True
        self.button.button_style = ""  # a disabled red button reads badly on a dark theme
        self.button.icon = "check" if self.state == "finished" else "stop"
        self.button.description = {"finished": "Finished", "aborted": "Aborted"}.get(self.state, "Stopped")
        if self.handle is not None:
            self.handle.update(self._bundle(tally, shown, note), raw=True)


class _Snapshot:
    """A tally's numbers at one moment (a deferred render draws what was, not what is)."""

    def __init__(self, tally: Any):
        self.items = tally.items
        self.by_status = dict(tally.by_status)
        self.ended_items = tally.ended_items
        self._ordered = tally.ordered()

    def ordered(self) -> list[tuple[str, int]]:
        return self._ordered

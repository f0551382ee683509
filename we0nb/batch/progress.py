"""The progress of a batch while it runs: a tqdm bar, and in Jupyter a live view.

``tqdm.auto`` draws an ipywidgets bar in Jupyter and text in a terminal: items ended out of
the batch, the rate and the ETA, with done / failed / running counts. In a Jupyter kernel a
small live view goes with it: the counts by status, the latest errors, and an Abort button
(it sets the batch's abort event from the front end's thread, like the run panel's). The
view is redrawn at most :attr:`LiveView.MAX_RATE` times a second whatever the item rate.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections import deque
from typing import Any, Optional

from ..persistence.batches import BATCH_STATUSES, ENDED, BatchInfo, ItemEnd

__all__ = ["make_progress", "NoProgress", "Progress"]


class NoProgress:
    """``progress=False``: nothing is shown."""

    def start(self, info: BatchInfo) -> None: ...
    def claimed(self, n: int) -> None: ...
    def ended(self, item: int, end: ItemEnd) -> None: ...
    def counts(self, counts: dict[str, int]) -> None: ...
    def close(self) -> None: ...


class Progress(NoProgress):
    """A tqdm bar over the batch's items (and a :class:`LiveView` in Jupyter)."""

    def __init__(self, name: str, stop: asyncio.Event, live: bool):
        self.name, self.stop = name, stop
        self.bar: Any = None
        self.view: Optional[LiveView] = LiveView(name, stop) if live else None
        self.by_status: dict[str, int] = {}
        self.running = 0
        self.errors: deque[str] = deque(maxlen=3)

    def start(self, info: BatchInfo) -> None:
        from tqdm.auto import tqdm

        self.by_status = dict(info.counts)
        done = sum(v for k, v in info.counts.items() if k in ENDED)
        self.bar = tqdm(total=info.items, initial=done, desc=self.name, unit="item", mininterval=0.25,
                        dynamic_ncols=True)
        self._postfix()
        if self.view is not None:
            self.view.show()
            self.view.update(self.by_status, self.errors)

    def claimed(self, n: int) -> None:
        self.running += n
        self._postfix()

    def ended(self, item: int, end: ItemEnd) -> None:
        self.running = max(0, self.running - 1)
        self.by_status[end.status] = self.by_status.get(end.status, 0) + 1
        if end.error and end.status == "failed":
            self.errors.append(f"item {item}: {end.error}")
        self._postfix()
        if self.bar is not None and end.status in ENDED:
            self.bar.update(1)
        if self.view is not None:
            self.view.update(self.by_status, self.errors)

    def counts(self, counts: dict[str, int]) -> None:
        """The store's counts (every worker's items): the bar catches up with the others' work."""
        self.by_status = dict(counts)
        if self.bar is not None:
            done = sum(v for k, v in counts.items() if k in ENDED)
            if done > self.bar.n:
                self.bar.update(done - self.bar.n)
        self._postfix()
        if self.view is not None:
            self.view.update(self.by_status, self.errors)

    def _postfix(self) -> None:
        if self.bar is None:
            return
        done = sum(self.by_status.get(k, 0) for k in ("stop", "compact", "approval"))
        self.bar.set_postfix_str(f"done={done} failed={self.by_status.get('failed', 0)} running={self.running}",
                                 refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self._postfix()
            self.bar.refresh()
            self.bar.close()
        if self.view is not None:
            self.view.close(self.by_status, self.errors)


class LiveView:
    """Counts by status, the latest errors and an Abort button, redrawn ≤ MAX_RATE times a second."""

    MAX_RATE = 4.0

    def __init__(self, name: str, stop: asyncio.Event):
        import ipywidgets as w

        self.name, self.stop = name, stop
        self.loop = asyncio.get_running_loop()
        self.html = w.HTML()
        self.button = w.Button(description="Abort", button_style="danger", icon="stop")
        self.button.on_click(self._abort)
        self.box = w.VBox([self.html, self.button])
        self.last = 0.0
        self.pending: Optional[tuple[dict[str, int], list[str]]] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.renders = 0

    def show(self) -> None:
        from IPython.display import display

        display(self.box)

    def _abort(self, _button: Any) -> None:
        # the click may arrive on another thread (a kernel subshell): set the event on its loop
        self.loop.call_soon_threadsafe(self.stop.set)
        self.button.disabled = True
        self.button.description = "Aborting…"

    def update(self, counts: dict[str, int], errors: Any) -> None:
        self.pending = (dict(counts), list(errors))
        wait = self.last + 1.0 / self.MAX_RATE - time.monotonic()
        if wait <= 0:
            self._render()
        elif self.timer is None:
            self.timer = self.loop.call_later(wait, self._render)

    def _render(self) -> None:
        self.timer = None
        if self.pending is None:
            return
        counts, errors = self.pending
        self.pending = None
        self.last = time.monotonic()
        self.renders += 1
        self.html.value = render_counts(self.name, counts, errors)

    def close(self, counts: dict[str, int], errors: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pending = (dict(counts), list(errors))
        self._render()
        self.button.disabled = True
        self.button.description = "Aborted" if self.stop.is_set() else "Done"


def render_counts(name: str, counts: dict[str, int], errors: list[str]) -> str:
    cells = "".join(f"<td style='padding:0 .6em'>{s}: <b>{counts[s]}</b></td>" for s in BATCH_STATUSES
                    if counts.get(s))
    errs = "".join(f"<li><code>{html.escape(e[:300])}</code></li>" for e in errors)
    return (f"<div><b>{html.escape(name)}</b><table><tr>{cells}</tr></table>"
            f"{'<div>latest errors:</div><ul>' + errs + '</ul>' if errs else ''}</div>")


def make_progress(name: str, stop: asyncio.Event, enabled: bool) -> NoProgress:
    if not enabled:
        return NoProgress()
    import tqdm.auto  # noqa: F401  (in a kernel this imports ipywidgets, which _in_kernel looks for)

    return Progress(name, stop, live=_in_kernel())


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (nothing is imported to find out: a kernel has)."""
    import sys

    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules or "ipywidgets" not in sys.modules:
        return False
    ip = ipython.get_ipython()
    return ip is not None and hasattr(ip, "kernel")

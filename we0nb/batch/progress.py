"""The progress of a batch while it runs: a tqdm bar in a terminal, a live view in Jupyter.

In a terminal a ``tqdm`` bar shows the items ended out of the batch, the rate and the ETA,
with done / failed / running counts. In a Jupyter kernel a live view takes its place
(:mod:`we0nb.batch.progress_view`): a bar, the counts by status, the latest errors and an
Abort button — redrawn at most :attr:`BatchView.MAX_RATE` times a second whatever the item
rate, and saved with a readable HTML/text form of its last state.

Every number shown comes from one :class:`Tally`, whose counts always sum to the batch's
items: an item moves from one status to another, it is never counted twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Mapping, Optional

from .._text import readable_error
from ..persistence.batches import BATCH_STATUSES, ENDED, BatchInfo, ItemEnd

__all__ = ["make_progress", "NoProgress", "Progress", "Tally"]

#: where a claimed item is taken from when the tally does not know which item it was
_CLAIMED_FROM = ("pending", "aborted", "failed", "approval", "compact", "stop", "running")


class Tally:
    """Items by status, as this worker sees them move; the counts always sum to ``items``.

    ``queued`` (by status) says how many items of each status a claim may take: an aborted
    item continues, a failed one only with ``retry_failed``. Another worker's moves arrive
    with :meth:`reset` (the store's counts).
    """

    def __init__(self, items: int, counts: Mapping[str, int], queued: Optional[Mapping[str, int]] = None):
        self.items = items
        self.by_status = {s: int(n) for s, n in counts.items() if n}
        self.queued = dict(queued) if queued is not None else {s: self.by_status.get(s, 0)
                                                                for s in ("pending", "aborted")}

    def _move(self, source: str, target: str) -> None:
        self.by_status[source] -= 1
        if not self.by_status[source]:
            del self.by_status[source]
        self.by_status[target] = self.by_status.get(target, 0) + 1

    def _source(self) -> Optional[str]:
        for s in _CLAIMED_FROM:
            if self.queued.get(s, 0) > 0 and self.by_status.get(s, 0) > 0:
                return s
        return next((s for s in _CLAIMED_FROM if self.by_status.get(s, 0) > 0 and s != "running"), None)

    def claimed(self, n: int) -> None:
        """``n`` items were claimed: each now runs."""
        for _ in range(n):
            source = self._source()
            if source is None:
                return
            if self.queued.get(source, 0) > 0:
                self.queued[source] -= 1
            self._move(source, "running")

    def ended(self, status: str, queued: bool = False) -> None:
        """A running item ended with ``status`` (``queued``: it may run again, as an aborted item)."""
        source = "running" if self.by_status.get("running", 0) > 0 else self._source()
        if source is None:
            return
        self._move(source, status)
        if queued:
            self.queued[status] = self.queued.get(status, 0) + 1

    def reset(self, counts: Mapping[str, int]) -> None:
        """The store's counts (every worker's items): they replace what this worker inferred."""
        self.by_status = {s: int(n) for s, n in counts.items() if n}
        self.queued = {s: min(n, self.by_status.get(s, 0)) for s, n in self.queued.items()}

    @property
    def ended_items(self) -> int:
        """Items in a status a continuation does not run again by itself (``ENDED``)."""
        return sum(self.by_status.get(s, 0) for s in ENDED)

    def ordered(self) -> list[tuple[str, int]]:
        """``(status, count)`` for the statuses present, in :data:`BATCH_STATUSES` order."""
        return [(s, self.by_status[s]) for s in BATCH_STATUSES if self.by_status.get(s)]


class NoProgress:
    """``progress=False``: nothing is shown."""

    def start(self, info: BatchInfo, queued: Optional[Mapping[str, int]] = None) -> None: ...
    def claimed(self, n: int) -> None: ...
    def ended(self, item: int, end: ItemEnd) -> None: ...
    def counts(self, counts: dict[str, int]) -> None: ...
    def close(self, stopped: Optional[str] = None) -> None: ...


class Progress(NoProgress):
    """A tqdm bar over the batch's items in a terminal; a :class:`BatchView` in Jupyter."""

    def __init__(self, name: str, stop: asyncio.Event, live: bool):
        self.name, self.stop, self.live = name, stop, live
        self.bar: Any = None
        self.view: Any = None
        self.tally = Tally(0, {})
        self.errors: deque[str] = deque(maxlen=3)

    @property
    def by_status(self) -> dict[str, int]:
        return self.tally.by_status

    def start(self, info: BatchInfo, queued: Optional[Mapping[str, int]] = None) -> None:
        self.tally = Tally(info.items, info.counts, queued)
        if self.live:
            from .progress_view import BatchView

            self.view = BatchView(self.name, self.stop, info.items)
            self.view.show(self.tally, self.errors)
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=info.items, initial=self.tally.ended_items, desc=self.name, unit="item",
                        mininterval=0.25, dynamic_ncols=True)
        self._redraw()

    def claimed(self, n: int) -> None:
        self.tally.claimed(n)
        self._redraw()

    def ended(self, item: int, end: ItemEnd) -> None:
        self.tally.ended(end.status, end.queued)
        if end.error and end.status == "failed":
            self.errors.append(f"item {item}: {readable_error(end.error)}")
        self._redraw()

    def counts(self, counts: dict[str, int]) -> None:
        """The store's counts (every worker's items): the view catches up with the others' work."""
        self.tally.reset(counts)
        self._redraw()

    def _redraw(self) -> None:
        if self.view is not None:
            self.view.update(self.tally, self.errors)
        if self.bar is None:
            return
        by = self.tally.by_status
        done = by.get("stop", 0) + by.get("compact", 0)
        waiting = f" approval={by['approval']}" if by.get("approval") else ""  # (ended, waiting for a person)
        # the counts first, then the bar's number: an update redraws, and both then say the same
        self.bar.set_postfix_str(f"done={done}{waiting} failed={by.get('failed', 0)} running={by.get('running', 0)}",
                                 refresh=False)
        ended = self.tally.ended_items
        if ended != self.bar.n:
            self.bar.update(ended - self.bar.n)  # (an item failed before and retried runs again: it goes back)

    def close(self, stopped: Optional[str] = None) -> None:
        """The last state; ``stopped`` says why the call ended early (``"aborted"``, ``"max_failures"``…)."""
        if self.bar is not None:
            self._redraw()
            self.bar.refresh()
            self.bar.close()
        if self.view is not None:
            self.view.close(self.tally, self.errors, stopped)


def make_progress(name: str, stop: asyncio.Event, enabled: bool) -> NoProgress:
    if not enabled:
        return NoProgress()
    return Progress(name, stop, live=_in_kernel())


def _in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel with ipywidgets (looked up, not imported: a kernel has
    imported IPython and ipykernel already)."""
    import sys

    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    ip = ipython.get_ipython()
    if ip is None or not hasattr(ip, "kernel"):
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True

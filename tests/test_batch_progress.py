"""A batch's progress (issue 36): the numbers shown side by side always agree, and a saved
notebook shows the live view's last state as text and HTML, never a widget's repr."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from we0nb import MemoryPersistence
from we0nb.batch.progress import Progress, Tally
from we0nb.persistence.batches import BATCH_STATUSES, ItemEnd

from batchkit import Ledger, make_agent

_ENDS = st.sampled_from(["stop", "failed", "aborted", "compact", "approval", "pending"])
_EVENT = st.one_of(st.tuples(st.just("claim"), st.integers(0, 20)),
                   st.tuples(st.just("end"), _ENDS, st.booleans()),
                   st.tuples(st.just("reset"), st.integers(0, 10**6)))


def _store_counts(items: int, seed: int) -> dict[str, int]:
    """Some counts summing to ``items`` (what a store could say)."""
    counts, left = {}, items
    for i, s in enumerate(BATCH_STATUSES):
        n = left if i == len(BATCH_STATUSES) - 1 else (seed >> (3 * i)) % (left + 1)
        counts[s], left = n, left - n
    return counts


@settings(max_examples=300, deadline=None)
@given(items=st.integers(1, 60), queued_aborted=st.integers(0, 10), events=st.lists(_EVENT, max_size=120))
def test_the_counts_always_sum_to_the_items(items, queued_aborted, events) -> None:
    aborted = min(queued_aborted, items)
    tally = Tally(items, {"pending": items - aborted, "aborted": aborted})
    for ev in events:
        if ev[0] == "claim":
            tally.claimed(ev[1])
        elif ev[0] == "end":
            tally.ended(ev[1], ev[2])
        else:
            tally.reset(_store_counts(items, ev[1]))
        assert sum(tally.by_status.values()) == items, (ev, tally.by_status)
        assert all(n > 0 for n in tally.by_status.values())
        assert 0 <= tally.ended_items <= items


def test_a_claim_takes_from_what_was_queued() -> None:
    # a continuation with retry_failed: 3 failed items queued, 2 approval items that still wait
    tally = Tally(10, {"stop": 5, "failed": 3, "approval": 2}, queued={"failed": 3})
    tally.claimed(3)
    assert tally.by_status == {"stop": 5, "running": 3, "approval": 2}
    tally.ended("stop")
    tally.ended("failed")
    tally.ended("aborted", queued=True)
    assert tally.by_status == {"stop": 6, "failed": 1, "aborted": 1, "approval": 2}
    tally.claimed(1)  # the aborted item continues
    assert tally.by_status == {"stop": 6, "failed": 1, "running": 1, "approval": 2}


class _Bar:
    """What the terminal bar was told (tqdm's own bookkeeping, without a terminal)."""

    def __init__(self) -> None:
        self.n, self.postfix = 0, ""

    def update(self, k: int) -> None:
        self.n += k

    def set_postfix_str(self, s: str, refresh: bool = False) -> None:
        self.postfix = s

    def refresh(self) -> None: ...

    def close(self) -> None: ...


async def test_an_aborted_batch_shows_the_counts_of_its_result(tmp_path: Path, monkeypatch) -> None:
    """08's case: after an abort the bar, the counts and the result agree (the bug: 297 of 200)."""
    seen: list[tuple[int, dict[str, int], str]] = []
    real_redraw = Progress._redraw

    def redraw(self: Progress) -> None:
        if self.bar is not None and not isinstance(self.bar, _Bar):
            self.bar.close()
            self.bar = _Bar()
        real_redraw(self)
        if self.bar is not None:
            seen.append((self.bar.n, dict(self.tally.by_status), self.bar.postfix))

    monkeypatch.setattr(Progress, "_redraw", redraw)
    ledger = Ledger(tmp_path / "ledger.jsonl")
    agent = make_agent(MemoryPersistence(), ledger, delay=0.002, fail=lambda p: p == "p7")
    abort = asyncio.Event()

    async def click() -> None:
        while len(ledger.path.read_text().splitlines() if ledger.path.exists() else []) < 30:
            await asyncio.sleep(0.002)
        abort.set()

    clicker = asyncio.create_task(click())
    first = await agent.batch([f"p{i}" for i in range(80)], name="agree", concurrency=8, abort=abort)
    await clicker
    assert first.stopped == "aborted"
    for n, counts, postfix in seen:
        assert sum(counts.values()) == 80, counts
        assert n == sum(counts.get(s, 0) for s in ("stop", "compact", "approval", "failed"))
        running = int(re.search(r"running=(\d+)", postfix).group(1))
        assert running == counts.get("running", 0)
    assert seen[-1][1] == first.counts
    seen.clear()
    second = await agent.batch([f"p{i}" for i in range(80)], name="agree", concurrency=8)
    assert second.counts == {"stop": 79, "failed": 1}
    assert all(sum(c.values()) == 80 for _, c, _ in seen) and seen[-1][1] == second.counts and seen[-1][0] == 80


async def test_the_saved_view_reads_as_the_final_state(monkeypatch) -> None:
    pytest.importorskip("ipywidgets")
    import IPython.display

    from we0nb.batch.progress_view import BatchView

    shown: list[dict] = []

    class Handle:
        def update(self, bundle: dict, raw: bool = False) -> None:
            shown.append(bundle)

    monkeypatch.setattr(IPython.display, "display", lambda bundle, **kw: shown.append(bundle) or Handle())
    stop = asyncio.Event()
    progress = Progress("labels", stop, live=True)
    from we0nb.persistence.batches import BatchInfo

    progress.start(BatchInfo(name="labels", created=0.0, updated=0.0, items=4, fingerprint="", counts={"pending": 4},
                             unfinished=4))
    assert isinstance(progress.view, BatchView)
    first = shown[0]
    assert "application/vnd.jupyter.widget-view+json" in first and "0/4 ended" in first["text/plain"]
    progress.claimed(2)
    progress.ended(0, ItemEnd(status="stop"))
    long = "ModelError: The model failed in session 'ses_0661b82d1da4f17ffb2ffb15' (assistant message " \
           "'msg_0661b82d20af4f7e0a7e4f38'): RuntimeError: " + "word " * 60
    progress.ended(1, ItemEnd(status="failed", error=long))
    assert "ses_" not in progress.errors[0] and progress.errors[0].endswith("…")
    stop.set()
    progress.close("aborted")
    final = shown[-1]
    assert final["text/plain"].startswith("batch 'labels': aborted · 2/4 ended")
    assert "pending=2" in final["text/plain"] and "failed=1" in final["text/plain"]
    assert "aborted" in final["text/html"] and "batch.failed" in final["text/html"]
    assert "VBox(" not in final["text/plain"]
    assert progress.view.button.description == "Aborted" and progress.view.button.button_style == ""


def test_errors_read_in_words_clipped_at_a_word() -> None:
    from we0nb._text import clip_words, readable_error

    message = ("ModelError: The model failed in session 'ses_0661b82d1da4f17ffb2ffb15' (assistant message "
               "'msg_0661b82d20af4f7e0a7e4f38'): RuntimeError: the model could not parse review 49. The partial "
               "output is persisted; run again with mode='resume' to continue the turn.")
    assert readable_error(message, 1000) == ("ModelError: The model failed: RuntimeError: the model could not parse "
                                             "review 49. The partial output is persisted; run again with "
                                             "mode='resume' to continue the turn.")
    short = readable_error(message, 60)
    assert len(short) <= 60 and short.endswith("…") and short[:-1] in message.replace(
        " in session 'ses_0661b82d1da4f17ffb2ffb15' (assistant message 'msg_0661b82d20af4f7e0a7e4f38')", "")
    assert short[-2].isalnum() and message[message.index(short[-6:-1]) + 5] == " "  # cut where a word ends
    assert clip_words("one\ntwo   three", 100) == "one two three"


async def test_the_text_bars_counts_and_its_number_say_the_same_on_every_line(monkeypatch) -> None:
    """Each line the terminal's bar draws: its ``n/total`` is the ended items beside it (done,
    approval, failed) — the counts are set before the number, whose update draws the line; an
    item that ended waiting for a person is shown as such, not as done."""
    import io
    import re

    import tqdm.auto

    from we0nb.batch.progress import Progress
    from we0nb.persistence.batches import BatchInfo, ItemEnd

    out = io.StringIO()
    real = tqdm.auto.tqdm
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *a, **kw: real(*a, **{**kw, "file": out, "mininterval": 0}))
    progress = Progress("b", asyncio.Event(), live=False)
    progress.start(BatchInfo(name="b", created=0.0, updated=0.0, items=6, fingerprint="f", counts={"pending": 6},
                             unfinished=6))
    for i, status in enumerate(["stop", "approval", "stop", "failed", "stop", "approval"]):
        progress.claimed(1)
        progress.ended(i, ItemEnd(status=status, error="boom" if status == "failed" else None))
    progress.close()
    lines = [seg for seg in re.split(r"[\r\n]", out.getvalue()) if "/6" in seg]
    assert lines
    for line in lines:
        n = int(re.search(r"(\d+)/6", line).group(1))
        counts = dict(re.findall(r"(done|approval|failed)=(\d+)", line))
        assert n == sum(int(v) for v in counts.values()), line
    assert "done=3 approval=2 failed=1" in lines[-1], lines[-1]

"""Batch runs (issue 12, SPEC §10): one process — the rules of a batch on every backend.

The processes test (3 workers, one killed) is ``test_batch_processes.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pandas  # noqa: F401  (imported here, not on the event loop under the blocking-call guard)
import pytest
import tqdm.auto  # noqa: F401

from we0nb import MemoryPersistence, SqlPersistence, We0Agent, user_message
from we0nb.batch import BatchResult
from we0nb.batch.runner import Worker
from we0nb.cli import main as cli_main  # (imported at collection, as test_cli does: its writer binds sys.stdout)
from we0nb.persistence.batches import BATCH_STATUSES, ItemEnd

from batchkit import Ledger, make_agent

STORES = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger.jsonl")


def prompts(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


async def test_every_item_is_a_session_and_the_frame_has_one_row_per_item(store, ledger) -> None:
    agent = make_agent(store, ledger)
    batch = await agent.batch(["a", [user_message("b1"), user_message("b2")], "c"], name="first", progress=False)
    assert isinstance(batch, BatchResult) and batch.name == "first" and batch.stopped is None
    df = batch.df
    assert list(df["item"]) == [0, 1, 2]
    assert list(df["status"]) == ["stop"] * 3 and list(df["status"].cat.categories) == list(BATCH_STATUSES)
    assert list(df["text"]) == ["answer to a", "answer to b1", "answer to c"]
    assert list(df["prompt"]) == ["a", "b1\n\nb2", "c"]
    assert list(df["steps"]) == [4] * 3 and list(df["tool_calls"]) == [3] * 3
    assert df["error"].isna().all() and df["output"].isna().all()
    assert str(df["started"].dtype) == "datetime64[us, UTC]" and (df["duration"] > pd_zero()).all()
    for sid, prompt in zip(df["session_id"], ["a", "b1", "c"]):
        tr = await store.load_transcript(sid)
        assert tr.messages[0].text == prompt and not tr.needs_resume
    assert sorted((x["prompt"], x["n"]) for x in ledger.lines()) == sorted((p, n) for p in "a b1 c".split()
                                                                            for n in (0, 2))
    assert batch.counts == {"stop": 3}
    assert (await store.list_batches())[0].counts == {"stop": 3}


def pd_zero() -> Any:
    import pandas as pd

    return pd.Timedelta(0)


async def test_a_slot_runs_its_items_in_one_task_on_a_store_that_answers_at_once(ledger) -> None:
    """MemoryPersistence: each of ``concurrency`` lanes records its item's end and runs the next
    item itself — no task (and no pass of the event loop) per item (nothing to overlap)."""
    store = MemoryPersistence()
    assert not store.commit_waits
    loop = asyncio.get_running_loop()
    names: list[str] = []
    default = loop.get_task_factory()

    def counting(lp: Any, coro: Any, **kw: Any) -> Any:
        names.append(getattr(coro, "__qualname__", type(coro).__name__))
        return default(lp, coro, **kw) if default is not None else asyncio.Task(coro, loop=lp, **kw)

    loop.set_task_factory(counting)
    try:
        batch = await make_agent(store, ledger, steps=1).batch(prompts(12), name="lanes", concurrency=3,
                                                               progress=False)
    finally:
        loop.set_task_factory(default)
    assert batch.counts == {"stop": 12}
    assert names.count("Worker._lane") == 3 and "run_item" not in names


def slow_final_commits(store: Any, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make a run's last commit (the one with its final answer) take ``seconds``, and tell the
    store its commits wait (a memory store's otherwise answer at once)."""
    commit = store.commit

    async def slow(writes: Any, **kw: Any) -> None:
        if any(getattr(p, "text", "").startswith("answer to") for _, parts, _ in writes for p in parts):
            await asyncio.sleep(seconds)
        await commit(writes, **kw)

    monkeypatch.setattr(store, "commit", slow)
    monkeypatch.setattr(store, "commit_waits", True)


async def test_a_slot_starts_its_next_item_once_its_last_item_has_made_its_last_model_call(store, ledger,
                                                                                           monkeypatch) -> None:
    """A slot waits for no commit between two items' model calls: the next item is claimed and
    started while the last one's final writes and its end go on — and still no two items of one
    slot call the model at once, and the batch returns once every end is recorded. (On a store
    whose commits wait: the memory store here is told its commits do, as they now take time.)"""
    slow_final_commits(store, monkeypatch, 0.1)
    log: list[str] = []
    end_and_claim = store.end_and_claim

    async def logged_end(name: str, item: int, *a: Any, **kw: Any) -> Any:
        out = await end_and_claim(name, item, *a, **kw)
        log.append(f"end {item}")
        return out

    monkeypatch.setattr(store, "end_and_claim", logged_end)
    calls = Calls(log)
    batch = await make_agent(store, ledger, steps=1, calls=calls).batch(prompts(3), name="lanes", concurrency=1,
                                                                       progress=False)
    # every end is recorded before batch() returns (item 0's may come before item 2's call on a busy machine)
    assert batch.counts == {"stop": 3} and sorted(e for e in log if e.startswith("end")) == ["end 0", "end 1", "end 2"]
    # item 1 called the model before item 0's end was recorded, item 2 before item 1's
    assert log.index("call p1") < log.index("end 0") and log.index("call p2") < log.index("end 1")
    # one slot, one item calling the model at a time: each item's calls are together, in order
    assert [e for e in log if e.startswith("call")] == ["call p0"] * 2 + ["call p1"] * 2 + ["call p2"] * 2


async def test_an_end_that_cannot_be_recorded_beside_the_next_item_fails_the_batch(store, ledger,
                                                                                   monkeypatch) -> None:
    """The end of an item that handed its slot over is recorded beside the next item: a failure
    to record it is still the batch's failure, raised by the call (never lost, never a hang)."""
    from we0nb import PersistenceError

    slow_final_commits(store, monkeypatch, 0.05)
    end_and_claim = store.end_and_claim

    async def failing_end(name: str, item: int, *a: Any, **kw: Any) -> Any:
        if item == 0:
            raise PersistenceError("the database went away (on purpose)")
        return await end_and_claim(name, item, *a, **kw)

    monkeypatch.setattr(store, "end_and_claim", failing_end)
    with pytest.raises(PersistenceError, match="went away"):
        await asyncio.wait_for(make_agent(store, ledger, steps=1).batch(prompts(3), name="lost", concurrency=1,
                                                                        progress=False), 30)


@pytest.mark.parametrize("name", [" b1", "b1 ", "\u00a0b1"])
async def test_a_batch_name_with_a_space_at_either_end_is_refused(ledger, name) -> None:
    store = MemoryPersistence()
    with pytest.raises(ValueError, match="starts or ends with a space.*use 'b1'"):
        await make_agent(store, ledger, steps=1).batch(prompts(2), name=name, progress=False)
    assert await store.list_batches() == []


async def test_lanes_failing_at_once_raise_one_error_and_log_no_unretrieved_ones(ledger, monkeypatch, caplog) -> None:
    """The database gone under many items at once: every lane fails to record its end; the call
    raises the first, and no other lane's error is left for asyncio to log ("Task exception was
    never retrieved", a traceback each) when the tasks are collected."""
    import gc

    from we0nb import PersistenceError

    store = MemoryPersistence()
    gate = asyncio.Event()

    async def failing(*a: Any, **kw: Any) -> Any:
        await gate.wait()  # (all lanes reach it, then all fail together)
        raise PersistenceError("the database went away (on purpose)")

    monkeypatch.setattr(store, "end_and_claim", failing)
    monkeypatch.setattr(store, "end_batch_item", failing)
    asyncio.get_running_loop().call_later(0.3, gate.set)
    with caplog.at_level("ERROR", logger="asyncio"):
        with pytest.raises(PersistenceError, match="went away"):
            await asyncio.wait_for(make_agent(store, ledger, steps=1).batch(prompts(8), name="gone", concurrency=8,
                                                                            progress=False), 30)
        for _ in range(3):
            await asyncio.sleep(0)
            gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


async def test_a_run_the_store_failed_is_not_a_failed_item_and_a_later_batch_finishes_it(ledger, monkeypatch) -> None:
    """The store failing under a run (a full disk, a lost database) is the batch's failure, raised
    by the call, not the item's: nothing is recorded ``failed``, and once the store is back a later
    ``batch()`` of the same name runs the item to its end."""
    from we0nb import PersistenceError

    store = MemoryPersistence()
    commit, calls = store.commit, []

    async def failing_once(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # (the first item's run, after its first step's writes)
            raise PersistenceError("the disk is full (on purpose)")
        return await commit(*a, **kw)

    monkeypatch.setattr(store, "commit", failing_once)
    agent = make_agent(store, ledger, steps=2)
    with pytest.raises(PersistenceError, match="disk is full"):
        await asyncio.wait_for(agent.batch(prompts(2), name="disk", concurrency=1, progress=False), 30)
    assert "failed" not in [i.status for i in await store.batch_items("disk")]
    # the failed call's worker is gone: its claim is claimable at once (a memory store's owners are all
    # of this process), not when it lapses
    held = [i.item for i in await store.batch_items("disk") if i.status == "running"]
    assert held == [0] and await store.free_dead_claims("disk", []) == 1
    again = await asyncio.wait_for(agent.batch(prompts(2), name="disk", concurrency=1, progress=False), 30)
    assert again.counts == {"stop": 2}


class Calls(list):
    """The model's calls (``make_agent(calls=...)``), appended to a shared log as ``call <prompt>``."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def append(self, prompt: str) -> None:
        super().append(prompt)
        self.log.append(f"call {prompt}")


async def test_a_series_and_a_one_column_frame_are_prompts(store, ledger) -> None:
    import pandas as pd

    agent = make_agent(store, ledger, steps=0)
    frame = pd.DataFrame({"question": ["x", "y"]})
    a = await agent.batch(frame["question"], name="series", progress=False)
    b = await agent.batch(frame, name="frame", progress=False)
    assert list(a.df["text"]) == list(b.df["text"]) == ["answer to x", "answer to y"]
    with pytest.raises(TypeError, match="one column"):
        await agent.batch(pd.DataFrame({"a": ["x"], "b": ["y"]}), progress=False)


async def test_misuse_is_a_clear_error(store, ledger) -> None:
    agent = make_agent(store, ledger)
    with pytest.raises(TypeError, match="list of prompts"):
        await agent.batch("one prompt", progress=False)
    with pytest.raises(ValueError, match="empty"):
        await agent.batch([], progress=False)
    with pytest.raises(TypeError, match="item 1"):
        await agent.batch(["ok", 3], progress=False)
    with pytest.raises(ValueError, match="concurrency"):
        await agent.batch(["a"], concurrency=0, progress=False)
    with pytest.raises(ValueError, match="max_failures"):
        await agent.batch(["a"], max_failures=0, progress=False)
    with pytest.raises(ValueError, match="one per prompt"):
        await agent.batch(["a", "b"], session_ids=["s1"], progress=False)
    with pytest.raises(ValueError, match="same session id"):
        await agent.batch(["a", "b"], session_ids=["s1", "s1"], progress=False)
    assert await store.list_batches() == []  # nothing was created


async def test_the_same_name_with_other_prompts_names_the_batch_and_the_first_differing_item(store, ledger) -> None:
    agent = make_agent(store, ledger, steps=0)
    await agent.batch(prompts(5), name="eval", progress=False)
    changed = prompts(5)
    changed[3] = "something else"
    with pytest.raises(ValueError, match=r"Batch 'eval' already exists with other prompts: item 3 differs"):
        await agent.batch(changed, name="eval", progress=False)
    with pytest.raises(ValueError, match=r"Batch 'eval' already exists with 5 items, but 6 prompts .* item 5"):
        await agent.batch(prompts(6), name="eval", progress=False)
    with pytest.raises(ValueError, match=r"other session ids: item 0 differs"):
        await agent.batch(prompts(5), name="eval", session_ids=[f"s{i}" for i in range(5)], progress=False)


async def test_a_continuation_skips_ended_items_without_calling_the_model(store, ledger) -> None:
    calls: list[str] = []
    agent = make_agent(store, ledger, calls=calls)
    first = await agent.batch(prompts(6), name="b", concurrency=3, progress=False)
    n = len(calls)
    again = await agent.batch(prompts(6), name="b", concurrency=3, progress=False)
    assert len(calls) == n == 6 * 4  # not re-run, not re-billed
    assert list(again.df["status"]) == list(first.df["status"]) == ["stop"] * 6
    assert list(again.df["attempts"]) == [1] * 6


async def test_abort_returns_with_cut_items_aborted_and_unstarted_ones_pending(store, ledger) -> None:
    agent = make_agent(store, ledger, delay=0.02, tool_delay=0.05)
    abort = asyncio.Event()

    async def cut() -> None:
        while len(ledger.lines()) < 3:
            await asyncio.sleep(0.005)
        abort.set()

    cutter = asyncio.create_task(cut())
    t0 = time.monotonic()
    batch = await agent.batch(prompts(20), name="cut", concurrency=4, abort=abort, progress=False)  # no raise
    await cutter
    assert batch.stopped == "aborted" and time.monotonic() - t0 < 10
    counts = batch.counts
    assert counts.get("aborted", 0) >= 1 and counts.get("pending", 0) >= 10, counts
    assert "running" not in counts
    for it in batch.items:
        if it.status == "pending":
            assert it.attempts == 0 and (await store.load_transcript(it.session_id)).session is None
        if it.status == "aborted":
            assert (await store.load_transcript(it.session_id)).needs_resume
    done = await agent.batch(prompts(20), name="cut", concurrency=4, progress=False)
    assert done.counts == {"stop": 20} and done.stopped is None
    _assert_no_side_effect_twice(ledger)
    for it in done.items:  # an act cut while running was interrupted by the resume, never repeated
        tr = await store.load_transcript(it.session_id)
        interrupted = [p for m in tr.messages for p in m.tool_parts if p.state.status == "error"]
        assert all(p.state.metadata.get("interrupted") for p in interrupted)
        assert it.tool_calls == sum(len(m.tool_parts) for m in tr.messages)


def _assert_no_side_effect_twice(ledger: Ledger) -> None:
    keys = [(x["prompt"], x["n"]) for x in ledger.lines()]
    assert len(keys) == len(set(keys)), "a side effect ran twice"


async def test_an_abort_set_before_the_call_starts_nothing(store, ledger) -> None:
    agent = make_agent(store, ledger)
    abort = asyncio.Event()
    abort.set()
    batch = await agent.batch(prompts(3), name="never", abort=abort, progress=False)
    assert batch.stopped == "aborted" and batch.counts == {"pending": 3}


async def test_aborted_and_continued_five_times_ends_as_an_uninterrupted_batch(store, ledger, tmp_path) -> None:
    n = 12
    whole = await make_agent(MemoryPersistence(), Ledger(tmp_path / "whole.jsonl"), delay=0.01).batch(
        prompts(n), name="whole", concurrency=3, progress=False)
    agent = make_agent(store, ledger, delay=0.01, tool_delay=0.01)
    for round_ in range(5):
        abort = asyncio.Event()
        start = len(ledger.lines())

        async def cut() -> None:
            while len(ledger.lines()) < start + 2:
                await asyncio.sleep(0.002)
            abort.set()

        cutter = asyncio.create_task(cut())
        batch = await agent.batch(prompts(n), name="cont", concurrency=3, abort=abort, progress=False)
        cutter.cancel()
        assert batch.stopped in ("aborted", None)
    final = await agent.batch(prompts(n), name="cont", concurrency=3, progress=False)
    assert final.stopped is None
    assert list(final.df["status"]) == list(whole.df["status"]) == ["stop"] * n
    assert list(final.df["tool_calls"]) == list(whole.df["tool_calls"])
    # (steps may differ: a model call cut by the abort is a step of its own, closed by the resume)
    assert list(final.df["text"]) == list(whole.df["text"])
    assert max(final.df["attempts"]) > 1  # it really was cut and resumed
    _assert_no_side_effect_twice(ledger)


async def test_a_failure_marks_the_item_failed_and_the_batch_goes_on(store, ledger) -> None:
    agent = make_agent(store, ledger, fail=lambda p: p in ("p1", "p4"))
    batch = await agent.batch(prompts(6), name="f", concurrency=2, progress=False)
    df = batch.df
    assert list(df["status"]) == ["stop", "failed", "stop", "stop", "failed", "stop"]
    assert df.loc[1, "error"].startswith("ModelError: ") and "model broke on p1" in df.loc[1, "error"]
    assert batch.stopped is None and [it.item for it in batch.failed] == [1, 4]
    # a continuation skips failed items; retry_failed resumes them
    fixed = make_agent(store, ledger)
    again = await fixed.batch(prompts(6), name="f", concurrency=2, progress=False)
    assert again.counts == {"stop": 4, "failed": 2}
    retried = await fixed.batch(prompts(6), name="f", concurrency=2, progress=False, retry_failed=True)
    assert retried.counts == {"stop": 6}
    assert list(retried.df["attempts"]) == [1, 2, 1, 1, 2, 1]
    assert retried.df["error"].isna().all()


async def test_max_failures_stops_early_and_a_continuation_finishes(store, ledger) -> None:
    agent = make_agent(store, ledger, fail=lambda p: p in ("p0", "p1"))
    batch = await agent.batch(prompts(30), name="m", concurrency=2, max_failures=2, progress=False)
    assert batch.stopped == "max_failures"
    counts = batch.counts
    assert counts["failed"] == 2 and counts.get("pending", 0) > 0 and "running" not in counts
    rest = await make_agent(store, ledger).batch(prompts(30), name="m", concurrency=4, progress=False)
    assert rest.counts == {"stop": 28, "failed": 2}


async def test_rate_limits_slow_the_batch_down_instead_of_failing_items(store, ledger, monkeypatch) -> None:
    monkeypatch.setattr(Worker, "BACKOFF", 0.05)
    agent = make_agent(store, ledger, rate_limit={"p0": 2, "p2": 1})
    batch = await agent.batch(prompts(4), name="rl", concurrency=4, progress=False)
    assert batch.counts == {"stop": 4}
    assert list(batch.df["attempts"]) == [3, 1, 2, 1]
    _assert_no_side_effect_twice(ledger)


async def test_a_burst_of_rate_limits_at_one_instant_doubles_the_back_off_once(store, ledger, monkeypatch) -> None:
    # eight items rate-limited at the same instant doubled it eight times: 1 s became 60 s
    monkeypatch.setattr(Worker, "BACKOFF", 0.1)
    pauses: list[float] = []
    ended = Worker._ended

    def watch(self, it, outcome, recorded):
        ended(self, it, outcome, recorded)
        if outcome.rate_limited:
            pauses.append(self.backoff)

    monkeypatch.setattr(Worker, "_ended", watch)
    agent = make_agent(store, ledger, rate_limit={f"p{i}": 1 for i in range(8)})
    t0 = time.monotonic()
    batch = await agent.batch(prompts(8), name="burst", concurrency=8, progress=False)
    assert batch.counts == {"stop": 8} and pauses == [0.1] * 8
    assert time.monotonic() - t0 < 5  # (was 0.1 * 2**7 = 12.8 s here, 60 s with the default 1 s)


async def test_a_new_batch_refuses_session_ids_the_store_holds_and_a_continuation_keeps_its_own(store, ledger) -> None:
    # a second batch named the first one's sessions: it ran its turns in them, and both frames lied
    agent = make_agent(store, ledger, steps=0)
    first = await agent.batch(prompts(2), name="first", session_ids=["x1", "x2"], progress=False)
    assert first.counts == {"stop": 2}
    again = await agent.batch(prompts(2), name="first", session_ids=["x1", "x2"], progress=False)
    assert again.counts == {"stop": 2}  # (the same batch continued: its own sessions)
    with pytest.raises(ValueError, match=r"session 'x1' already exists in this store \(2 of these 2 do\)"):
        await agent.batch(prompts(2), name="second", session_ids=["x1", "x2"], progress=False)
    assert [b.name for b in await store.list_batches()] == ["first"]  # (nothing written)
    assert [m.info.role for m in (await agent.transcript("x1")).messages] == ["user", "assistant"]


async def test_approval_items_wait_until_decided_then_a_continuation_resumes_them(store, ledger) -> None:
    agent = make_agent(store, ledger, steps=1, approval=lambda p: p == "p1")
    batch = await agent.batch(prompts(3), name="ap", progress=False)
    assert list(batch.df["status"]) == ["stop", "approval", "stop"]
    again = await agent.batch(prompts(3), name="ap", progress=False)  # undecided: left awaiting
    assert list(again.df["status"]) == ["stop", "approval", "stop"] and list(again.df["attempts"]) == [1, 1, 1]
    sid = batch.items[1].session_id
    [call] = await agent.pending_approvals(sid)
    await agent.approve(sid, call.call_id)
    done = await agent.batch(prompts(3), name="ap", progress=False)
    assert list(done.df["status"]) == ["stop", "stop", "stop"] and done.items[1].attempts == 2
    assert done.items[1].text == "answer to p1"


async def test_batch_waits_for_items_another_live_worker_holds(store, ledger) -> None:
    agent = make_agent(store, ledger, steps=0)
    await agent.batch(prompts(3), name="w", progress=False, abort=_set_event())  # created, nothing run
    t = time.time()
    [held] = await store.claim_batch_items("w", "otherhost:1:wrk_other", 1, now=t, expires=t + 60)

    async def other_worker_ends_it() -> None:
        await asyncio.sleep(0.5)
        assert await store.end_batch_item("w", held.item, "otherhost:1:wrk_other",
                                          ItemEnd(status="stop", finished=time.time(), attempts=1, text="theirs"))

    other = asyncio.create_task(other_worker_ends_it())
    batch = await agent.batch(prompts(3), name="w", progress=False)
    assert other.done()  # it returned only once the other worker had ended its item
    assert batch.counts == {"stop": 3} and batch.items[held.item].text == "theirs"


async def test_a_lapsed_claim_is_taken_over(store, ledger) -> None:
    agent = make_agent(store, ledger, steps=0)
    await agent.batch(prompts(2), name="lapsed", progress=False, abort=_set_event())
    t = time.time()
    await store.claim_batch_items("lapsed", "otherhost:1:wrk_gone", 1, now=t, expires=t + 0.2)
    batch = await agent.batch(prompts(2), name="lapsed", progress=False)
    assert batch.counts == {"stop": 2} and batch.items[0].attempts == 2
    assert not await store.end_batch_item("lapsed", 0, "otherhost:1:wrk_gone", ItemEnd(status="failed"))


def _set_event() -> asyncio.Event:
    e = asyncio.Event()
    e.set()
    return e


async def test_frames_and_list_batches(store, ledger) -> None:
    agent = make_agent(store, ledger, fail=lambda p: p == "p2")
    await agent.batch(prompts(4), name="one", progress=False)
    await agent.batch(prompts(2), name="two", progress=False)
    infos = await store.list_batches()
    assert [i.name for i in infos] == ["one", "two"]
    assert infos[0].counts == {"stop": 3, "failed": 1} and infos[0].items == 4 and infos[0].unfinished == 0
    assert infos[0].updated >= infos[0].created


async def test_progress_bar_in_a_terminal(store, ledger, capsys) -> None:
    agent = make_agent(store, ledger, steps=0, fail=lambda p: p == "p1")
    await agent.batch(prompts(5), name="bar", progress=True)
    err = capsys.readouterr().err
    assert "bar" in err and "5/5" in err and "failed=1" in err


async def test_live_view_redraws_at_most_four_times_a_second(monkeypatch) -> None:
    pytest.importorskip("ipywidgets")
    import IPython.display

    from we0nb.batch.progress import Tally
    from we0nb.batch.progress_view import BatchView

    shown: list[dict] = []

    class Handle:
        def update(self, bundle: dict, raw: bool = False) -> None:
            shown.append(bundle)

    monkeypatch.setattr(IPython.display, "display", lambda bundle, **kw: shown.append(bundle) or Handle())
    view = BatchView("v", asyncio.Event(), 2000)
    tally = Tally(2000, {"pending": 2000})
    view.show(tally, [])
    t0 = time.monotonic()
    for i in range(2000):
        tally.claimed(1)
        tally.ended("stop")
        view.update(tally, [])
        if i % 100 == 0:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # (the last coalesced redraw comes in here: it counts in the time)
    elapsed = time.monotonic() - t0
    assert view.renders <= 4 * elapsed + 2, (view.renders, elapsed)
    assert "stop 2000" in view.html.value and "2000/2000 ended" in view.html.value  # the last state is drawn
    view.close(tally, ["item 3: boom"])
    final = shown[-1]
    assert "Finished" == view.button.description and view.button.disabled
    assert "finished" in final["text/html"] and "2000/2000 ended" in final["text/plain"]
    view._abort(None)
    await asyncio.sleep(0)
    assert view.stop.is_set()


async def test_batches_df_batch_df_and_sessions_df_of_a_batch(store, ledger) -> None:
    from we0nb import batch_df, batches_df, sessions_df, tool_calls_df
    from we0nb.notebook.sync import run_sync  # noqa: F401  (frames are sync: run them off the loop)

    agent = make_agent(store, ledger, fail=lambda p: p == "p2")
    batch = await agent.batch(prompts(4), name="one", progress=False)
    await make_agent(store, ledger).batch(prompts(2), name="two", progress=False)
    await agent.invoke(messages=[user_message("not in a batch")])
    frames = await asyncio.to_thread(lambda: (batches_df(store), batch_df(store, "one"),
                                              sessions_df(store, batch="one"), tool_calls_df(store)))
    bdf, one, sessions, calls = frames
    assert list(bdf["name"]) == ["one", "two"] and list(bdf["items"]) == [4, 2]
    assert list(bdf["stop"]) == [3, 2] and list(bdf["failed"]) == [1, 0] and list(bdf["unfinished"]) == [0, 0]
    assert str(bdf["created"].dtype) == "datetime64[us, UTC]"
    assert one.equals(batch.df)
    assert sorted(sessions["session_id"]) == sorted(one["session_id"])
    per = calls.groupby("session_id", observed=True).size()
    for sid, n in zip(one["session_id"], one["tool_calls"]):
        assert per.get(sid, 0) == n
    with pytest.raises(ValueError, match="No batch named 'nope'.*'one', 'two'"):
        await asyncio.to_thread(batch_df, store, "nope")


def test_cli_batch_ls_and_show(tmp_path, capsys) -> None:
    main = cli_main
    db = tmp_path / "b.db"

    async def make() -> None:
        p = SqlPersistence(f"sqlite:///{db}")
        agent = make_agent(p, Ledger(tmp_path / "l.jsonl"), fail=lambda p: p == "p2")
        await agent.batch(prompts(5), name="nightly", progress=False)
        await p.close()

    asyncio.run(make())
    before = db.stat().st_mtime_ns
    assert main(["batch", "ls", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "nightly" in out and "1 batch(es)" in out
    header, _, row = out.splitlines()[:3]
    assert header.split() == ["batch", "items", "stop", "failed", "unfinished", "updated"]
    assert row.split()[:5] == ["nightly", "5", "4", "1", "0"]
    assert main(["batch", "show", "nightly", "--db", f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    assert "stop=4  failed=1" in out and "failures (1):" in out and "item 2" in out and "model broke on p2" in out
    assert main(["batch", "show", "other", "--db", str(db)]) == 1
    assert "no batch 'other'" in capsys.readouterr().err
    assert db.stat().st_mtime_ns == before  # read-only
    assert main(["batch", "ls", "--db", str(tmp_path / "missing.db")]) == 1
    assert "no database at" in capsys.readouterr().err and not (tmp_path / "missing.db").exists()


async def test_cancelling_the_batch_task_cuts_and_records_its_items_then_raises(store, ledger) -> None:
    agent = make_agent(store, ledger, delay=0.02, tool_delay=0.2)
    task = asyncio.create_task(agent.batch(prompts(10), name="cancelled", concurrency=3, progress=False))
    while not ledger.lines():
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    items = await store.batch_items("cancelled")
    statuses = {it.status for it in items}
    assert "running" not in statuses and "aborted" in statuses and "pending" in statuses
    done = await agent.batch(prompts(10), name="cancelled", concurrency=3, progress=False)  # no wait for a TTL
    assert done.counts == {"stop": 10}
    _assert_no_side_effect_twice(ledger)


def test_a_schema_3_database_gains_the_batch_tables_in_place(tmp_path) -> None:
    import sqlite3

    from we0nb.persistence.sql import tables as S

    db = tmp_path / "old.db"

    async def first() -> None:
        p = SqlPersistence(f"sqlite:///{db}")
        await make_agent(p, Ledger(tmp_path / "l.jsonl"), steps=0).invoke(messages=[user_message("hi")])
        await p.close()

    asyncio.run(first())
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE we0_batch_items")
    conn.execute("DROP TABLE we0_batches")
    conn.execute("UPDATE we0_meta SET value = '3' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()

    async def again() -> BatchResult:
        p = SqlPersistence(f"sqlite:///{db}")
        try:
            assert len(await p.list_sessions()) == 1  # opens and upgrades
            return await make_agent(p, Ledger(tmp_path / "l.jsonl"), steps=0).batch(["a"], progress=False)
        finally:
            await p.close()

    assert asyncio.run(again()).counts == {"stop": 1}
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM we0_meta WHERE key = 'schema_version'").fetchone() == (str(S.SCHEMA_VERSION),)
    conn.close()


def test_a_schema_5_database_gains_the_claim_index_in_item_order(tmp_path) -> None:
    """Schema 6: a claim reads the next queued items in item order from an index (5 sorted
    every queued item on each claim); an older database gets the index in place."""
    import sqlite3

    from we0nb.persistence.sql import tables as S
    from we0nb.persistence.sql import statements as q

    db = tmp_path / "v5.db"

    async def run(names: list[str]) -> BatchResult:
        p = SqlPersistence(f"sqlite:///{db}")
        try:
            return await make_agent(p, Ledger(tmp_path / "l.jsonl"), steps=0).batch(names, name="b", progress=False)
        finally:
            await p.close()

    assert asyncio.run(run(["a", "b"])).counts == {"stop": 2}
    conn = sqlite3.connect(db)
    conn.execute("DROP INDEX ix_we0_batch_items_next")  # what schema 5 had
    conn.execute("ALTER TABLE we0_batch_items DROP COLUMN claim")  # (schema 7's)
    conn.execute("CREATE INDEX ix_we0_batch_items_claim ON we0_batch_items (batch, queued, expires)")
    conn.execute("UPDATE we0_meta SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()

    assert asyncio.run(run(["a", "b"])).counts == {"stop": 2}  # opens, upgrades, continues
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT value FROM we0_meta WHERE key = 'schema_version'").fetchone() == (
            str(S.SCHEMA_VERSION),)
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "ix_we0_batch_items_next" in names and "ix_we0_batch_items_claim" not in names
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + q.compiled("sqlite")[q.BATCH_CLAIM], {
            "b": "b", "owner": "o", "host": "h", "pid": 1, "n": 1, "now": 1.0, "expires": 2.0, "ttl": 1.0,
            "token": "t"}))
        assert "ix_we0_batch_items_next" in plan and "TEMP B-TREE" not in plan, plan
    finally:
        conn.close()


async def test_structured_output_is_stored_as_json(store) -> None:
    import json

    from pydantic import BaseModel

    from we0nb import FunctionModel, output
    from batchkit import first_user

    class Label(BaseModel):
        label: str
        score: float

    def reply(request: Any) -> list:
        prompt = first_user(request)
        return [output(Label(label=prompt.upper(), score=len(prompt) / 10))]

    agent = We0Agent(FunctionModel(reply), persistence=store, output_type=Label)
    batch = await agent.batch(["ab", "cde"], name="structured", progress=False)
    assert [json.loads(o) for o in batch.df["output"]] == [{"label": "AB", "score": 0.2},
                                                           {"label": "CDE", "score": 0.3}]
    assert list(batch.df["tool_calls"]) == [0, 0]  # the output call is not a tool call


def test_batch_frames_read_a_url_read_only(tmp_path) -> None:
    from we0nb import batch_df, batches_df

    db = tmp_path / "f.db"

    async def make() -> None:
        p = SqlPersistence(f"sqlite:///{db}")
        await make_agent(p, Ledger(tmp_path / "l.jsonl"), steps=1).batch(prompts(3), name="u", progress=False)
        await p.close()

    asyncio.run(make())
    before = db.stat().st_mtime_ns
    assert list(batches_df(f"sqlite:///{db}")["name"]) == ["u"]
    assert list(batch_df(f"sqlite:///{db}", "u")["status"]) == ["stop"] * 3
    assert db.stat().st_mtime_ns == before
    from we0nb import PersistenceError

    with pytest.raises(PersistenceError, match="reading never creates a database"):  # as every frame
        batches_df(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()

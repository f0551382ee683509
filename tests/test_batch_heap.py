"""A batch's garbage collections leave out the objects of before (we0nb.batch.heap)."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

from forkkit import in_forked_child
from we0nb import FunctionModel, MemoryPersistence, Score, We0Agent, text, tool, tool_call
from we0nb.batch.heap import YOUNG_THRESHOLD, frozen_heap
from we0nb.models.base import ToolResult


def looking_agent(seen: list[int]) -> We0Agent:
    """Each item calls ``look`` once, which records how many objects are frozen at that moment."""

    @tool(side_effects=False)
    def look() -> str:
        """Read-only."""
        seen.append(gc.get_freeze_count())
        return "ok"

    def reply(request: Any) -> list:
        if any(isinstance(m, ToolResult) for m in request.messages):
            return [text("done")]
        return [tool_call("look", {})]

    return We0Agent(FunctionModel(reply), tools=[look], persistence=MemoryPersistence())


async def test_a_batch_freezes_the_objects_of_before_and_gives_them_back_at_its_end() -> None:
    seen: list[int] = []
    agent = looking_agent(seen)
    assert gc.get_freeze_count() == 0
    result = await agent.batch([f"p{i}" for i in range(6)], concurrency=3, progress=False)
    assert len(result.items) == 6 and len(seen) == 6
    assert min(seen) > 1000  # the modules, schemas and the test's own objects, frozen while it ran
    assert gc.get_freeze_count() == 0  # and given back


async def test_scoring_freezes_them_too() -> None:
    seen: list[int] = []
    agent = looking_agent([])
    batch = await agent.batch(["a", "b"], concurrency=2, progress=False)

    def counted(case: Any) -> Score:
        seen.append(gc.get_freeze_count())
        return Score(1.0)

    await batch.score([counted], progress=False)
    assert len(seen) == 2 and min(seen) > 1000
    assert gc.get_freeze_count() == 0


async def test_concurrent_batches_share_one_freeze_given_back_by_the_last() -> None:
    first_seen: list[int] = []
    second_seen: list[int] = []
    a, b = looking_agent(first_seen), looking_agent(second_seen)
    await asyncio.gather(a.batch([f"a{i}" for i in range(4)], concurrency=2, progress=False),
                         b.batch([f"b{i}" for i in range(4)], concurrency=2, progress=False))
    assert len(first_seen) == len(second_seen) == 4
    assert min(first_seen + second_seen) > 1000
    assert gc.get_freeze_count() == 0


def _frozen(obj: object) -> bool:
    """Whether ``obj`` is in the permanent generation: frozen objects are left out of ``gc.get_objects()``.

    (By identity, not by ``gc.get_freeze_count()``: that count falls whenever another thread frees a
    frozen object, as pytest-xdist's own thread does.)"""
    return all(o is not obj for o in gc.get_objects())


def test_a_process_that_froze_objects_itself_or_turned_the_collector_off_is_left_alone() -> None:
    theirs: list[int] = []
    gc.freeze()
    try:
        after_their_freeze: list[int] = []
        with frozen_heap():
            assert _frozen(theirs) and not _frozen(after_their_freeze)  # we froze nothing more
        assert _frozen(theirs)  # and gave back nothing: they are the process's
    finally:
        gc.unfreeze()
    assert not _frozen(theirs)
    gc.disable()
    try:
        with frozen_heap():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_nested_and_threaded_uses_unfreeze_once_at_the_last_end() -> None:
    inside: list[int] = []
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with frozen_heap():
            entered.set()
            leave.wait(5)
            inside.append(gc.get_freeze_count())

    t = threading.Thread(target=other)
    with frozen_heap():
        t.start()
        assert entered.wait(5)
        with frozen_heap():
            assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() > 0  # the thread's use is still open
    leave.set()
    t.join(5)
    assert inside and inside[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_child_forked_during_a_batch_gets_its_objects_back() -> None:
    before = gc.get_threshold()
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        got = in_forked_child(lambda: f"{gc.get_freeze_count()} {gc.get_threshold()}")  # (no batch runs there)
    assert got == f"0 {before}"
    assert gc.get_freeze_count() == 0


async def test_a_batch_collects_its_young_objects_less_often_and_gives_the_threshold_back() -> None:
    before = gc.get_threshold()
    assert before[0] < YOUNG_THRESHOLD
    seen: list[int] = []

    @tool(side_effects=False)
    def look() -> str:
        """Read-only."""
        seen.append(gc.get_threshold()[0])
        return "ok"

    def reply(request: Any) -> list:
        if any(isinstance(m, ToolResult) for m in request.messages):
            return [text("done")]
        return [tool_call("look", {})]

    agent = We0Agent(FunctionModel(reply), tools=[look], persistence=MemoryPersistence())
    batch = await agent.batch(["a", "b", "c"], concurrency=2, progress=False)
    assert seen == [YOUNG_THRESHOLD] * 3
    assert gc.get_threshold() == before

    def counted(case: Any) -> Score:
        seen.append(gc.get_threshold()[0])
        return Score(1.0)

    await batch.score([counted], progress=False)
    assert seen[3:] == [YOUNG_THRESHOLD] * 3
    assert gc.get_threshold() == before


def test_a_threshold_the_process_chose_is_left_as_it_is() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(YOUNG_THRESHOLD * 2, *before[1:])  # higher than ours: not lowered
        with frozen_heap():
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 2
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD * 2
        gc.set_threshold(*before)
        with frozen_heap():
            assert gc.get_threshold()[0] == YOUNG_THRESHOLD
            gc.set_threshold(5000, *before[1:])  # changed while the batch runs: the process's own
        assert gc.get_threshold()[0] == 5000
        gc.set_threshold(*before)
        gc.disable()
        with frozen_heap():  # (a collector turned off: nothing to tune)
            assert gc.get_threshold() == before
    finally:
        gc.enable()
        gc.set_threshold(*before)

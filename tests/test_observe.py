"""The seam tracing composes through: an observer sees a run's events but the deltas, each
model stream's end and the run's end — and can never fail the run."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, text, tool, tool_call, user_message
from we0nb.engine import observe


class Watcher:
    def __init__(self, fail_on: Optional[str] = None) -> None:
        self.seen: list[str] = []
        self.fail_on = fail_on

    def event(self, ev: Any) -> None:
        self.seen.append(ev["type"])
        if ev["type"] == self.fail_on:
            raise RuntimeError("observer broke")

    def model_ended(self, step: int, error: Optional[BaseException], finish: Any = None) -> None:
        self.seen.append(f"model-ended {step} {type(error).__name__ if error else None}")

    def run_ended(self, error: Optional[BaseException]) -> None:
        self.seen.append(f"run-ended {type(error).__name__ if error else None}")


@pytest.fixture
def watching(monkeypatch: pytest.MonkeyPatch) -> list[Watcher]:
    made: list[Watcher] = []
    monkeypatch.setattr(observe, "_FACTORIES", [])

    def factory(agent: Any, request: Any) -> Watcher:
        made.append(Watcher(getattr(agent, "fail_on", None)))
        return made[-1]

    observe.use_run_observers(factory)
    return made


@tool(side_effects=False)
def look(q: str) -> str:
    return "seen"


async def test_an_observer_sees_every_event_but_the_deltas_and_the_ends(watching: list[Watcher]) -> None:
    agent = We0Agent(ScriptedModel([[tool_call("look", {"q": "a"})], [text(["x", "y", "z"])]]), tools=[look])
    events = [ev["type"] async for ev in agent.stream(messages=[user_message("go")])]
    [w] = watching
    assert [t for t in events if not t.endswith("-delta")] == [t for t in w.seen if not t.startswith(("model", "run"))]
    assert "text-delta" in events and "text-delta" not in w.seen
    assert "model-ended 1 None" in w.seen and "model-ended 2 None" in w.seen
    assert w.seen[-1] == "run-ended None"


async def test_an_abort_ends_the_observed_run_with_the_cancel(watching: list[Watcher]) -> None:
    abort = asyncio.Event()
    agent = We0Agent(ScriptedModel([[text(["a"] * 50)]], delay=0.01), persistence=MemoryPersistence())
    with pytest.raises(asyncio.CancelledError):
        async for ev in agent.stream(abort=abort, messages=[user_message("go")]):
            if ev["type"] == "text-delta":
                abort.set()
    assert watching[0].seen[-1] == "run-ended CancelledError"


async def test_an_observer_that_raises_never_fails_the_run(watching: list[Watcher]) -> None:
    agent = We0Agent(ScriptedModel([[tool_call("look", {"q": "a"})], [text("done")]]), tools=[look])
    agent.fail_on = "step-start"  # type: ignore[attr-defined]
    result = await agent.invoke(messages=[user_message("go")])
    assert result.text == "done"
    assert watching[0].seen[-1] == "step-start"  # it watched no more after it failed


async def test_no_factory_no_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observe, "_FACTORIES", [])
    agent = We0Agent(ScriptedModel([[text("hi")]]))
    assert observe.observer_for(agent, agent.build_request(messages=[user_message("go")])) is None


async def test_an_observer_that_guards_itself_is_called_as_it_is_and_others_are_guarded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class GuardsItself(Watcher):
        guarded = True

    agent = We0Agent(ScriptedModel([[text("hi")]]))
    request = agent.build_request(messages=[user_message("go")])
    itself = GuardsItself()
    monkeypatch.setattr(observe, "_FACTORIES", [lambda a, r: itself])
    assert observe.observer_for(agent, request) is itself  # (no guard's call per event)
    monkeypatch.setattr(observe, "_FACTORIES", [lambda a, r: Watcher()])
    assert isinstance(observe.observer_for(agent, request), observe.Guarded)
    monkeypatch.setattr(observe, "_FACTORIES", [lambda a, r: itself, lambda a, r: Watcher()])
    assert isinstance(observe.observer_for(agent, request), observe.Guarded)  # (two: the pair is guarded)

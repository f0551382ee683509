"""Reasoning blocks a provider verifies (Anthropic's signed and redacted thinking): the model
port's ``ReasoningEnd`` → reasoning parts → the history the next request carries."""

from __future__ import annotations

from typing import AsyncIterator

from we0nb import MemoryPersistence, We0Agent, user_message
from we0nb.engine.history import convert
from we0nb.messages import ReasoningPart
from we0nb.models.base import (
    AssistantTurn, FinishEvent, Model, ModelEvent, ModelRequest, ReasoningBlock, ReasoningDelta, ReasoningEnd,
    TextDelta,
)


class Replay(Model):
    """A model that streams the given events once per call."""

    model_id = "replay"

    def __init__(self, *steps: list[ModelEvent]):
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:  # type: ignore[override]
        self.requests.append(request)
        for ev in self.steps.pop(0):
            yield ev


async def test_reasoning_end_closes_signs_and_adds_redacted_blocks():
    model = Replay([
        ReasoningDelta("a"), ReasoningDelta("b"), ReasoningEnd(signature="S1"),  # one signed block
        ReasoningDelta("c"), ReasoningEnd(),                                      # an unsigned one
        ReasoningEnd(redacted="R"),                                               # a redacted block
        ReasoningEnd(signature="S4"),                                             # a signature without text
        ReasoningEnd(),                                                           # nothing open: nothing to do
        TextDelta("x"), FinishEvent(),
    ], [TextDelta("y"), FinishEvent()])
    agent = We0Agent(model, persistence=MemoryPersistence())
    events = [e async for e in agent.stream(session_id="s", messages=[user_message("q")])]
    assert [e["type"] for e in events if e["type"].startswith("reasoning")] == [
        "reasoning-start", "reasoning-delta", "reasoning-delta", "reasoning-end",
        "reasoning-start", "reasoning-delta", "reasoning-end",
        "reasoning-start", "reasoning-end", "reasoning-start", "reasoning-end"]
    msg = (await agent.transcript("s")).messages[1]
    parts = [(p.text, p.signature, p.redacted) for p in msg.parts if isinstance(p, ReasoningPart)]
    assert parts == [("ab", "S1", None), ("c", None, None), ("", None, "R"), ("", "S4", None)]
    assert all(p.time.end is not None for p in msg.parts if isinstance(p, ReasoningPart))
    (turn,) = convert(msg)
    assert turn == AssistantTurn("x", "abc", [], reasoning_blocks=[
        ReasoningBlock("ab", "S1"), ReasoningBlock("", None, "R"), ReasoningBlock("", "S4")])
    await agent.invoke(session_id="s", messages=[user_message("again")])
    assert model.requests[1].messages[1] == turn


async def test_without_reasoning_end_deltas_make_one_part():
    model = Replay([ReasoningDelta("a"), ReasoningDelta("b"), TextDelta("x"), ReasoningDelta("c"), FinishEvent()])
    agent = We0Agent(model)
    await agent.invoke(session_id="s", messages=[user_message("q")])
    msg = (await agent.transcript("s")).messages[1]
    parts = [(p.text, p.signature) for p in msg.parts if isinstance(p, ReasoningPart)]
    assert parts == [("ab", None), ("c", None)]
    assert convert(msg)[0].reasoning_blocks == []

"""A tool step asks no ``isinstance`` that fails against one of our model classes.

Such a test is not cheap: pydantic's metaclass is not ``type``, so ``isinstance`` looks up and
calls its ``__instancecheck__``, which on a miss reads the object's ``__class__`` through
pydantic's ``__getattr__`` hook (~260 ns, against ~80 ns for a test that succeeds). The step's
own reads tell parts apart by their ``type`` field instead (docs/performance.md, "where a W2
step's instructions go"). Counted here by wrapping that ``__instancecheck__`` while a run of tool
steps goes on, on each store of the shared ``store`` fixture (memory and SQLite).
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from pydantic._internal._model_construction import ModelMetaclass

from we0nb import ScriptedModel, We0Agent, text, tool, tool_call, user_message


@tool(side_effects=False)
async def ping(i: int) -> str:
    """A trivial tool."""
    return "pong"


async def _tool_steps(store: Any, steps: int, prompt: str) -> Any:
    """A run of ``steps`` calls of ``ping``, then a final text; its result."""
    model = ScriptedModel([[tool_call("ping", {"i": i})] for i in range(steps)] + [[text("done")]])
    agent = We0Agent(model, tools=[ping], persistence=store, max_steps=steps + 2)
    return await agent.invoke(messages=[user_message(prompt)])


async def test_tool_steps_fail_no_isinstance_against_our_models(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    steps = 12
    await _tool_steps(store, steps, "warm up")  # (imports and first-use paths outside the count)

    failed: collections.Counter[str] = collections.Counter()
    original = ModelMetaclass.__instancecheck__

    def counting(cls: Any, instance: Any) -> bool:
        answer = original(cls, instance)
        # (pydantic's own test of a tool's arguments, a dict, in model_validate is not the step's)
        if not answer and cls.__module__.startswith("we0nb") and not isinstance(instance, dict):
            failed[f"isinstance({type(instance).__name__}, {cls.__name__})"] += 1
        return answer

    monkeypatch.setattr(ModelMetaclass, "__instancecheck__", counting)
    result = await _tool_steps(store, steps, "go")
    monkeypatch.undo()
    assert result.text == "done"
    assert not failed, f"failing isinstance tests against our models during {steps} tool steps: {dict(failed)}"

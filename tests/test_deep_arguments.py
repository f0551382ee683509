"""Issue 32, item 4: tool arguments nested deeper than Python's stack are a tool error the model
sees (SPEC §6: invalid input from the model is a tool error, not a crash), in memory, in SQLite
and in a batch; the transcript stays writable and the frames readable."""

from __future__ import annotations

import json
from typing import Any

import pytest

from we0nb import MemoryPersistence, ScriptedModel, SqlPersistence, We0Agent, text, tool, tool_call, user_message
from we0nb._json import MAX_JSON_DEPTH, clip_depth, too_deep
from we0nb.models._wire import tool_input as wire_tool_input
from we0nb.models.base import ToolResult
from we0nb.notebook import frames

DEEP_TEXT = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"  # a JSON text 100,000 levels deep
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000  # the same, not even an object


def nested(levels: int) -> dict[str, Any]:
    """An object ``levels`` deep (itself level 1): {"a": {"a": … {}}}."""
    top: dict[str, Any] = {}
    cur = top
    for _ in range(levels - 1):
        cur["a"] = {}
        cur = cur["a"]
    return top


@tool
def echo(a: Any = None) -> str:
    """Takes anything."""
    return "ran"


def store(kind: str, tmp_path) -> Any:
    return MemoryPersistence() if kind == "memory" else SqlPersistence(f"sqlite:///{tmp_path / 'deep.db'}")


ARGS = {"text-100000": DEEP_TEXT, "array-100000": DEEP_ARRAY, "object-5000": nested(5000),
        "object-limit+1": nested(MAX_JSON_DEPTH + 1)}


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("case", sorted(ARGS))
async def test_deep_arguments_are_a_tool_error_the_model_sees(kind: str, case: str, tmp_path) -> None:
    p = store(kind, tmp_path)
    model = ScriptedModel([[tool_call("echo", ARGS[case])], [text("flatter next time")], [text("again")]])
    agent = We0Agent(model, tools=[echo], persistence=p)
    result = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert result.result == "stop"
    t = await p.load_transcript("s")
    (part,) = [tp for m in t.messages for tp in m.tool_parts]
    assert part.state.status == "error" and "nest more than 100 levels deep" in part.state.error
    # the model was told, in the tool result of its next request
    sent = [m for m in model.requests[1].messages if isinstance(m, ToolResult)]
    assert len(sent) == 1 and sent[0].is_error and "nest more than 100 levels deep" in sent[0].content
    # the transcript stays writable: the same session takes another turn
    again = await agent.invoke(session_id="s", messages=[user_message("once more")])
    assert again.result == "stop"
    # and the frames read it
    calls = frames.tool_calls_df(p)
    assert list(calls["status"]) == ["error"] and "100 levels" in calls["error"].iloc[0]
    assert len(frames.messages_df(p)) == 5 and len(frames.parts_df(p)) >= 5  # user, call, answer; user, answer
    await p.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_arguments_at_the_limit_still_run(kind: str, tmp_path) -> None:
    p = store(kind, tmp_path)
    args = {"a": nested(MAX_JSON_DEPTH - 1)}  # MAX_JSON_DEPTH levels: taken
    agent = We0Agent(ScriptedModel([[tool_call("echo", json.dumps(args))], [text("ok")]]), tools=[echo], persistence=p)
    await agent.invoke(session_id="s", messages=[user_message("go")])
    t = await p.load_transcript("s")
    (part,) = [tp for m in t.messages for tp in m.tool_parts]
    assert part.state.status == "completed" and part.state.output == "ran"
    assert part.state.input == args
    assert frames.tool_calls_df(p)["status"].tolist() == ["completed"]
    await p.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_batch_item_with_deep_arguments_completes(kind: str, tmp_path) -> None:
    p = store(kind, tmp_path)
    model = ScriptedModel([[tool_call("echo", DEEP_TEXT)], [text("done")], [tool_call("echo", nested(5000))],
                           [text("done")]])
    agent = We0Agent(model, tools=[echo], persistence=p)
    batch = await agent.batch(["one", "two"], name="deep", concurrency=1, progress=False)
    assert batch.counts == {"stop": 2}  # both items ended their turn
    calls = frames.tool_calls_df(p)
    assert calls["status"].tolist() == ["error", "error"]
    assert all("100 levels" in e for e in calls["error"])
    await p.close()


def test_the_wire_hands_deep_text_on_as_text() -> None:
    """A provider's stream parser does not crash on it either: the text goes to the engine."""
    assert wire_tool_input(DEEP_TEXT) == DEEP_TEXT


def test_depth_helpers() -> None:
    assert not too_deep(nested(MAX_JSON_DEPTH)) and too_deep(nested(MAX_JSON_DEPTH + 1))
    assert not too_deep({"a": [[1, 2], {"b": "x" * 10}]}, limit=3) and too_deep({"a": [[1, 2]]}, limit=2)
    clipped = clip_depth(nested(5000))
    assert too_deep(clipped) and not too_deep(clipped, MAX_JSON_DEPTH + 1)
    assert json.loads(json.dumps(clipped)) == clipped  # storable, and short


def test_depth_counts_every_branch_and_every_kind_of_value() -> None:
    """The deep branch is found wherever it sits among flat siblings; scalars are level 0."""
    deep_last = {"a": 1, "b": [1, "x"], "c": {"d": None}, "e": [[[[]]]]}  # "e" reaches level 5
    assert too_deep(deep_last, limit=4) and not too_deep(deep_last, limit=5)
    deep_first = [[[[{}]]], {"x": 1}, 2]
    assert too_deep(deep_first, limit=4) and not too_deep(deep_first, limit=5)
    for scalar in (1, "text", None, 2.5, True):
        assert not too_deep(scalar) and not too_deep(scalar, limit=0)
    assert too_deep({}, limit=0) and not too_deep({}, limit=1) and not too_deep([], limit=1)

"""Tools: decorator forms, policy defaults, input validation, sync off the loop, output conversion."""

import functools
import threading

import pytest
from pydantic import BaseModel

from we0nb import AnyToolDefinition, ScriptedModel, ToolDefinition, We0Agent, text, tool, tool_call, user_message
from we0nb.tools import ToolInputError, to_output


def test_decorator_forms_and_defaults():
    @tool
    def a(x: int) -> int:
        """Add one."""
        return x + 1

    @tool(side_effects=False, blocks_on_error=True)
    async def b(path: str, limit: int = 10) -> str:
        return path

    def c(q: str) -> str:
        return q

    c_def = tool(c, side_effects=False)
    assert isinstance(a, ToolDefinition) and a.name == "a" and a.description == "Add one."
    assert a.side_effects is True and a.blocks_on_error is False
    assert b.side_effects is False and b.blocks_on_error is True and b.is_async
    assert c_def.name == "c" and c_def.side_effects is False and not c_def.is_async
    schema = b.json_schema()
    assert schema["properties"]["path"]["type"] == "string"
    assert schema["required"] == ["path"]
    assert AnyToolDefinition.__origin__ is ToolDefinition


def test_input_validation_messages():
    @tool
    def f(n: int) -> int:
        return n

    assert f.validate_input({"n": "3"}) == {"n": 3}
    with pytest.raises(ToolInputError, match="Invalid arguments for tool 'f'") as info:
        f.validate_input({"n": "three"})
    # in words: where, what, the value given; none of pydantic's [type=…, input_value=…] codes
    assert str(info.value) == ("Invalid arguments for tool 'f' at 'n': Input should be a valid integer, "
                               "unable to parse string as an integer (got 'three').")
    with pytest.raises(ToolInputError, match="Invalid arguments"):
        f.validate_input({"n": 1, "extra": 2})
    with pytest.raises(ToolInputError, match="not valid JSON"):
        f.validate_input("{n: ")
    with pytest.raises(ToolInputError, match="must be a JSON object"):
        f.validate_input([1])


async def test_sync_tools_run_off_the_event_loop_thread():
    seen = []

    @tool
    def where() -> str:
        seen.append(threading.current_thread())
        return "x"

    assert await where.execute({}) == "x"
    assert seen[0] is not threading.main_thread()


class Out(BaseModel):
    a: int


def test_output_conversion():
    assert to_output("plain") == "plain"
    assert to_output({"a": [1, "é"]}) == '{"a":[1,"é"]}'
    assert to_output(Out(a=1)) == '{"a":1}'
    assert to_output(None) == "null"


def test_bad_definitions():
    with pytest.raises(TypeError, match="lambda"):
        tool(lambda x: x)
    with pytest.raises(TypeError, match=r"\*args"):
        @tool
        def g(*args):
            pass
    with pytest.raises(TypeError, match="True or False"):
        tool(side_effects="no")


def test_definitions_a_tool_could_never_be_called_with_are_refused_by_name():
    def add(a: int, b: int) -> int:
        return a + b

    def first(a: int, /, b: int) -> int:
        return a

    class Adder:
        def __call__(self, a: int, b: int) -> int:
            return a + b

    with pytest.raises(TypeError, match="positional-only") as info:
        tool(first)  # a tool is called with keyword arguments: 'a' could never be passed
    assert "'a'" in str(info.value) and "remove the '/'" in str(info.value)
    with pytest.raises(TypeError, match="positional-only"):
        tool(len)  # a builtin: len(obj, /)
    with pytest.raises(TypeError, match="a functools.partial has no name of its own; pass name="):
        tool(functools.partial(add, b=1))
    with pytest.raises(TypeError, match="an object of class Adder has no name of its own; pass name="):
        tool(Adder())
    for bad in (5, "", "  "):
        with pytest.raises(TypeError, match="name must be a non-empty string"):
            tool(add, name=bad)
    with pytest.raises(TypeError, match="description must be a string, got int"):
        tool(add, description=3)
    assert tool(functools.partial(add, b=1), name="inc").input_model.model_fields.keys() == {"a", "b"}


async def test_an_object_with_an_async_call_method_is_an_async_tool():
    class AsyncAdder:
        async def __call__(self, a: int, b: int) -> int:
            return a + b

    t = tool(AsyncAdder(), name="add")
    assert t.is_async  # (run on the loop, awaited: not a coroutine object returned from a thread)
    agent = We0Agent(ScriptedModel([[tool_call("add", {"a": 1, "b": 2})], [text("ok")]]), tools=[t])
    await agent.invoke(session_id="ses_add", messages=[user_message("add")])
    call = (await agent.transcript("ses_add")).messages[1].tool_parts[0]
    assert call.state.status == "completed" and call.state.output == "3"

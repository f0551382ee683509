"""Structured output in its three modes (tool, native, prompted), and retries of invalid answers."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from we0nb import (
    FunctionModel, OutputValidationError, ScriptedModel, We0Agent, output, text, tool_call, user_message,
)
from we0nb.models.base import UserTurn

from enginekit import Log, make_tools

SID = "ses_out"


class City(BaseModel):
    name: str
    population: int


PARIS = City(name="Paris", population=2_100_000)


@pytest.mark.parametrize("mode", ["native", "prompted"])
async def test_text_modes_take_the_reply_as_the_answer(store, mode):
    model = ScriptedModel([[output(PARIS)]])
    agent = We0Agent(model, output_type=City, output_mode=mode, persistence=store)
    r = await agent.invoke(session_id=SID, messages=[user_message("biggest city?")])
    assert r.output == PARIS
    (req,) = model.requests
    assert req.output_mode == mode and req.output_tool is None
    assert req.output_schema == agent.output_schema and req.output_schema["title"] == "City"
    assert not any(t.name == "final_result" for t in req.tools)
    if mode == "prompted":
        assert '"population"' in req.system and "JSON" in req.system
    else:
        assert req.system is None  # native: the server gets the schema, not the prompt
    t = await agent.transcript(SID)
    assert not t.needs_resume and t.messages[-1].text.startswith("{")
    # a finished turn keeps its output on resume (read back from the text)
    again = await agent.invoke(mode="resume", session_id=SID)
    assert again.output == PARIS and len(model.requests) == 1


async def test_the_models_own_mode_is_the_default():
    model = ScriptedModel([[output(PARIS)]])
    model.output_mode = "native"
    agent = We0Agent(model, output_type=City)
    assert agent.output_mode == "native"
    assert (await agent.invoke(session_id=SID, messages=[user_message("q")])).output == PARIS
    assert We0Agent(ScriptedModel([]), output_type=City, output_mode="tool").output_mode == "tool"
    with pytest.raises(ValueError, match="output_mode"):
        We0Agent(ScriptedModel([]), output_type=City, output_mode="json")


async def test_native_mode_with_tools_answers_after_them():
    log = Log()
    model = ScriptedModel([[tool_call("read", {"path": "a"})], [text('{"name": "Rome", "population": 3}')]])
    agent = We0Agent(model, tools=make_tools(log), output_type=City, output_mode="native")
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.output == City(name="Rome", population=3) and r.steps == 2
    assert [name for name, _ in log.calls] == ["read"]


@pytest.mark.parametrize("mode", ["native", "prompted"])
async def test_an_invalid_text_answer_is_asked_again(store, mode):
    model = ScriptedModel([[text("Paris, I think.")], [text('{"name": "Paris"}')], [output(PARIS)]])
    agent = We0Agent(model, output_type=City, output_mode=mode, persistence=store)
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.output == PARIS and r.steps == 3
    retry1, retry2 = (req.messages[-1] for req in model.requests[1:])
    assert isinstance(retry1, UserTurn) and "not JSON" in retry1.text and '"population"' in retry1.text
    assert isinstance(retry2, UserTurn) and "population" in retry2.text  # the validation error
    t = await agent.transcript(SID)
    roles = [m.info.role for m in t.messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert all(m.parts[0].synthetic for m in t.messages[2::2])


async def test_a_plain_text_answer_in_tool_mode_is_asked_again():
    model = ScriptedModel([[text("It is Paris.")], [output(PARIS)]])
    agent = We0Agent(model, output_type=City)
    r = await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert r.output == PARIS and r.steps == 2
    last = model.requests[1].messages[-1]
    assert isinstance(last, UserTurn) and "final_result" in last.text


@pytest.mark.parametrize("mode", ["tool", "native"])
async def test_plain_text_retries_are_bounded(mode):
    model = ScriptedModel([[text("no")]] * 3)
    agent = We0Agent(model, output_type=City, output_mode=mode, output_retries=1)
    with pytest.raises(OutputValidationError, match="2 times"):
        await agent.invoke(session_id=SID, messages=[user_message("q")])
    assert len(model.requests) == 2
    model = ScriptedModel([[text("no")]])
    with pytest.raises(OutputValidationError, match="output_retries=0"):
        await We0Agent(model, output_type=City, output_mode=mode, output_retries=0).invoke(
            session_id=SID, messages=[user_message("q")])


async def test_an_abort_after_the_retry_message_resumes_the_turn():
    gate = asyncio.Event()
    calls = 0

    async def reply(request):
        nonlocal calls
        calls += 1
        if calls == 1:
            return [text("not json")]
        if calls == 2:
            gate.set()
            await asyncio.sleep(30)  # aborted here
        return [output(PARIS)]

    agent = We0Agent(FunctionModel(reply), output_type=City, output_mode="native")
    abort = asyncio.Event()
    task = asyncio.create_task(agent.invoke(abort=abort, session_id=SID, messages=[user_message("q")]))
    await asyncio.wait_for(gate.wait(), 10)
    abort.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await agent.transcript(SID)).needs_resume
    r = await agent.invoke(mode="resume", session_id=SID)
    assert r.output == PARIS

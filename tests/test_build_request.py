"""Entry-point validation: build_request is the one gate, with the spec's exact messages."""

import asyncio

import pytest
from pydantic import BaseModel

from we0nb import MemoryPersistence, RunRequest, ScriptedModel, We0Agent, text, user_message


@pytest.fixture
def agent():
    return We0Agent(ScriptedModel([[text("hi")]]))


def test_prompt_requires_messages(agent):
    with pytest.raises(ValueError) as e:
        agent.build_request(abort=asyncio.Event(), mode="prompt", session_id="s")
    assert str(e.value) == "messages is required in prompt mode."


def test_prompt_is_the_default_mode(agent):
    with pytest.raises(ValueError, match="^messages is required in prompt mode.$"):
        agent.build_request(session_id="s")


def test_resume_forbids_messages(agent):
    with pytest.raises(ValueError) as e:
        agent.build_request(abort=asyncio.Event(), mode="resume", session_id="s",
                            messages=[user_message("continue")])
    assert str(e.value) == "messages is not allowed in resume mode."


def test_unknown_mode(agent):
    with pytest.raises(ValueError, match="mode must be 'prompt' or 'resume'"):
        agent.build_request(mode="replay", session_id="s")


def test_resume_needs_a_session_id(agent):
    with pytest.raises(ValueError, match="session_id is required in resume mode"):
        agent.build_request(mode="resume")


def test_prompt_without_session_id_generates_one(agent):
    r = agent.build_request(messages=[user_message("hi")])
    assert isinstance(r, RunRequest)
    assert r.session_id.startswith("ses_") and r.mode == "prompt"
    assert r.messages[0].text == "hi"
    assert isinstance(r.abort, asyncio.Event)


@pytest.mark.parametrize("bad", ["hi", user_message("hi"), 3])
def test_messages_must_be_a_list(agent, bad):
    with pytest.raises(TypeError, match="messages must be a list of user_message"):
        agent.build_request(messages=bad)


def test_message_items_must_be_user_messages(agent):
    with pytest.raises(TypeError, match=r"messages\[1\] must be built with user_message"):
        agent.build_request(messages=[user_message("a"), "b"])


def test_empty_messages(agent):
    with pytest.raises(ValueError, match="at least one"):
        agent.build_request(messages=[])


def test_abort_must_be_an_asyncio_event(agent):
    import threading

    with pytest.raises(TypeError, match="abort must be an asyncio.Event"):
        agent.build_request(abort=threading.Event(), messages=[user_message("a")])


def test_session_id_type(agent):
    with pytest.raises(TypeError, match="session_id must be a string"):
        agent.build_request(session_id=42, messages=[user_message("a")])
    with pytest.raises(ValueError, match="must not be empty"):
        agent.build_request(session_id="  ", messages=[user_message("a")])


@pytest.mark.parametrize("char", ["\x00", "\n", "\x1b", "\x85", "\u2028", "\u2029", "\u202e", "\u200b", "\u2066",
                                  "\ufeff"])
def test_session_ids_with_control_or_invisible_format_characters_are_refused(agent, char):
    with pytest.raises(ValueError, match="must be printable text"):
        agent.build_request(session_id=f"ses{char}x", messages=[user_message("a")])


def test_session_ids_of_any_printable_text_are_taken(agent):
    for sid in ("ses é 日本", "a b", "ses_%_'; drop", "😀"):
        assert agent.build_request(session_id=sid, messages=[user_message("a")]).session_id == sid


def test_user_message_type():
    with pytest.raises(TypeError, match="expects a string"):
        user_message(3)


async def test_build_request_runs_nothing():
    p = MemoryPersistence()
    model = ScriptedModel([[text("hi")]])
    agent = We0Agent(model, persistence=p)
    agent.build_request(session_id="s", messages=[user_message("x")])
    assert model.requests == []
    assert (await agent.transcript("s")).session is None


async def test_stream_and_invoke_validate_through_build_request(agent):
    with pytest.raises(ValueError, match="^messages is not allowed in resume mode.$"):
        agent.stream(mode="resume", session_id="s", messages=[user_message("x")])
    with pytest.raises(ValueError, match="^messages is required in prompt mode.$"):
        await agent.invoke(session_id="s")


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize("mode", ["prompt", "resume"])
def test_stream_refuses_structured_output(mode):
    agent = We0Agent(ScriptedModel([]), output_type=Answer)
    kwargs = {"messages": [user_message("x")]} if mode == "prompt" else {}
    with pytest.raises(ValueError, match="use invoke"):
        agent.stream(abort=asyncio.Event(), mode=mode, session_id="s", **kwargs)


def test_agent_constructor_errors():
    with pytest.raises(TypeError, match="expected a we0nb model"):
        We0Agent("gpt")
    with pytest.raises(TypeError, match="persistence"):
        We0Agent(ScriptedModel([]), persistence={})
    with pytest.raises(ValueError, match="max_steps"):
        We0Agent(ScriptedModel([]), max_steps=0)
    with pytest.raises(TypeError, match="is not a tool"):
        We0Agent(ScriptedModel([]), tools=[42])


def test_agent_texts_and_output_types_of_the_wrong_kind_are_named():
    class NotAModel:
        pass

    for bad in (5, ["be brief", "be kind"]):
        with pytest.raises(TypeError, match=r"system_prompt=\.\.\.\): expected a string or None"):
            We0Agent(ScriptedModel([]), system_prompt=bad)
    with pytest.raises(TypeError, match=r"output_tool_name=\.\.\.\): expected a non-empty string"):
        We0Agent(ScriptedModel([]), output_type=dict, output_tool_name="")
    for bad in (5, NotAModel, object()):  # (pydantic cannot make a schema of these: its own error was raised)
        with pytest.raises(TypeError, match=r"output_type=\.\.\.\): expected a pydantic model, dataclass or "
                                            r"TypedDict .*, got "):
            We0Agent(ScriptedModel([]), output_type=bad)


def test_script_items_and_function_replies_of_the_wrong_kind_are_named():
    from we0nb import FunctionModel, ModelError
    from we0nb.testing import reasoning

    for bad in (5, None, b"bytes"):
        with pytest.raises(TypeError, match=r"text\(\)/reasoning\(\): expected a string or a list of string deltas"):
            text(bad)
        with pytest.raises(TypeError, match="expected a string or a list of string deltas"):
            reasoning(bad)

    def generator(request):
        yield text("from a generator")

    assert asyncio.run(We0Agent(FunctionModel(generator)).invoke(messages=[user_message("x")])).text == \
        "from a generator"
    with pytest.raises(ModelError, match="FunctionModel: the function returned NoneType; return a string"):
        asyncio.run(We0Agent(FunctionModel(lambda request: None)).invoke(messages=[user_message("x")]))

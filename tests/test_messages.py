"""The data model: exact JSON round-trip and discriminated unions."""

import json

import pytest
from pydantic import TypeAdapter

from we0nb.messages import (
    AssistantMessage, CompactionPart, Message, MessageError, MessageTime, MessageWithParts, Part, PartTime,
    ReasoningPart, Session, SessionRevert, SessionTime, StepFinishPart, StepStartPart, TextPart, ToolPart,
    ToolStateCompleted, ToolStateError, ToolStatePending, ToolStateRunning, ToolTime, Transcript, Usage,
    UserMessage,
)

B = dict(session_id="ses_1", message_id="msg_1")
SAMPLES = [
    TextPart(id="p1", **B, text="héllo <b>", time=PartTime(start=1.5, end=2.25)),
    ReasoningPart(id="p2", **B, text="thinking", time=PartTime(start=1.0)),
    ToolPart(id="p3", **B, call_id="c1", tool="read", state=ToolStatePending(input={"a": [1, 2]}, raw=None)),
    ToolPart(id="p4", **B, call_id="c2", tool="read", state=ToolStateRunning(input={}, time=ToolTime(start=3.0))),
    ToolPart(id="p5", **B, call_id="c3", tool="read",
             state=ToolStateCompleted(input={"x": 1}, output="ok", metadata={"recalled": True},
                                      time=ToolTime(start=3.0, end=4.125))),
    ToolPart(id="p6", **B, call_id="c4", tool="rm",
             state=ToolStateError(input={}, error="boom", metadata={"interrupted": True, "reason": "resume"},
                                  time=ToolTime(start=None, end=5.0))),
    StepStartPart(id="p7", **B, time=0.1),
    StepFinishPart(id="p8", **B, reason="stop", usage=Usage(input_tokens=3, output_tokens=4), time=0.2),
    CompactionPart(id="p9", **B, summary="sum", time=0.3),
]


@pytest.mark.parametrize("part", SAMPLES, ids=lambda p: p.type + "-" + p.id)
def test_part_round_trip(part):
    adapter = TypeAdapter(Part)
    dumped = part.model_dump_json()
    again = adapter.validate_json(dumped)
    assert type(again) is type(part) and again == part
    assert again.model_dump_json() == dumped


def test_tool_states_discriminated_by_status():
    adapter = TypeAdapter(ToolPart)
    for status, cls in [("pending", ToolStatePending), ("running", ToolStateRunning),
                        ("completed", ToolStateCompleted), ("error", ToolStateError)]:
        p = next(s for s in SAMPLES if isinstance(s, ToolPart) and s.state.status == status)
        assert isinstance(adapter.validate_json(p.model_dump_json()).state, cls)


def test_messages_round_trip():
    adapter = TypeAdapter(Message)
    u = UserMessage(id="m1", session_id="s", time=MessageTime(created=1.0))
    a = AssistantMessage(id="m2", session_id="s", time=MessageTime(created=1.0, completed=None),
                         error=MessageError(reason="UnfinishedAssistantMessage", message="x",
                                            metadata={"recovered": True, "mode": "resume"}),
                         model_id="m", usage=Usage(input_tokens=1), finish_reason="stop", parent_id="m1")
    for m in (u, a):
        back = adapter.validate_json(m.model_dump_json())
        assert back == m and type(back) is type(m)
    assert json.loads(a.model_dump_json())["time"]["completed"] is None


def test_session_and_transcript_round_trip():
    s = Session(id="s", title="t", time=SessionTime(created=1.0, updated=2.0),
                revert=SessionRevert(message_id="m1", time=3.0))
    assert Session.model_validate_json(s.model_dump_json()) == s
    t = Transcript(session=s, messages=[MessageWithParts(
        info=UserMessage(id="m1", session_id="s", time=MessageTime(created=1.0)), parts=[SAMPLES[0]])])
    back = Transcript.model_validate_json(t.model_dump_json())
    assert back == t and back.messages[0].text == "héllo <b>"


def test_unknown_fields_are_rejected():
    with pytest.raises(Exception):
        TextPart.model_validate({"id": "p", **B, "type": "text", "text": "", "bogus": 1})


def _same_object(a, b) -> bool:
    """The same pydantic object: type, fields in order, fields set, extra, private attributes."""
    return (type(a) is type(b) and list(a.__dict__.items()) == list(b.__dict__.items())
            and a.__pydantic_fields_set__ == b.__pydantic_fields_set__
            and a.__pydantic_extra__ == b.__pydantic_extra__ and a.__pydantic_private__ == b.__pydantic_private__)


def test_assembled_is_model_construct():
    """``assembled`` builds what ``model_construct`` builds: directly when every field is given in
    order, by ``model_construct`` itself otherwise (a default to fill, another order, private
    attributes)."""
    from pydantic import BaseModel, PrivateAttr

    from we0nb.engine.revert import MarkedMessage
    from we0nb.messages import assembled

    info = UserMessage(id="msg_1", session_id="ses_1", time=MessageTime(created=1.0))
    parts = [SAMPLES[0]]
    session = Session(id="ses_1", title="t", time=SessionTime(created=1.0, updated=2.0))
    cases = [(MessageWithParts, dict(info=info, parts=parts)),
             (MarkedMessage, dict(info=info, parts=parts, reverted=True)),
             (Transcript, dict(session=session, messages=[MessageWithParts(info=info, parts=parts)])),
             (Transcript, dict(session=None)),  # (messages left to its default)
             (MarkedMessage, dict(parts=parts, info=info, reverted=False))]  # (another order)
    for cls, fields in cases:
        got = assembled(cls, **dict(fields))
        assert _same_object(got, cls.model_construct(**dict(fields))), cls
        assert got.model_dump_json() == cls.model_construct(**dict(fields)).model_dump_json()

    class Private(BaseModel):
        a: int
        _b: int = PrivateAttr(default=7)

    got = assembled(Private, a=1)
    assert got._b == 7 and _same_object(got, Private.model_construct(a=1))

"""Structured output: asked for in one of three modes, validated, retried, taken as the result.

With ``We0Agent(output_type=...)`` the answer is a JSON object validated against the type.
``output_mode`` (the agent's, else the model's own ``output_mode``) says how it is asked for:

* ``"tool"`` — the model calls the output tool (``output_tool_name``). A valid call ends the
  turn (its part completes with ``metadata["output"] = True``, which is how a transcript
  knows the turn ended); an invalid one becomes a tool error the model sees and may fix;
* ``"native"`` — the request carries the JSON schema (``ModelRequest.output_schema``) and
  the server constrains the reply to it (OpenAI's ``response_format``, llama.cpp's
  grammars): the reply's text is the answer. Tools still work: a step with tool calls goes on;
* ``"prompted"`` — the system prompt asks for a JSON object matching the schema; the reply's
  text is the answer (a Markdown code fence around it is accepted).

Whatever the mode, an answer that is not valid — invalid tool input, or in the text modes
a reply that does not parse or validate, or in tool mode plain text instead of the call —
is sent back to the model, ``output_retries`` times at most (then
:class:`~we0nb.errors.OutputValidationError`). Plain-text replies are answered with a
synthetic user message saying what was wrong.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Optional

from pydantic import ValidationError

from .._ids import now
from ..errors import OutputValidationError
from ..messages import MessageWithParts, ToolPart, ToolStateCompleted, ToolStateError, ToolTime, snapshot
from .events import Event

if TYPE_CHECKING:  # pragma: no cover
    from .state import RunState

__all__ = ["OUTPUT_TOOL_RESULT", "OUTPUT_MODES", "OutputChecker", "prompted_instructions", "resolve_output_mode",
           "parse_json_reply"]

OUTPUT_TOOL_RESULT = "Final result processed."
OUTPUT_MODES = ("tool", "native", "prompted")

_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


def resolve_output_mode(mode: Optional[str], model: Any) -> str:
    """The agent's output mode: its own, else the model's preference, else ``"tool"``."""
    if mode is None:
        mode = getattr(model, "output_mode", None) or "tool"
    if mode not in OUTPUT_MODES:
        raise ValueError(f"We0Agent(output_mode=...): expected 'tool', 'native', 'prompted' or None (the "
                         f"model's own mode), got {mode!r}.")
    return mode


def prompted_instructions(schema: dict[str, Any]) -> str:
    """What prompted mode adds to the system prompt."""
    return ("When you give your final answer, reply with only a JSON object that matches this JSON "
            f"schema, and nothing else:\n{json.dumps(schema, ensure_ascii=False)}")


def parse_json_reply(text: str) -> Any:
    """The JSON value of a text reply (a code fence around it, or prose around one object, tolerated)."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not body:
        raise ValueError("the reply is empty")
    try:
        return json.loads(body)
    except ValueError as e:
        first, last = body.find("{"), body.rfind("}")
        if 0 <= first < last:
            try:
                return json.loads(body[first:last + 1])
            except ValueError:
                pass
        raise ValueError(f"the reply is not JSON ({e}): {body[:200]!r}") from None


class OutputChecker:
    """The structured-output state of one run."""

    def __init__(self, state: "RunState", structured: bool) -> None:
        self.state = state
        self.structured = structured
        self.errors = 0

    @property
    def mode(self) -> Optional[str]:
        agent = self.state.agent
        return agent.output_mode if agent.output_type is not None else None

    def is_output_call(self, tool_name: str) -> bool:
        return self.mode == "tool" and tool_name == self.state.agent.output_tool_name

    def validate(self, tp: ToolPart, raw: Any, meta: dict[str, Any]) -> None:
        """Validate an output call and give it its final state (completed ends the turn)."""
        state, agent = self.state, self.state.agent
        inp = dict(tp.state.input)
        start = now()
        try:
            if raw is not None:
                raise ValueError(f"the arguments are not a JSON object: {raw[:200]!r}")
            value = agent.output_adapter.validate_python(inp)
        except (ValidationError, ValueError) as e:
            tp.state = ToolStateError(input=inp, error=f"Invalid structured output: {e}. Fix it and call "
                                      f"{tp.tool!r} again.", metadata=meta, time=ToolTime(start=start, end=now()))
        else:
            tp.state = ToolStateCompleted(input=inp, output=OUTPUT_TOOL_RESULT, metadata={**meta, "output": True},
                                          time=ToolTime(start=start, end=now()))
            state.output = value
            state.has_output = True

    # ------------------------------------------------------------------ a turn that already ended

    def take_stored(self, part: ToolPart) -> None:
        """A turn that already ended with structured output: validate it again as the result."""
        self._take_stored(part.state.input, f"part {part.id!r}")

    def stored(self, last: MessageWithParts) -> bool:
        """Whether ``last`` (the session's last message) already holds this turn's structured output;
        if so it becomes the result (validated again)."""
        mode = self.mode
        if mode is None or last.info.role != "assistant" or last.unfinished or last.is_summary:
            return False
        if mode == "tool":
            for p in last.tool_parts:
                if self.is_output_call(p.tool) and p.state.status == "completed":
                    self.take_stored(p)
                    return True
            return False
        if last.tool_parts or last.info.error is not None:
            return False
        try:
            value = self.state.agent.output_adapter.validate_python(parse_json_reply(last.text))
        except (ValidationError, ValueError):
            return False  # a reply that was never a valid answer: not this turn's output
        self.state.output, self.state.has_output = value, True
        return True

    def _take_stored(self, value: Any, where: str) -> None:
        agent = self.state.agent
        try:
            self.state.output = agent.output_adapter.validate_python(value)
        except ValidationError as e:
            raise OutputValidationError(
                f"The structured output stored in session {self.state.session_id!r} ({where}) does "
                f"not validate against output_type={agent.output_type!r}: {e}. The agent's output_type "
                "changed since it was written; use the type it was written with, or start a new turn."
            ) from e
        self.state.has_output = True

    # ------------------------------------------------------------------ after each step

    async def after_step(self, msg: MessageWithParts) -> list[Event]:
        """Take a valid answer; count an invalid one and ask again (events of the retry message);
        raise when the retries are used up."""
        state, agent = self.state, self.state.agent
        if agent.output_type is None or state.has_output:
            return []
        tools = msg.tool_parts
        if self.mode == "tool":
            if any(self.is_output_call(x.tool) and x.state.status == "error" for x in tools):
                self._count("invalid structured output")
                return []  # the model sees the tool error and may fix it
            if tools or not self.structured:
                return []
            self._count(f"a plain-text answer instead of a call to {agent.output_tool_name!r}")
            return await self._ask_again(
                f"You answered with plain text, but the answer must be given by calling the tool "
                f"{agent.output_tool_name!r} with arguments that match its schema. Call it now.")
        if tools:
            return []  # the model is still working: the answer comes in a later step
        try:
            value = agent.output_adapter.validate_python(parse_json_reply(msg.text))
        except (ValidationError, ValueError) as e:
            cut = msg.info.finish_reason == "length"  # type: ignore[union-attr]
            self._count("an answer that is not valid structured output")
            why = "was cut off at the token limit" if cut else f"is not valid: {e}"
            return await self._ask_again(f"Your reply {why}. Reply again with only the JSON object, "
                                         f"matching this JSON schema: {json.dumps(agent.output_schema)}")
        state.output, state.has_output = value, True
        return []

    def _count(self, what: str) -> None:
        state, agent = self.state, self.state.agent
        self.errors += 1
        if self.errors > agent.output_retries:
            raise OutputValidationError(
                f"The model returned invalid structured output {self.errors} times "
                f"(output_retries={agent.output_retries}; the last one was {what}) in session "
                f"{state.session_id!r}. The last error is in the transcript; adjust the prompt, the "
                "output_type or the output_mode."
            )

    async def _ask_again(self, text: str) -> list[Event]:
        m = await self.state.append_user_message(text, synthetic=True)
        return [{"type": "user-message", "message": snapshot(m.info), "text": m.text}]

"""Structured output: the output tool's calls validated, retried and taken as the result.

With ``We0Agent(output_type=...)`` the model returns its answer by calling the output tool
(``output_tool_name``). A valid call ends the turn (its part completes with
``metadata["output"] = True``, which is how a transcript knows the turn ended); an invalid
one becomes a tool error the model sees and may fix, ``output_retries`` times at most.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .._ids import now
from ..errors import OutputValidationError
from ..messages import Part, ToolPart, ToolStateCompleted, ToolStateError, ToolTime

if TYPE_CHECKING:  # pragma: no cover
    from .state import RunState

__all__ = ["OUTPUT_TOOL_RESULT", "OutputChecker"]

OUTPUT_TOOL_RESULT = "Final result processed."


class OutputChecker:
    """The structured-output state of one run."""

    def __init__(self, state: "RunState", structured: bool) -> None:
        self.state = state
        self.structured = structured
        self.errors = 0

    def is_output_call(self, tool_name: str) -> bool:
        agent = self.state.agent
        return agent.output_type is not None and tool_name == agent.output_tool_name

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

    def take_stored(self, part: ToolPart) -> None:
        """A turn that already ended with structured output: validate it again as the result."""
        agent = self.state.agent
        try:
            self.state.output = agent.output_adapter.validate_python(part.state.input)
        except ValidationError as e:
            raise OutputValidationError(
                f"The structured output stored in session {self.state.session_id!r} (part {part.id!r}) does "
                f"not validate against output_type={agent.output_type!r}: {e}. The agent's output_type "
                "changed since it was written; use the type it was written with, or start a new turn."
            ) from e
        self.state.has_output = True

    def after_step(self, parts: list[Part]) -> None:
        """Count invalid output calls; raise when retries are used up or the model gave none."""
        state, agent = self.state, self.state.agent
        if agent.output_type is None or state.has_output:
            return
        tools = [x for x in parts if isinstance(x, ToolPart)]
        if any(x.tool == agent.output_tool_name and x.state.status == "error" for x in tools):
            self.errors += 1
            if self.errors > agent.output_retries:
                raise OutputValidationError(
                    f"The model returned invalid structured output {self.errors} times "
                    f"(output_retries={agent.output_retries}) in session {state.session_id!r}. "
                    "The last error is in the transcript; adjust the prompt or output_type."
                )
        elif not tools and self.structured:
            raise OutputValidationError(
                f"The model ended its turn without calling {agent.output_tool_name!r} to return the "
                f"structured output ({agent.output_type!r}) in session {state.session_id!r}."
            )

"""Tool calls, one at a time, in order: validate, write ``running`` (write-ahead), run, record.

The write-ahead is the rule that makes resume safe: a call is committed as ``running``
*before* its tool executes, so a crash at any instant leaves either no trace of an
execution or a ``running`` part that recovery interrupts (side effects) or recalls
(read-only). Execution itself is :meth:`ToolDefinition.call`; this module adds the
durability, the abort, and the error texts the model sees.

A read-only call (``side_effects=False``) needs no write-ahead: recovery runs it again
whether it finds it pending or running. In a pipelined run (a batch item on a store whose
commits wait) its ``running`` state is therefore sent while it runs, not awaited first; its
end state lands after it (the writer keeps their order). A call with side effects always
waits for its write-ahead.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from .._ids import now
from ..messages import (ToolPart, ToolStateCompleted, ToolStateError, ToolStatePending, ToolStateRunning, ToolTime,
                        snapshot)
from ..tools import ToolError, ToolInputError, ToolOutputError, ToolReturn, to_output
from .abort import Aborted

if TYPE_CHECKING:  # pragma: no cover
    from .output import OutputChecker
    from .state import RunState

__all__ = ["ToolExecutor", "interrupted", "denied", "INTERRUPT_TEXT"]

INTERRUPT_TEXT = {
    "resume": "Interrupted during recovery: this call never finished and was not run again "
              "(its tool may have side effects, or an earlier call blocked it); its outcome is unknown.",
    "prompt": "Interrupted: a new user message arrived before this call finished; it was not run again.",
    "blocked": "Not executed: an earlier call in this step failed and its tool blocks the calls after it.",
}


def interrupted(state: Any, reason: str) -> ToolStateError:
    """The final state of a call that was stopped without a result."""
    start = state.time.start if isinstance(state, ToolStateRunning) else None
    return ToolStateError(
        input=state.input,
        error=INTERRUPT_TEXT[reason],
        metadata={"interrupted": True, "reason": reason},
        time=ToolTime(start=start, end=now()),
    )


def denied(part: ToolPart) -> ToolStateError:
    """The final state of a call a person denied: it never ran; the model is told why."""
    detail = part.approval_detail
    reason = detail.reason if detail is not None else None
    said = f": {reason}" if reason else ""
    return ToolStateError(
        input=part.state.input,
        error=f"Denied by a person{said}. The call was not executed.",
        metadata={"denied": True, "reason": reason},
        time=ToolTime(start=None, end=now()),
    )


class ToolExecutor:
    """Runs the tool calls of a run (live steps and recalls). Events carry snapshots of the
    parts (:func:`~we0nb.messages.snapshot`): states are replaced, never mutated, so a shallow
    copy is faithful."""

    def __init__(self, state: "RunState", output: "OutputChecker") -> None:
        self.state = state
        self.output = output
        #: the calls that wait for a person's decision (the run then ends "approval")
        self.awaiting: list[ToolPart] = []

    async def run_step(self, calls: list[ToolPart]) -> AsyncIterator[dict[str, Any]]:
        """The calls of a finished model stream, in order. The last call's end state is left
        to the step's end, which the run writes right after (one commit fewer). A call that
        awaits approval, and every call after it, stays pending (order is kept)."""
        state = self.state
        blocked = waiting = False
        last_index = len(calls) - 1
        for i, tp in enumerate(calls):
            state.scope.check()
            last = i == last_index
            if not blocked and (waiting or tp.awaiting_approval):
                waiting = True
                if tp.awaiting_approval:
                    self.awaiting.append(tp)
                continue
            if blocked:
                tp.state = interrupted(tp.state, "blocked")
                if last:
                    state.writer.mark(tp)
                else:
                    await state.writer.write(None, tp)
                    yield {"type": "tool", "part": state.snap(tp)}
                continue
            async for ev in self.execute(tp, recalled=False, defer_final=last):
                yield ev
            if tp.state.status == "error" and state.blocks(tp.tool):
                blocked = True

    async def execute(self, tp: ToolPart, *, recalled: bool,
                      defer_final: bool = False) -> AsyncIterator[dict[str, Any]]:
        """Run one call: validate, write ``running`` (write-ahead), run, write the end state.

        With ``defer_final`` the end state is only marked: the caller's next write (the
        step's end, at once) commits it.
        """
        state = self.state
        raw = tp.state.raw if isinstance(tp.state, ToolStatePending) else None
        meta: dict[str, Any] = {"recalled": True} if recalled else {}
        detail = tp.approval_detail if tp.approval == "approved" else None
        if detail is not None and detail.input is not None:
            # a person corrected the arguments: those run, the model's own are kept
            meta["original_input"] = detail.original_input
            if isinstance(tp.state, ToolStatePending):
                tp.state = ToolStatePending(input=detail.input)
                raw = None
        definition = state.tools.by_name.get(tp.tool)
        if self.output.is_output_call(tp.tool):
            self.output.validate(tp, raw, meta)
        elif definition is None:
            names = ", ".join(sorted(state.tools.by_name)) or "(none)"
            tp.state = ToolStateError(input=dict(tp.state.input), error=f"Unknown tool {tp.tool!r}. Available "
                                      f"tools: {names}.", metadata=meta, time=ToolTime(start=None, end=now()))
        else:
            try:
                kwargs = definition.validate_input(raw if raw is not None else tp.state.input)
            except ToolInputError as e:
                tp.state = ToolStateError(input=dict(tp.state.input), error=str(e), metadata=meta,
                                          time=ToolTime(start=None, end=now()))
            else:
                tp.state = ToolStateRunning(input=dict(tp.state.input), time=ToolTime(start=now()))
                if state.pipelined and not definition.policy.side_effects:
                    state.writer.write_soon(None, tp)  # read-only: sent while it runs (see the module)
                else:
                    await state.writer.write(None, tp)  # write-ahead: durable before the tool runs
                yield {"type": "tool", "part": state.snap(tp)}
                state.scope.check()
                tp.state = await self._run(definition, kwargs, tp.state, meta)
        if defer_final:
            state.writer.mark(tp)
            return
        await state.writer.write(None, tp)
        yield {"type": "tool", "part": state.snap(tp)}

    async def _run(self, definition: Any, kwargs: dict[str, Any], running: ToolStateRunning,
                   meta: dict[str, Any]) -> Any:
        """Execute the tool (an abort cancels it at once); its final state."""
        inp, start = running.input, running.time.start
        scope = self.state.scope
        try:
            result = await scope.wait(definition.call(kwargs))
        except asyncio.CancelledError:
            if scope.cancelled_by_us() or _task_cancelling():
                raise
            # the tool raised CancelledError itself (no abort, nobody cancelled the run)
            return ToolStateError(input=inp, error="CancelledError: the tool cancelled itself.",
                                  metadata=meta, time=ToolTime(start=start, end=now()))
        except Aborted:  # pragma: no cover - tools never see the scope
            raise
        except ToolError as e:  # the tool's own text, as is (an MCP server's isError result)
            return ToolStateError(input=inp, error=str(e) or "The tool failed without a message.",
                                  metadata={**meta, **e.metadata}, time=ToolTime(start=start, end=now()))
        except Exception as e:
            text = str(e)
            return ToolStateError(input=inp, error=f"{type(e).__name__}: {text}" if text else type(e).__name__,
                                  metadata=meta, time=ToolTime(start=start, end=now()))
        attachments: list[Any] = []
        if type(result) is ToolReturn:
            attachments, result = list(result.attachments), result.output
        try:
            output = to_output(result)
        except ToolOutputError as e:
            # it ran — its side effects happened — but its return value cannot be stored
            return ToolStateCompleted(
                input=inp, output=f"The tool ran, but its return value could not be stored: {e}.",
                metadata={**meta, "output_error": str(e)}, time=ToolTime(start=start, end=now()))
        if attachments:
            return ToolStateCompleted(input=inp, output=output, metadata=meta, time=ToolTime(start=start, end=now()),
                                      attachments=attachments)
        return ToolStateCompleted(input=inp, output=output, metadata=meta, time=ToolTime(start=start, end=now()))


def _task_cancelling() -> bool:
    """Whether the current task has a pending cancel request (someone else cancelled the run)."""
    task: Optional[asyncio.Task[Any]] = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else True

"""One model step of a run: its start, the model's reply, its tool calls, its end.

The durability points of a step, in order: the unfinished assistant message with its start
(committed with the previous step's end, or sent while the model call goes out in a
pipelined run); streamed text as it comes (:mod:`.writer`); each call's write-ahead
(:mod:`.executor`); the step's end — held for the next commit, which follows at once (the
next step's start or the run's end): nothing is run or yielded before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AsyncIterator, Union

from .._ids import now
from ..errors import OutputValidationError
from ..messages import (AssistantMessage, MessageTime, MessageWithParts, StepFinishPart, StepStartPart, ToolPart,
                        Usage, assembled, put)
from ..models.base import FinishEvent, ModelRequest
from ..models.pricing import add_cost, call_cost
from .abort import Aborted
from .events import Event
from .processor import ModelStream, StepProcessor

if TYPE_CHECKING:  # pragma: no cover
    from .executor import ToolExecutor
    from .output import OutputChecker
    from .state import RunState

__all__ = ["run_step"]


async def run_step(state: "RunState", executor: "ToolExecutor",
                   output: "OutputChecker") -> AsyncIterator[Union[Event, ModelStream]]:
    """One step: the model's reply (handed up as a :class:`ModelStream`), its calls, its end."""
    agent, writer, sid = state.agent, state.writer, state.session_id
    state.steps += 1
    t0 = now()
    info = AssistantMessage(id=state.ids("msg"), session_id=sid, time=MessageTime(created=t0),
                            parent_id=state.parent_id(), model_id=agent.model.model_id)
    msg = assembled(MessageWithParts, info=info, parts=[])
    request = state.model_request()
    state.messages.append(msg)
    start = StepStartPart(id=state.ids("prt"), session_id=sid, message_id=info.id, time=t0)
    msg.parts.append(start)
    processor = StepProcessor(state, msg)
    # durability point: the unfinished message exists (committed with the previous step's end)
    if writer.pipelined:  # (sent now; its events come once the model's first event is in)
        writer.write_soon(info, start)
        reply = processor.run(request, prelude=_started(state, info, request))
    else:
        await writer.write(info, start)
        # (what _started yields, without a generator of its own: one fewer per step)
        await writer.settle()
        held = writer.take_held_events()
        if held:
            for ev in held:
                yield ev
            if state.scope.is_set:
                await _undo(state, info)
        if state.steps > 1 and agent.toolset.sources:
            await state.refresh_tools()
            request.tools = list(state.tools.schemas)
        yield {"type": "step-start", "step": state.steps, "message": state.snap(info)}
        reply = processor.run(request)
    async for item in reply:
        yield item
    calls = msg.tool_parts
    if _price(state, info, processor) and calls:
        # the model call's usage and cost go with the first call's write-ahead: an abort while
        # the calls run keeps what the call cost (the step's end rewrites the message anyway);
        # a call that reported neither leaves the row as the step's start wrote it: no write
        writer.hold_message(info)
    async for ev in executor.run_step(calls):
        yield ev
    state.scope.check()
    # durability point: the step's end — committed with whatever the run writes next, at once
    # (the next step's start, or the run's end); nothing is yielded or run before it
    info, sf, events = _close_step(state, msg, processor, calls)
    writer.hold(info, (sf,), msg, events)
    if agent.output_type is None:
        return
    # with an output type, the answer is checked first (in memory): a valid one ends the run, whose
    # last commit (the session's row) takes the step's end along; otherwise the step's end is
    # committed now (or with the message asking again, which writes), and its events come first
    try:
        asked = await output.after_step(msg)
    except OutputValidationError:
        for ev in await writer.commit_held():
            yield ev
        raise
    if state.has_output:
        return
    for ev in await writer.commit_held():  # (a text end held at the stream's end comes first)
        yield ev
    for ev in asked:
        yield ev


async def _started(state: "RunState", info: AssistantMessage, request: ModelRequest) -> AsyncIterator[Event]:
    """Once the step's start is committed: the previous step's end events (now durable), then
    ``step-start``. An abort set by then (by the consumer of those events too) undoes the
    step, as if it had not started."""
    writer = state.writer
    await writer.settle()
    held = writer.take_held_events()
    if held:
        for ev in held:
            yield ev
        if state.scope.is_set:
            await _undo(state, info)
    if state.steps > 1 and state.agent.toolset.sources:  # (after the commit above: it holds the last step's end)
        await state.refresh_tools()  # an MCP server's tools may have changed, or it restarted
        request.tools = list(state.tools.schemas)
    yield {"type": "step-start", "step": state.steps, "message": state.snap(info)}


def has_tokens(u: Usage) -> bool:
    """Whether ``u`` counts any token (a zero usage is what a new message holds already)."""
    return bool(u.input_tokens or u.output_tokens or u.reasoning_tokens or u.cached_tokens or u.cache_write_tokens)


async def _undo(state: "RunState", info: AssistantMessage) -> None:
    """An abort set while the previous step's end events were handed out: the step that was
    starting is undone, as if it had not started."""
    await state.writer.p.delete_messages(state.session_id, [info.id])
    state.messages.pop()
    state.steps -= 1
    raise Aborted


def _price(state: "RunState", info: AssistantMessage, processor: StepProcessor) -> bool:
    """The model call's usage and what it cost, on its message, as soon as the reply has ended;
    whether the message now says more than the step's start wrote (tokens, or a known cost)."""
    finish = processor.finish
    if finish is None:  # (no finish event: no usage, no cost — what the start wrote)
        info.usage = Usage()
        info.cost = None
        return False
    usage = finish.usage
    cost = call_cost(state.agent.model, usage, info.time.created)
    put(info, "usage", usage)
    put(info, "cost", cost)
    return cost is not None or has_tokens(usage)


def _close_step(state: "RunState", msg: MessageWithParts, processor: StepProcessor,
                calls: list[ToolPart]) -> tuple[AssistantMessage, StepFinishPart, list[Event]]:
    """Close the step's message: its finish part, times and usage; the step end's events."""
    info: AssistantMessage = msg.info  # type: ignore[assignment]
    finish = processor.finish or FinishEvent()
    if has_tokens(info.usage):
        state.usage = state.usage + info.usage
    end = now()
    sf = StepFinishPart(id=state.ids("prt"), session_id=info.session_id, message_id=info.id,
                        reason=finish.reason, usage=finish.usage, time=end)
    msg.parts.append(sf)
    put(info, "time", MessageTime(created=info.time.created, completed=end))
    put(info, "finish_reason", finish.reason)
    state.cost = add_cost(state.cost, info.cost)
    # the last call's end state is committed with the step's end: its event waits for it (a
    # call left pending behind an approval has not changed, so it has no new event)
    events: list[Event] = ([{"type": "tool", "part": state.snap(calls[-1])}]
                           if calls and calls[-1].finished else [])
    events.append({"type": "step-finish", "step": state.steps, "message": state.snap(info),
                   "finish_reason": finish.reason, "usage": finish.usage})
    return info, sf, events

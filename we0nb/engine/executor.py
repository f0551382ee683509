"""Tool calls carried out, one at a time, in order: the actions :mod:`.recovery` decides.

The executor decides nothing: for a live step and for recovery alike it asks
:func:`~we0nb.engine.recovery.decide` what becomes of each call and carries it out —
validate, write ``running`` (the write-ahead, through :meth:`Writer.write_ahead`), run,
record; interrupt; deny; reconcile. The write-ahead is what makes resume safe: a call is
committed as ``running`` *before* its tool executes, with its idempotency key and the number
of this execution, so a crash at any instant leaves either no trace of an execution or a
``running`` part that recovery decides on. Execution itself is :meth:`ToolDefinition.call`;
this module adds the durability, the abort, the context, and the error texts the model sees.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional

from .._ids import now
from ..messages import (ToolPart, ToolStateCompleted, ToolStateError, ToolStatePending, ToolStateRunning, ToolTime,
                        put, snapshot)
from ..tools import (AnyToolDefinition, Reconciled, ToolContext, ToolError, ToolInputError, ToolOutputError,
                     ToolPolicy, ToolReturn, to_output)
from . import inflight
from .abort import Aborted
from .events import Event
from .questions import CallUpdates, unanswered
from .recovery import Situation, ToolAction, Walk, after_execution, after_reconcile, decide, interrupt_text

if TYPE_CHECKING:  # pragma: no cover
    from .output import OutputChecker
    from .state import RunState

__all__ = ["ToolExecutor", "interrupted", "denied", "key_of", "attempts_of"]


def key_of(part: ToolPart) -> str:
    """The call's idempotency key: as first written with it (derived the same way for a call
    stored before keys were written)."""
    return part.idempotency_key  # (the one reading: ToolPart, messages.py)


def attempts_of(part: ToolPart) -> int:
    """How many executions of the call have started, as the store says (0: never executed)."""
    return part.attempts


def _carried(part: ToolPart) -> dict[str, Any]:
    """What every later state of a call keeps: its key, and how many executions it had."""
    meta: dict[str, Any] = {"idempotency_key": key_of(part)}
    n = attempts_of(part)
    if n:
        meta["attempt"] = n
    return meta


def interrupted(part: ToolPart, action: ToolAction) -> ToolStateError:
    """The final state of a call stopped without a result (``action``: an interrupt)."""
    state = part.state
    reason = action.reason or "resume"
    in_doubt = bool(action.in_doubt)
    start = state.time.start if isinstance(state, ToolStateRunning) else None
    meta: dict[str, Any] = {"interrupted": True, "reason": reason, "in_doubt": in_doubt, **_carried(part)}
    questions = unanswered(state.metadata) if isinstance(state, ToolStateRunning) else None
    if questions:  # a person was asked while it ran: the question stays with the call
        meta["questions"] = questions
    if action.detail:
        meta["reconcile_reason"] = action.detail
    text = interrupt_text(reason, in_doubt, action.detail, started=isinstance(state, ToolStateRunning))
    return ToolStateError(input=state.input, error=text, metadata=meta,
                          time=ToolTime(start=start, end=now()))


def denied(part: ToolPart) -> ToolStateError:
    """The final state of a call a person denied: it never ran; the model is told why."""
    detail = part.approval_detail
    reason = detail.reason if detail is not None else None
    said = f": {reason}" if reason else ""
    return ToolStateError(
        input=part.state.input,
        error=f"Denied by a person{said}. The call was not executed.",
        metadata={"denied": True, "reason": reason, **_carried(part)},
        time=ToolTime(start=None, end=now()),
    )


class ToolExecutor:
    """Carries out the decisions on a run's tool calls (live steps, recovery). Events carry
    snapshots of the parts: states are replaced, never mutated, so a shallow copy is faithful."""

    def __init__(self, state: "RunState", output: "OutputChecker") -> None:
        self.state = state
        self.output = output
        #: the calls that wait for a person's decision (the run then ends "approval")
        self.awaiting: list[ToolPart] = []

    def _policy(self, tool: str) -> Optional[ToolPolicy]:
        return self.state.tools.policies.get(tool)

    def run_step(self, calls: list[ToolPart]) -> AsyncIterator[Event]:
        """The calls of a finished model stream, in order. The last call's end state is left
        to the step's end, which the run writes right after (one commit fewer). (Iterate it at
        once: a single call is decided when this is called — its own events, no generator
        around them.)"""
        if len(calls) == 1:
            tp = calls[0]
            self.state.scope.check()
            action, _ = decide(tp, self._policy(tp.tool), "live", Walk())
            if action.action == "execute":
                return self.execute(tp, recalled=False, defer_final=True)
            return self.carry_out(action, tp, defer_final=True)
        return self._run_calls(calls)

    async def _run_calls(self, calls: list[ToolPart]) -> AsyncIterator[Event]:
        walk, last_index = Walk(), len(calls) - 1
        for i, tp in enumerate(calls):
            self.state.scope.check()
            policy = self._policy(tp.tool)
            action, walk = decide(tp, policy, "live", walk)
            # (an execution straight to execute: one generator fewer per call)
            events = (self.execute(tp, recalled=False, defer_final=i == last_index) if action.action == "execute"
                      else self.carry_out(action, tp, defer_final=i == last_index))
            async for ev in events:
                yield ev
            walk = after_execution(walk, tp, policy) if action.action == "execute" else walk

    async def recover(self, calls: list[ToolPart], situation: Situation, *, completed: bool) -> AsyncIterator[Event]:
        """The calls of an unfinished message, in order, as recovery decides (``completed``: the
        message was closed): a ``recovery`` event per call, then its action carried out. A
        reconcile first asks, says what its answer decided in a second ``recovery`` event, and
        carries that out."""
        walk = Walk()
        for tp in calls:
            policy = self._policy(tp.tool)
            action, walk = decide(tp, policy, situation, walk, completed=completed)
            yield {"type": "recovery", "action": action.action, "part": snapshot(tp)}
            if action.action == "reconcile":
                assert policy is not None
                answer = await self.reconcile(tp, policy)
                action, walk = after_reconcile(action, answer, policy, situation, walk)
                yield {"type": "recovery", "action": action.action, "part": snapshot(tp)}
                if action.action == "complete":
                    tp.state = _reconciled(tp, answer)
                    await self.state.writer.write(None, tp)
                    yield {"type": "tool", "part": snapshot(tp)}
                    continue
            elif action.action == "recall" and policy is not None and policy.idempotent and tp.state.status == "running":
                # (its service deduplicates on the key, but not every one a call still in flight: let it land)
                await self.state.scope.wait(inflight.settled(self.state.session_id, tp.id, policy.reconcile_timeout))
            async for ev in self.carry_out(action, tp):
                yield ev
            if action.action in ("recall", "execute"):
                walk = after_execution(walk, tp, policy)

    async def carry_out(self, action: ToolAction, tp: ToolPart, *, defer_final: bool = False) -> AsyncIterator[Event]:
        """Do what ``action`` says to ``tp`` (keep and reconcile need nothing here)."""
        writer = self.state.writer
        kind = action.action
        if kind == "await":
            if tp.awaiting_approval:
                self.awaiting.append(tp)
        elif kind in ("interrupt", "deny"):
            tp.state = interrupted(tp, action) if kind == "interrupt" else denied(tp)
            if defer_final:
                writer.mark(tp)
                return
            await writer.write(None, tp)
            yield {"type": "tool", "part": self.state.snap(tp)}
        elif kind in ("recall", "execute"):
            async for ev in self.execute(tp, recalled=kind == "recall", defer_final=defer_final):
                yield ev

    async def execute(self, tp: ToolPart, *, recalled: bool, defer_final: bool = False) -> AsyncIterator[Event]:
        """Run one call: validate, write ``running`` (write-ahead), run, write the end state.

        With ``defer_final`` the end state is only marked: the caller's next write (the
        step's end, at once) commits it.
        """
        state = self.state
        raw = tp.state.raw if isinstance(tp.state, ToolStatePending) else None
        meta: dict[str, Any] = _carried(tp)
        if recalled:
            meta["recalled"] = True
        detail = tp.approval_detail if tp.approval == "approved" else None
        if detail is not None and detail.input is not None:
            # a person corrected the arguments: those run, the model's own are kept
            meta["original_input"] = detail.original_input
            if isinstance(tp.state, ToolStatePending):
                tp.state = ToolStatePending(input=detail.input, metadata=tp.state.metadata)
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
                meta["attempt"] = attempts_of(tp) + 1
                put(tp, "state", ToolStateRunning(input=tp.state.input, time=ToolTime(start=now()), metadata=meta))
                # durability point: the write-ahead, with the key and the attempt, before the tool runs
                await state.writer.write_ahead(tp, wait=definition.policy.side_effects)
                yield {"type": "tool", "part": state.snap(tp)}
                state.scope.check()
                if definition.reports_updates:
                    async for ev in self._watched(definition, kwargs, tp, meta):
                        yield ev
                else:
                    put(tp, "state", await self._run(definition, kwargs, tp, meta))
        if defer_final:
            state.writer.mark(tp)
            return
        await state.writer.write(None, tp)
        yield {"type": "tool", "part": state.snap(tp)}

    def context(self, tp: ToolPart, attempt: int, updates: Optional[CallUpdates] = None) -> ToolContext:
        return ToolContext(session_id=tp.session_id, call_id=tp.call_id, tool=tp.tool,
                           idempotency_key=key_of(tp), attempt=attempt, updates=updates)

    async def _watched(self, definition: AnyToolDefinition, kwargs: dict[str, Any], tp: ToolPart,
                       meta: dict[str, Any]) -> AsyncIterator[Event]:
        """Run a tool that reports updates (:mod:`.questions`): in a task of its own, each update
        shown as a ``tool`` event (a question written durably first); its final state in ``tp``."""
        state = self.state
        updates = CallUpdates(tp, meta, state.agent.persistence, state.writer)
        job = asyncio.ensure_future(definition.call(kwargs, self.context(tp, meta["attempt"], updates)))
        job.add_done_callback(updates.poke)
        try:
            while True:
                state.scope.check()  # (an abort while the last update was shown: it was not blocked then)
                if not await state.scope.wait(updates.watch(job)):
                    break
                await updates.take()
                yield {"type": "tool", "part": state.snap(tp)}
        except BaseException:
            if not job.done():  # an abort (or the run cancelled): the call is cancelled at once
                job.cancel()
                await asyncio.wait({job}, timeout=1.0)
            raise
        finally:
            updates.close()
        tp.state = await self._run(definition, kwargs, tp, meta, job)

    async def _run(self, definition: AnyToolDefinition, kwargs: dict[str, Any], tp: ToolPart,
                   meta: dict[str, Any], job: Optional["asyncio.Future[Any]"] = None) -> Any:
        """Execute the tool (an abort cancels it at once), or take the result of ``job`` (it ran
        in a task of its own); its final state."""
        running = tp.state
        assert isinstance(running, ToolStateRunning)
        inp, start = running.input, running.time.start
        scope = self.state.scope
        try:
            if job is not None:
                result = job.result()
            else:
                context = self.context(tp, meta["attempt"]) if definition.wants_context else None
                result = await scope.wait(definition.call(kwargs, context, self._thread_end(definition, tp)))
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
        return completed_state(inp, result, meta, start)

    def _thread_end(self, definition: AnyToolDefinition, tp: ToolPart) -> Optional[Callable[[], None]]:
        """For a sync tool: registered as running in this process until its thread returns (see
        :mod:`.inflight`: an abort stops the wait for it, not the thread)."""
        if definition.is_async:
            return None
        sid = self.state.session_id
        done = inflight.begin(sid, tp.id)
        return lambda: inflight.end(sid, tp.id, done)

    async def reconcile(self, tp: ToolPart, policy: ToolPolicy) -> Reconciled:
        """Ask the tool's reconcile whether the ``running`` call ran. Whatever goes wrong — it
        raises, takes longer than ``reconcile_timeout``, returns something else — is an
        ``unknown`` answer with the reason, never a failed run. An abort cancels it at once."""
        fn = policy.reconcile
        assert fn is not None
        ctx = self.context(tp, max(attempts_of(tp), 1))
        scope = self.state.scope
        if not await scope.wait(inflight.settled(self.state.session_id, tp.id, policy.reconcile_timeout)):
            return Reconciled.unknown("its execution in this process was still running (the abort stopped "
                                      "the wait for it, not its thread)")
        try:
            if inspect.iscoroutinefunction(fn):
                pending: Any = fn(ctx, dict(tp.state.input))
            else:
                pending = asyncio.to_thread(fn, ctx, dict(tp.state.input))
            answer = await scope.wait(asyncio.wait_for(pending, policy.reconcile_timeout))
            if inspect.isawaitable(answer):  # (a sync function that returned a coroutine)
                answer = await scope.wait(asyncio.wait_for(answer, policy.reconcile_timeout))
        except asyncio.CancelledError:
            if scope.cancelled_by_us() or _task_cancelling():
                raise
            return Reconciled.unknown("the reconcile was cancelled")
        except asyncio.TimeoutError:
            return Reconciled.unknown(f"the reconcile took longer than {policy.reconcile_timeout:g} s")
        except Exception as e:
            return Reconciled.unknown(f"the reconcile raised {type(e).__name__}: {e}" if str(e)
                                      else f"the reconcile raised {type(e).__name__}")
        if not isinstance(answer, Reconciled):
            return Reconciled.unknown(f"the reconcile returned {type(answer).__name__}, not Reconciled.done(output), "
                                      ".not_done() or .unknown(reason)")
        return answer


def completed_state(inp: dict[str, Any], result: Any, meta: dict[str, Any], start: Optional[float]) -> Any:
    """A tool's return value as the call's completed state (attachments kept beside the output)."""
    attachments: list[Any] = []
    if type(result) is ToolReturn:
        if result.metadata:
            dropped = _unstorable(result.metadata)
            meta = {**meta, "output_error": dropped} if dropped else {**meta, **result.metadata}
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


def _unstorable(metadata: Any) -> Optional[str]:
    """Why a ``ToolReturn``'s metadata cannot be stored (not JSON), or None: the call ran, so its
    output is kept and the metadata left out, saying so (a failed commit would end the run)."""
    try:
        to_output(dict(metadata))
    except (ToolOutputError, TypeError, ValueError) as e:
        return f"the metadata the tool returned was left out: {e}"
    return None


def _reconciled(tp: ToolPart, answer: Reconciled) -> Any:
    """The completed state of a call its reconcile found done: its output as the tool's would be."""
    start = tp.state.time.start if isinstance(tp.state, ToolStateRunning) else None
    return completed_state(dict(tp.state.input), answer.output, {**_carried(tp), "reconciled": True}, start)


def _task_cancelling() -> bool:
    """Whether the current task has a pending cancel request (someone else cancelled the run)."""
    task: Optional[asyncio.Task[Any]] = asyncio.current_task()
    return bool(task.cancelling()) if task is not None else True

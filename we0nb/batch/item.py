"""One run of one batch item: the engine's own prompt or resume, and how it ended.

An item's first run is a ``mode="prompt"`` run with its messages; every later run (after an
abort, a crash, a decided approval, a retry) is a ``mode="resume"`` run of its session, so
the engine's recovery decides what happens to an unfinished tool call: a read-only one is
run again, one with side effects is interrupted — never repeated. Nothing here re-executes
anything by itself.

The counts (steps, tool calls, tokens) are the session's totals: taken from the run's
events when the run was the item's whole history (its first run, ended normally), else
counted from the persisted transcript, so they always agree with the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pydantic_core import PydanticSerializationError, to_jsonable_python

from .._ids import now
from ..errors import LeaseLostError, ModelProviderError, PersistenceError, SessionBusyError
from ..engine.request import RunRequest
from ..engine.run import Run, RunOptions
from ..messages import AssistantMessage, Session, Transcript
from ..persistence.base import Lease
from ..persistence.batches import BatchItem, BatchQueue, ItemEnd
from .prompts import prompt_messages

__all__ = ["ItemOutcome", "Ready", "prepare", "reserve", "give_back", "run_item", "released", "wait_released",
           "RATE_LIMITED"]

log = logging.getLogger("we0nb.batch")

#: the error text prefix of an item put back because its provider asked to slow down
RATE_LIMITED = "rate limited"


@dataclass
class ItemOutcome:
    """What the runner needs to know beyond the :class:`ItemEnd` it writes."""

    end: ItemEnd
    rate_limited: bool = False
    busy: bool = False
    error: Optional[BaseException] = field(default=None, repr=False)
    #: the run's lease release under way (a pipelined run's: see :class:`~we0nb.engine.run.Run`):
    #: the runner sends the item's end with it, then waits for it (:func:`released`)
    release: Optional["asyncio.Future[None]"] = field(default=None, repr=False)


async def released(outcome: ItemOutcome) -> None:
    """Wait for the run's lease release (a failure is logged: the lease then expires by itself)."""
    if outcome.release is not None:
        await wait_released(outcome.release)


async def wait_released(release: "asyncio.Future[None]") -> None:
    """Wait for a pipelined run's lease release, never cancelling it; a failure is logged."""
    try:
        await asyncio.shield(release)
    except Exception as e:
        log.warning("could not release the lease of a batch item's session (it expires by itself): %s: %s",
                    type(e).__name__, e)


@dataclass
class _Counts:
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class Ready:
    """A claimed item's run request, and — when taken ahead (:func:`reserve`) — its session's
    lease with the session as read then, which the run starts from."""

    item: BatchItem
    request: RunRequest
    held: Optional[tuple[Lease, Optional[Session]]] = None


async def prepare(agent: Any, it: BatchItem, stop: asyncio.Event) -> Ready:
    """The run ``it`` needs: its prompt on the first attempt (or on a session a crashed attempt
    left empty), else a resume of its session."""
    if it.attempts > 1 and (await agent.persistence.load_transcript(it.session_id)).messages:
        return Ready(it, agent.build_request(abort=stop, mode="resume", session_id=it.session_id))
    return Ready(it, agent.build_request(abort=stop, mode="prompt", session_id=it.session_id,
                                         messages=prompt_messages(it.prompt)))


async def reserve(agent: Any, it: BatchItem, stop: asyncio.Event) -> "Ready | BatchItem":
    """``it`` made ready with its session's lease held, or ``it`` as it was when that fails (a
    busy session, a database error): its run then meets the failure again, and ends as usual."""
    try:
        ready = await prepare(agent, it, stop)
        ready.held = await agent.persistence.lease_and_session(it.session_id, ready.request.run_id)
    except Exception as e:
        log.debug("batch item %d could not be made ready ahead (its run tries again): %s: %s",
                  it.item, type(e).__name__, e)
        return it
    return ready


async def give_back(store: BatchQueue, name: str, owner: str, taken: "Ready | BatchItem") -> None:
    """Give back an item claimed ahead that no run started: its lease, and the claim itself
    (the item is as before, its attempt returned)."""
    it = taken.item if isinstance(taken, Ready) else taken
    try:
        if isinstance(taken, Ready) and taken.held is not None:
            await taken.held[0].release()
    finally:
        await store.end_batch_item(name, it.item, owner, _given_back(it))


async def run_item(agent: Any, taken: "Ready | BatchItem", stop: asyncio.Event, *, own_sessions: bool,
                   backoff: float, after_last_call: Optional[Callable[[], None]] = None,
                   on_cost: Optional[Callable[[str, Optional[float], bool], None]] = None) -> ItemOutcome:
    """Run an item claimed by the caller (made ready ahead, or not yet) until its turn ends,
    fails or ``stop`` is set. The outcome's ``release`` is the caller's to wait for
    (:func:`released`); ``after_last_call`` is the run's (:class:`~we0nb.engine.run.Run`);
    ``on_cost`` is told each model call's cost (its message's id, the cost, whether the message is
    in the store yet) as its message is persisted — and the last call's once more before
    ``after_last_call``, which comes before that message's write (the caller may decide on the
    next item then): told not yet written."""
    t0 = time.monotonic()
    ready = taken if isinstance(taken, Ready) else await prepare(agent, taken, stop)
    it, request = ready.item, ready.request
    last_call = after_last_call if on_cost is None else _telling(lambda: run, on_cost, after_last_call)

    # (it reads each event once, and nobody watches it live)
    run = Run(agent, request, structured=agent.output_type is not None,
              options=RunOptions(live_parts=True, pipelined=True, after_last_call=last_call, held=ready.held))
    try:
        outcome = await _outcome(agent, it, run, t0, stop, clean=request.mode == "prompt" and own_sessions,
                                 backoff=backoff, on_cost=on_cost)
    except BaseException:
        if run.released is not None:  # (the batch was cancelled: released before it goes)
            await wait_released(run.released)
        raise
    outcome.release = run.released
    return outcome


def _telling(run: Callable[[], Run], on_cost: Callable[[str, Optional[float], bool], None],
             then: Optional[Callable[[], None]]) -> Callable[[], None]:
    """``after_last_call`` telling ``on_cost`` the last call's cost first (its message is written after)."""
    def last_call() -> None:
        last = next((m.info for m in reversed(run().state.messages) if isinstance(m.info, AssistantMessage)), None)
        if last is not None:
            on_cost(last.id, last.cost, False)
        if then is not None:
            then()

    return last_call


async def _outcome(agent: Any, it: BatchItem, run: Run, t0: float, stop: asyncio.Event, *, clean: bool,
                   backoff: float, on_cost: Optional[Callable[[str, Optional[float], bool], None]] = None) -> ItemOutcome:
    """Run ``run`` to its end; how the item ended (``clean``: a prompt run on a session the batch
    made, whose counts its events give)."""
    output_tool = agent.output_tool_name if agent.output_type is not None else None
    counts, seen_tools = _Counts(), set()
    started = False
    try:
        async for ev in run.events():
            if ev["type"] == "start":
                started = True
            elif ev["type"] == "step-start":
                counts.steps += 1
            elif ev["type"] == "tool":
                part = ev["part"]
                if part.tool != output_tool:
                    seen_tools.add(part.id)
            elif ev["type"] == "step-finish":
                counts.input_tokens += ev["usage"].input_tokens
                counts.output_tokens += ev["usage"].output_tokens
                if on_cost is not None:
                    on_cost(ev["message"].id, ev["message"].cost, True)  # (its event follows its commit)
            elif ev["type"] == "compaction" and on_cost is not None:
                on_cost(ev["message"].id, ev["message"].cost, True)
    except asyncio.CancelledError:
        if not stop.is_set():
            raise  # the batch itself was cancelled: the runner gives the claim back
        if not started:
            return ItemOutcome(_given_back(it))
        return ItemOutcome(await _ended(agent, it, "aborted", t0, queued=True))
    except LeaseLostError as e:  # another run took the session over: let the batch look again later
        return ItemOutcome(await _ended(agent, it, "aborted", t0, queued=True, error=e, not_before=backoff), error=e)
    except SessionBusyError as e:  # another run (not this batch's) holds the session: later
        return ItemOutcome(_given_back(it, not_before=backoff), busy=True, error=e)
    except ModelProviderError as e:
        if e.status_code == 429 or e.retryable:  # the provider asks to slow down: not a failure
            return ItemOutcome(await _ended(agent, it, "aborted", t0, queued=True, not_before=backoff,
                                            error=e, prefix=RATE_LIMITED), rate_limited=True, error=e)
        return ItemOutcome(await _ended(agent, it, "failed", t0, error=e), error=e)
    except PersistenceError:  # the store failed (a full disk…), not the item: the batch stops with it,
        raise  # the item stays claimed and a later batch() takes it up again
    except Exception as e:  # a model or tool failure: this item failed, the batch goes on
        return ItemOutcome(await _ended(agent, it, "failed", t0, error=e), error=e)
    result = run.result
    assert result is not None
    clean = clean and it.attempts == 1 and result.result != "compact"
    counts.tool_calls = len(seen_tools)
    return ItemOutcome(await _ended(agent, it, result.result, t0, counts=counts if clean else None,
                                    text=result.text, output=_json(result.output)))


async def _ended(agent: Any, it: BatchItem, status: str, t0: float, *, queued: bool = False,
                 counts: Optional[_Counts] = None, text: Optional[str] = None, output: Optional[str] = None,
                 error: Optional[BaseException] = None, not_before: float = 0.0, prefix: str = "") -> ItemEnd:
    if counts is None:
        counts = _count(await agent.persistence.load_transcript(it.session_id),
                        agent.output_tool_name if agent.output_type is not None else None)
    message = None
    if error is not None:
        message = f"{type(error).__name__}: {error}"
        if prefix:
            message = f"{prefix}: {message}"
    end_time = now()
    return ItemEnd(status=status, queued=queued, finished=end_time, run_time=time.monotonic() - t0,
                   attempts=it.attempts, started=it.started, not_before=end_time + not_before if not_before else 0.0,
                   text=text, output=output, error=message, steps=counts.steps, tool_calls=counts.tool_calls,
                   input_tokens=counts.input_tokens, output_tokens=counts.output_tokens)


def _given_back(it: BatchItem, not_before: float = 0.0) -> ItemEnd:
    """A claim whose run never started: the item is as before the claim (its attempt returned)."""
    attempts = it.attempts - 1
    return ItemEnd(status="pending" if attempts == 0 else "aborted", queued=True, finished=it.finished,
                   attempts=attempts, started=it.started if attempts else None,
                   not_before=now() + not_before if not_before else 0.0, text=it.text, output=it.output,
                   error=it.error, steps=it.steps, tool_calls=it.tool_calls, input_tokens=it.input_tokens,
                   output_tokens=it.output_tokens)


def _count(tr: Transcript, output_tool: Optional[str]) -> _Counts:
    c = _Counts()
    for m in tr.messages:
        info = m.info
        if not isinstance(info, AssistantMessage):
            continue
        if not m.is_summary:
            c.steps += 1
        c.input_tokens += info.usage.input_tokens
        c.output_tokens += info.usage.output_tokens
        c.tool_calls += sum(1 for p in m.tool_parts if p.tool != output_tool)
    return c


def _json(value: Any) -> Optional[str]:
    """A structured output as the batch stores it: a model's own JSON; any other type (a dataclass,
    a TypedDict, a list of models) as the JSON pydantic makes of it; what it cannot, as text."""
    if value is None:
        return None
    dump = getattr(value, "model_dump_json", None)
    if dump is not None:
        return dump()
    try:
        return json.dumps(to_jsonable_python(value), ensure_ascii=False)
    except (PydanticSerializationError, TypeError, ValueError):
        pass
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return json.dumps(repr(value))

"""Offline models: :class:`ScriptedModel` plays a script, :class:`FunctionModel` asks a function.

Every notebook, test and Binder demo runs on these, without a key or a network.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Union

from pydantic import BaseModel

from .._ids import new_id
from ..errors import ScriptExhaustedError
from ..messages import Usage
from .base import (
    FinishEvent,
    Model,
    ModelEvent,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)

__all__ = [
    "ScriptItem",
    "text",
    "reasoning",
    "tool_call",
    "output",
    "usage",
    "fail",
    "ScriptedModel",
    "FunctionModel",
]

DEFAULT_OUTPUT_TOOL = "final_result"
_WORDS = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class _Text:
    deltas: tuple[str, ...]


@dataclass(frozen=True)
class _Reasoning:
    deltas: tuple[str, ...]


@dataclass(frozen=True)
class _ToolCall:
    name: str
    input: Union[dict[str, Any], str]
    call_id: Optional[str] = None


@dataclass(frozen=True)
class _Output:
    value: Any


@dataclass(frozen=True)
class _Usage:
    usage: Usage


@dataclass(frozen=True)
class _Fail:
    error: BaseException


ScriptItem = Union[_Text, _Reasoning, _ToolCall, _Output, _Usage, _Fail]


def _split(content: Union[str, Sequence[str]]) -> tuple[str, ...]:
    if isinstance(content, str):
        return tuple(_WORDS.findall(content)) or ("",)
    deltas = tuple(content) if isinstance(content, (list, tuple)) else None
    if deltas is None or not all(isinstance(d, str) for d in deltas):
        raise TypeError(f"text()/reasoning(): expected a string or a list of string deltas, got {content!r:.80}.")
    return deltas


def text(content: Union[str, Sequence[str]]) -> ScriptItem:
    """Streamed text: a string (sent word by word) or an explicit list of deltas."""
    return _Text(_split(content))


def reasoning(content: Union[str, Sequence[str]]) -> ScriptItem:
    """Streamed reasoning ("thinking") text."""
    return _Reasoning(_split(content))


def tool_call(name: str, input: Union[dict[str, Any], str, None] = None, *, call_id: Optional[str] = None) -> ScriptItem:
    """A tool call; ``input`` is the arguments dict (or raw JSON text, to test bad input)."""
    if not isinstance(name, str) or not name:
        raise TypeError("tool_call(): name must be a non-empty string.")
    return _ToolCall(name, {} if input is None else input, call_id)


def output(value: Any) -> ScriptItem:
    """The structured output (a pydantic object or a dict); a valid one ends the turn."""
    return _Output(value)


def usage(input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0, cached_tokens: int = 0,
          cache_write_tokens: int = 0) -> ScriptItem:
    """Token usage reported with the step's finish (drives compaction and prices in tests)."""
    return _Usage(Usage(input_tokens=input_tokens, output_tokens=output_tokens, reasoning_tokens=reasoning_tokens,
                        cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens))


def fail(error: BaseException) -> ScriptItem:
    """Raise ``error`` at this point of the stream (a provider failing mid-step)."""
    return _Fail(error)


async def _play(items: Sequence[ScriptItem], request: ModelRequest, delay: float) -> AsyncIterator[ModelEvent]:
    has_calls = False
    step_usage = Usage()
    for item in items:
        if isinstance(item, _Text):
            for d in item.deltas:
                if delay:
                    await asyncio.sleep(delay)
                yield TextDelta(d)
        elif isinstance(item, _Reasoning):
            for d in item.deltas:
                if delay:
                    await asyncio.sleep(delay)
                yield ReasoningDelta(d)
        elif isinstance(item, _ToolCall):
            if delay:
                await asyncio.sleep(delay)
            has_calls = True
            yield ToolCallEvent(item.call_id or new_id("call"), item.name, item.input)
        elif isinstance(item, _Output):
            if delay:
                await asyncio.sleep(delay)
            value = item.value
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json")
            if request.output_mode in ("native", "prompted"):  # the answer is the reply's text
                yield TextDelta(json.dumps(value))
                continue
            has_calls = True
            yield ToolCallEvent(new_id("call"), request.output_tool or DEFAULT_OUTPUT_TOOL, value)
        elif isinstance(item, _Usage):
            step_usage = step_usage + item.usage
        elif isinstance(item, _Fail):
            raise item.error
        else:
            raise TypeError(
                f"Unknown script item {item!r}: build items with text(), reasoning(), tool_call(), "
                "output(), usage() or fail()."
            )
    yield FinishEvent("tool-calls" if has_calls else "stop", step_usage)


class ScriptedModel(Model):
    """Plays ``steps``: one list of items per model call, in order.

    ``delay`` (seconds) is slept before each delta, to make a run slow enough to abort.
    ``requests`` lists every :class:`ModelRequest` received. Its provider is ``"we0nb"``
    (no price is known) unless ``provider=`` names one, priced by ``model_id``; ``price=(usd
    per million input tokens, usd per million output tokens)`` gives it one (stored now;
    the cost is computed later, SPEC §13).
    """

    def __init__(self, steps: Sequence[Sequence[ScriptItem]], delay: float = 0.0, *,
                 model_id: str = "scripted", context_window: Optional[int] = None,
                 provider: Optional[str] = None, price: Any = None):
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
            raise TypeError("ScriptedModel(steps): expected a list with one list of items per model call.")
        norm: list[list[ScriptItem]] = []
        for i, step in enumerate(steps):
            if isinstance(step, (_Text, _Reasoning, _ToolCall, _Output, _Usage, _Fail)):
                step = [step]
            if isinstance(step, (str, bytes)) or not isinstance(step, Sequence):
                raise TypeError(f"ScriptedModel: step {i} must be a list of items (text(), tool_call(), ...).")
            norm.append(list(step))
        if not isinstance(delay, (int, float)) or delay < 0:
            raise ValueError("ScriptedModel: delay must be a number of seconds >= 0.")
        self._set_pricing(provider, price)
        self.steps = norm
        self.delay = float(delay)
        self.model_id = model_id
        self.context_window = context_window
        self.requests: list[ModelRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        index = len(self.requests)
        if index >= len(self.steps):
            raise ScriptExhaustedError(
                f"ScriptedModel was called {index + 1} times but has only {len(self.steps)} scripted "
                "step(s). Add a step for every model call the run makes."
            )
        self.requests.append(request)
        return _play(self.steps[index], request, self.delay)


class FunctionModel(Model):
    """A model whose reply a function decides.

    ``function(request)`` returns a list of script items (or an awaitable of one, or an
    async iterator of items). ``requests`` lists every request received — unless
    ``keep_requests=False``, for long batches: each request holds its run's whole history, and
    kept they would stay in memory (and in every full collection of the garbage collector)
    until the model is dropped. ``provider`` and ``price``: as for :class:`ScriptedModel`.
    """

    def __init__(self, function: Callable[[ModelRequest], Any], *, delay: float = 0.0,
                 model_id: str = "function", context_window: Optional[int] = None,
                 keep_requests: bool = True, provider: Optional[str] = None, price: Any = None):
        if not callable(function):
            raise TypeError("FunctionModel(function): expected a callable taking a ModelRequest.")
        self._set_pricing(provider, price)
        self.function = function
        self.delay = float(delay)
        self.model_id = model_id
        self.context_window = context_window
        self.keep_requests = bool(keep_requests)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if self.keep_requests:
            self.requests.append(request)
        reply = self.function(request)
        if inspect.isawaitable(reply):
            reply = await reply
        if hasattr(reply, "__aiter__"):
            reply = [item async for item in reply]
        if isinstance(reply, (_Text, _Reasoning, _ToolCall, _Output, _Usage, _Fail)):
            reply = [reply]
        if isinstance(reply, str):
            reply = [text(reply)]
        if not hasattr(reply, "__iter__") or isinstance(reply, (bytes, dict)):
            raise TypeError(f"FunctionModel: the function returned {type(reply).__name__}; return a string, a "
                            "script item (text(), tool_call(), output() ...), a list (or iterator) of them, an "
                            "awaitable of one, or an async iterator of items.")
        async for event in _play(list(reply), request, self.delay):
            yield event

"""OpenAIChatModel: any OpenAI-compatible chat-completions server, through the official client.

Works with OpenAI, vLLM, Ollama, llama.cpp's server, LM Studio, DeepSeek and other servers
that speak ``POST /v1/chat/completions`` with ``stream=True``. Install the extra:
``pip install 'we0nb[openai]'``.

How the stream maps onto the model port:

* ``delta.content`` → :class:`TextDelta`; ``delta.reasoning_content`` / ``delta.reasoning``
  (vLLM, Ollama, DeepSeek, LM Studio …) → :class:`ReasoningDelta`;
* ``delta.tool_calls`` pieces are joined per ``index`` (the id and name arrive once, the
  JSON arguments in fragments, several calls per step); each call is emitted as a
  :class:`ToolCallEvent` when the step's ``finish_reason`` arrives, in index order. The
  arguments are parsed as JSON; text that does not parse into an object is passed on raw
  (the engine then records a clear tool-input error the model can fix);
* usage (asked for with ``stream_options={"include_usage": True}``) →
  :attr:`FinishEvent.usage`; finish reasons → ``"stop"``, ``"tool-calls"``, ``"length"``,
  ``"content-filter"`` (others pass through with ``_`` → ``-``).

Errors:

* 401/403 → :class:`~we0nb.errors.ModelAuthenticationError` (never retried);
* 408, 409, 429, 5xx and connection failures → retried here (the client's own retries
  are off) up to ``max_retries`` times with exponential backoff, honouring
  ``Retry-After`` / ``retry-after-ms`` — but only while nothing has been streamed yet;
  a ``Retry-After`` longer than ``max_retry_after`` is not waited for;
* a request too large for the context window → :class:`~we0nb.errors.ContextWindowExceeded`
  (the engine compacts the history);
* a stream that breaks off, a chunk that is not JSON, or a stream that ends without a
  finish reason → :class:`~we0nb.errors.ModelProviderError`. The engine records every
  error on the assistant message and leaves it unfinished, so ``mode="resume"`` continues.

Abort: the engine cancels the pending read and closes this generator; its ``finally``
closes the HTTP response at once, so the server sees the connection go away.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional

from .._extras import require
from .._ids import new_id
from ..errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError
from ..messages import Usage
from .base import (
    AssistantTurn,
    FinishEvent,
    Model,
    ModelEvent,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
    ToolResult,
    UserTurn,
)

_openai: Any = None


def _sdk() -> Any:
    """The official openai package, imported on first use (a clear error without the extra)."""
    global _openai
    if _openai is None:
        _openai = require("openai", "OpenAIChatModel", "openai")
    return _openai

__all__ = ["OpenAIChatModel", "to_openai_messages", "to_openai_tools", "is_context_length_error"]

_RESERVED = ("model", "messages", "stream", "stream_options", "tools")
_FINISH = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}
_RETRY_STATUS = (408, 409, 429)
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded",
                  "string_above_max_length"}
_CONTEXT_TEXT = re.compile(
    r"context[ _-]?(length|window|size)|maximum context|too many tokens|prompt is too long|"
    r"input is too long|exceeds? the (available )?context|reduce the length of the messages",
    re.IGNORECASE,
)


# --------------------------------------------------------------------------- request mapping


def to_openai_messages(request: ModelRequest, *, send_reasoning: bool = False) -> list[dict[str, Any]]:
    """The request's history as chat-completions messages (system prompt first)."""
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for m in request.messages:
        if isinstance(m, UserTurn):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, AssistantTurn):
            msg: dict[str, Any] = {"role": "assistant", "content": m.text if (m.text or not m.tool_calls) else None}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.call_id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.input, ensure_ascii=False)}}
                    for c in m.tool_calls
                ]
            if send_reasoning and m.reasoning:
                msg["reasoning_content"] = m.reasoning
            out.append(msg)
        elif isinstance(m, ToolResult):
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.content})
        else:  # pragma: no cover - the port has exactly three message kinds
            raise TypeError(f"OpenAIChatModel: unknown history item {m!r}.")
    return out


def to_openai_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [{"type": "function",
             "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools]


# --------------------------------------------------------------------------- stream mapping


@dataclass
class _PendingCall:
    index: int
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def event(self) -> ToolCallEvent:
        raw = "".join(self.arguments)
        value: Any
        if not raw.strip():
            value = {}
        else:
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
            if not isinstance(value, dict):
                value = raw
        return ToolCallEvent(self.call_id or new_id("call"), self.name, value)


def _get(obj: Any, name: str) -> Any:
    """A field of a chunk object, extra fields included (servers add their own)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None)
        if extra:
            value = extra.get(name)
    return value


def _usage(u: Any) -> Usage:
    def num(x: Any) -> int:
        return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0

    return Usage(
        input_tokens=num(_get(u, "prompt_tokens")),
        output_tokens=num(_get(u, "completion_tokens")),
        reasoning_tokens=num(_get(_get(u, "completion_tokens_details"), "reasoning_tokens")),
        cached_tokens=num(_get(_get(u, "prompt_tokens_details"), "cached_tokens")),
    )


class _Accumulator:
    """Turns chat-completion chunks into model events (pure: no I/O)."""

    def __init__(self) -> None:
        self.calls: dict[int, _PendingCall] = {}
        self.finish_reason: Optional[str] = None
        self.usage = Usage()
        self.emitted = False

    def feed(self, chunk: Any) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        u = _get(chunk, "usage")
        if u is not None:
            self.usage = _usage(u)  # some servers repeat a running total: keep the last
        for choice in _get(chunk, "choices") or ():
            if (_get(choice, "index") or 0) != 0:
                continue  # n > 1 is not used: only the first choice counts
            delta = _get(choice, "delta")
            if delta is not None:
                r = _get(delta, "reasoning_content")
                if r is None:
                    r = _get(delta, "reasoning")
                if isinstance(r, str) and r:
                    out.append(ReasoningDelta(r))
                c = _get(delta, "content")
                if isinstance(c, str) and c:
                    out.append(TextDelta(c))
                for tc in _get(delta, "tool_calls") or ():
                    self._tool_piece(tc)
            reason = _get(choice, "finish_reason")
            if reason and self.finish_reason is None:
                self.finish_reason = str(reason)
                out.extend(self._calls())
        return out

    def _tool_piece(self, tc: Any) -> None:
        index = _get(tc, "index")
        cid = _get(tc, "id")
        if not isinstance(index, int):
            # servers that omit the index: a new id starts a new call, otherwise continue the last
            known = next((c.index for c in self.calls.values() if cid and c.call_id == cid), None)
            if known is not None:
                index = known
            elif cid or not self.calls:
                index = len(self.calls)
            else:
                index = max(self.calls)
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = _PendingCall(index)
        if isinstance(cid, str) and cid and not call.call_id:
            call.call_id = cid
        fn = _get(tc, "function")
        name = _get(fn, "name")
        if isinstance(name, str) and name and not call.name:
            call.name = name
        args = _get(fn, "arguments")
        if isinstance(args, str) and args:
            call.arguments.append(args)
        elif isinstance(args, dict):  # a few servers send the arguments as an object
            call.arguments.append(json.dumps(args))

    def _calls(self) -> list[ModelEvent]:
        if self.emitted:
            return []
        self.emitted = True
        return [self.calls[i].event() for i in sorted(self.calls) if self.calls[i].name]

    def finish(self) -> list[ModelEvent]:
        if self.finish_reason is None:
            raise ModelProviderError(
                "The model stream ended before the model finished (no finish_reason was received): "
                "the connection was probably cut", retryable=True)
        has_calls = any(c.name for c in self.calls.values())
        reason = _FINISH.get(self.finish_reason, self.finish_reason.replace("_", "-"))
        if has_calls and reason == "stop":
            reason = "tool-calls"  # e.g. Ollama reports "stop" for a step that called tools
        return [FinishEvent(reason, self.usage)]


# --------------------------------------------------------------------------- errors


def _error_text(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        msg = body.get("message") or body.get("error") or body.get("detail")
        if isinstance(msg, dict):
            msg = msg.get("message")
        if isinstance(msg, str) and msg:
            return msg
    elif isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return str(getattr(exc, "message", None) or exc)


def is_context_length_error(exc: BaseException) -> bool:
    """Whether a provider error says the request is larger than the context window."""
    if isinstance(exc, ContextWindowExceeded):
        return True
    sdk = sys.modules.get("openai")
    if sdk is None or not isinstance(exc, sdk.APIError) or isinstance(exc, sdk.APIConnectionError):
        return False
    status = getattr(exc, "status_code", None)
    if status is not None and status not in (400, 413, 422, 500):
        return False
    code = getattr(exc, "code", None)
    etype = getattr(exc, "type", None)
    if code in _CONTEXT_CODES or etype in _CONTEXT_CODES:
        return True
    return bool(_CONTEXT_TEXT.search(_error_text(exc)))


def _retry_after(headers: Any) -> Optional[float]:
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value) / scale
        except ValueError:
            continue
        if math.isfinite(delay):
            return max(0.0, delay)
    value = headers.get("retry-after")
    if value:
        try:
            parsed = email.utils.parsedate_tz(value)
            if parsed is not None:
                return max(0.0, email.utils.mktime_tz(parsed) - time.time())
        except (TypeError, ValueError, OverflowError):
            return None
    return None


# --------------------------------------------------------------------------- the model


class OpenAIChatModel(Model):
    """An OpenAI-compatible chat-completions model, streamed through ``openai.AsyncOpenAI``.

    ``model`` is the server's model name; ``base_url`` the API root (e.g.
    ``http://localhost:11434/v1`` for Ollama, ``http://localhost:8000/v1`` for vLLM);
    ``api_key`` defaults to ``$OPENAI_API_KEY`` (local servers need none). Keywords:

    * ``context_window`` — the model's context size in tokens; compaction needs it;
    * ``max_retries`` (3), ``retry_base_delay`` (0.5 s, doubled per attempt, capped at
      ``retry_max_delay`` = 8 s) and ``max_retry_after`` (60 s) — see the module docstring;
    * ``timeout`` — seconds for the HTTP request (None: the client's default);
    * ``stream_usage`` (True) — send ``stream_options={"include_usage": True}``; turn off
      for a server that rejects it;
    * ``send_reasoning`` (False) — send earlier reasoning back as ``reasoning_content``;
    * ``client`` — an ``openai.AsyncOpenAI`` to use instead of building one (its own
      ``max_retries`` then stays as you set it);
    * any other keyword (``temperature``, ``max_completion_tokens``, ``extra_body`` …) is
      passed to ``chat.completions.create`` as is.
    """

    def __init__(self, model: str, base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 context_window: Optional[int] = None, max_retries: int = 3, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 8.0, max_retry_after: float = 60.0, timeout: Optional[float] = None,
                 stream_usage: bool = True, send_reasoning: bool = False, client: Any = None,
                 model_id: Optional[str] = None, **options: Any):
        _sdk()  # the client is an extra: a clear one-line error here rather than at the first step
        if not isinstance(model, str) or not model:
            raise TypeError("OpenAIChatModel(model): expected the model name as a non-empty string, e.g. 'gpt-4o-mini'.")
        if context_window is not None and (not isinstance(context_window, int) or context_window <= 0):
            raise ValueError("OpenAIChatModel(context_window=...): expected a positive number of tokens or None.")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError("OpenAIChatModel(max_retries=...): expected an integer >= 0.")
        for name, v in (("retry_base_delay", retry_base_delay), ("retry_max_delay", retry_max_delay),
                        ("max_retry_after", max_retry_after)):
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"OpenAIChatModel({name}=...): expected seconds >= 0.")
        bad = sorted(set(options) & set(_RESERVED))
        if bad:
            raise TypeError(f"OpenAIChatModel: {', '.join(bad)} cannot be passed as options; the model sets them.")
        if client is None:
            if api_key is None:
                api_key = os.environ.get("OPENAI_API_KEY")
            if api_key is None:
                if base_url is None and not os.environ.get("OPENAI_BASE_URL"):
                    raise ValueError(
                        "OpenAIChatModel: no API key. Pass api_key=... or set OPENAI_API_KEY; for a local "
                        "server (vLLM, Ollama, llama.cpp, LM Studio) pass base_url=... instead."
                    )
                api_key = "not-needed"  # local servers ignore it, the client wants one
        self.model = model
        self.base_url = base_url
        self.model_id = model_id or model
        self.context_window = context_window
        self.max_retries = max_retries
        self.retry_base_delay = float(retry_base_delay)
        self.retry_max_delay = float(retry_max_delay)
        self.max_retry_after = float(max_retry_after)
        self.timeout = timeout
        self.stream_usage = bool(stream_usage)
        self.send_reasoning = bool(send_reasoning)
        self.options = options
        self._api_key = api_key
        self._given_client = client
        self._client: Any = None
        self._client_loop: Any = None

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"OpenAIChatModel({self.model!r}{where})"

    # ------------------------------------------------------------------ client

    def _get_client(self) -> Any:
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        # an httpx connection pool belongs to one event loop: a new loop gets a new client
        if self._client is None or self._client_loop is not loop:
            kwargs: dict[str, Any] = {"api_key": self._api_key, "max_retries": 0}
            if self.base_url is not None:
                kwargs["base_url"] = self.base_url
            if self.timeout is not None:
                kwargs["timeout"] = self.timeout
            self._client = _sdk().AsyncOpenAI(**kwargs)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client of the current event loop (optional; it is rebuilt on use)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.close()

    # ------------------------------------------------------------------ request

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for ``request``."""
        params: dict[str, Any] = dict(self.options)
        params["model"] = self.model
        params["messages"] = to_openai_messages(request, send_reasoning=self.send_reasoning)
        params["stream"] = True
        if self.stream_usage:
            params["stream_options"] = {"include_usage": True}
        if request.tools:
            params["tools"] = to_openai_tools(request)
            if request.output_tool:
                params["tool_choice"] = "required"
        else:
            params.pop("tool_choice", None)
            params.pop("parallel_tool_calls", None)
        return params

    # ------------------------------------------------------------------ errors and retries

    def _where(self) -> str:
        return f"The model server at {self.base_url}" if self.base_url else "The OpenAI API"

    def _translate(self, exc: BaseException, produced: bool) -> BaseException:
        """A provider exception as a we0nb error with a clear message (others unchanged)."""
        where = self._where()
        if isinstance(exc, ModelProviderError):
            return exc
        if isinstance(exc, json.JSONDecodeError):
            return ModelProviderError(
                f"{where} sent a malformed stream chunk (not JSON: {exc.doc[:200]!r})", retryable=True)
        if not isinstance(exc, _sdk().APIError):
            return exc
        text = _error_text(exc)
        status = getattr(exc, "status_code", None)
        if is_context_length_error(exc):
            return ContextWindowExceeded(
                f"The request is larger than the context window of {self.model!r} "
                f"({where[0].lower()}{where[1:]} said: {text})", status_code=status)
        if isinstance(exc, _sdk().AuthenticationError):
            return ModelAuthenticationError(
                f"{where} refused the API key (HTTP 401: {text}); pass a valid api_key=... to "
                "OpenAIChatModel or set OPENAI_API_KEY", status_code=401)
        if isinstance(exc, _sdk().PermissionDeniedError):
            return ModelAuthenticationError(
                f"{where} denied access (HTTP 403: {text}); check that this API key may use model "
                f"{self.model!r}", status_code=403)
        if isinstance(exc, _sdk().APIConnectionError):
            low = where[0].lower() + where[1:]
            cause = exc.__cause__
            detail = f"{type(cause).__name__}: {cause}" if cause is not None and str(cause) else text
            if produced:
                return ModelProviderError(f"The stream from {low} broke off mid-way ({detail})", retryable=True)
            return ModelProviderError(f"Cannot reach {low} ({detail})", retryable=True)
        if status is not None:
            retryable = status in _RETRY_STATUS or status >= 500
            return ModelProviderError(f"{where} answered HTTP {status}: {text}", status_code=status,
                                      retryable=retryable)
        return ModelProviderError(f"{where} reported an error in the stream: {text}", retryable=True)

    def _retry_delay(self, exc: BaseException, attempt: int) -> Optional[float]:
        """Seconds to wait before trying again, or None when ``exc`` is not worth retrying."""
        if attempt >= self.max_retries:
            return None
        if isinstance(exc, _sdk().APIStatusError):
            status = exc.status_code
            if not (status in _RETRY_STATUS or status >= 500) or is_context_length_error(exc):
                return None
            if getattr(exc, "code", None) == "insufficient_quota":
                return None  # a quota, not a rate: waiting does not help
            hint = exc.response.headers.get("x-should-retry")
            if hint == "false":
                return None
            after = _retry_after(exc.response.headers)
            if after is not None:
                return after if after <= self.max_retry_after else None
        elif not isinstance(exc, _sdk().APIConnectionError):
            return None
        backoff = min(self.retry_base_delay * (2 ** attempt), self.retry_max_delay)
        return backoff * (1 - 0.25 * random.random())

    # ------------------------------------------------------------------ the stream

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:  # type: ignore[override]
        client = self._get_client()
        params = self.request_params(request)
        attempt = 0
        while True:
            produced = False
            response = None
            delay: Optional[float] = None
            try:
                response = await client.chat.completions.create(**params)
                acc = _Accumulator()
                while True:
                    try:
                        chunk = await response.__anext__()
                    except StopAsyncIteration:
                        break
                    for ev in acc.feed(chunk):
                        produced = True
                        yield ev
                for ev in acc.finish():
                    yield ev
                return
            except Exception as exc:
                if not produced:
                    delay = self._retry_delay(exc, attempt)
                if delay is None:
                    err = self._translate(exc, produced)
                    if err is exc:
                        raise
                    if attempt and isinstance(err, ModelProviderError):
                        err.args = (f"{err.args[0]} (gave up after {attempt} retr{'y' if attempt == 1 else 'ies'})",)
                    raise err from exc
            finally:
                if response is not None:
                    # closes the HTTP response at once: on abort the server sees the disconnect
                    await response.close()
            attempt += 1
            await asyncio.sleep(delay)

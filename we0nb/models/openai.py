"""OpenAIChatModel: any OpenAI-compatible chat-completions server, through the official client.

Works with OpenAI, vLLM, Ollama, llama.cpp's ``llama-server``, llama-cpp-python's server,
LM Studio, DeepSeek and other servers that speak ``POST /v1/chat/completions`` with
``stream=True``. Install the extra: ``pip install 'we0nb[openai]'``.

The wire format lives in :mod:`we0nb.models.openai_wire`, the meaning of errors and the
retry rules in :mod:`we0nb.models.openai_errors`; this module is the adapter: it builds
the request, streams it, retries what may succeed next time, and closes the HTTP response
at once when the engine closes the stream (an abort), so the server sees the client go.

Every error is recorded by the engine on the assistant message, which stays unfinished,
so ``mode="resume"`` continues.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator, Callable, Optional, Union

from .._extras import require
from ..errors import ContextWindowExceeded, ModelProviderError
from .base import Model, ModelEvent, ModelRequest, OutputMode
from .openai_errors import RetryPolicy, is_context_length_error, translate
from .openai_wire import ChunkAccumulator, NativeFormat, response_format, to_openai_messages, to_openai_tools

_openai: Any = None


def _sdk() -> Any:
    """The official openai package, imported on first use (a clear error without the extra)."""
    global _openai
    if _openai is None:
        _openai = require("openai", "OpenAIChatModel", "openai")
    return _openai


__all__ = ["OpenAIChatModel", "to_openai_messages", "to_openai_tools", "is_context_length_error", "ToolChoice"]

#: a ``tool_choice`` value, or a function of the request returning one (None: not sent)
ToolChoice = Union[str, dict, Callable[[ModelRequest], Any], None]

_RESERVED = ("model", "messages", "stream", "stream_options", "tools")
_CHOICES = ("auto", "none", "required")
_MODES = ("tool", "native", "prompted")
_FORMATS = ("json_schema", "json_object")


class OpenAIChatModel(Model):
    """An OpenAI-compatible chat-completions model, streamed through ``openai.AsyncOpenAI``.

    ``model`` is the server's model name; ``base_url`` the API root (e.g.
    ``http://localhost:11434/v1`` for Ollama, ``http://localhost:8000/v1`` for vLLM);
    ``api_key`` defaults to ``$OPENAI_API_KEY`` (local servers need none). Keywords:

    * ``context_window`` — the model's context size in tokens; compaction needs it;
    * ``tool_choice`` — ``"auto"``, ``"none"``, ``"required"``, a tool's name (a named
      choice: the server must call that tool), a raw dict, or a function of the
      :class:`ModelRequest` returning one of these or None, decided per step (e.g. force a
      tool on the turn's first step only: ``request.turn_steps == 0``). Not sent when the
      request has no tools; a structured-output tool request defaults to ``"required"``;
    * ``output_mode`` — how structured output is asked for when the agent does not say
      (``"tool"``, ``"native"`` or ``"prompted"``, see We0Agent); ``native_format`` — the
      ``response_format`` dialect of native mode: ``"json_schema"`` (OpenAI, vLLM,
      llama-server) or ``"json_object"`` (llama-cpp-python's server);
    * ``max_retries`` (3), ``retry_base_delay`` (0.5 s, doubled per attempt, capped at
      ``retry_max_delay`` = 8 s) and ``max_retry_after`` (60 s) — see
      :mod:`we0nb.models.openai_errors`;
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
                 context_window: Optional[int] = None, tool_choice: ToolChoice = None,
                 output_mode: OutputMode = "tool", native_format: NativeFormat = "json_schema",
                 max_retries: int = 3, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 8.0, max_retry_after: float = 60.0, timeout: Optional[float] = None,
                 stream_usage: bool = True, send_reasoning: bool = False, client: Any = None,
                 model_id: Optional[str] = None, **options: Any):
        _sdk()  # the client is an extra: a clear one-line error here rather than at the first step
        _check(model, context_window, max_retries, retry_base_delay, retry_max_delay, max_retry_after,
               output_mode, native_format, tool_choice, options)
        if client is None:
            api_key = _api_key(api_key, base_url)
        self.model = model
        self.base_url = base_url
        self.model_id = model_id or model
        self.context_window = context_window
        self.tool_choice = tool_choice
        self.output_mode = output_mode
        self.native_format: NativeFormat = native_format
        self.retry = RetryPolicy(max_retries, float(retry_base_delay), float(retry_max_delay),
                                 float(max_retry_after))
        self.timeout = timeout
        self.stream_usage = bool(stream_usage)
        self.send_reasoning = bool(send_reasoning)
        self.options = options
        self._api_key = api_key
        self._given_client = client
        self._client: Any = None
        self._client_loop: Any = None

    @property
    def max_retries(self) -> int:
        return self.retry.max_retries

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
            choice = self.choose_tool(request)
            if choice is not None:
                params["tool_choice"] = choice
        else:
            params.pop("parallel_tool_calls", None)
        fmt = response_format(request, self.native_format)
        if fmt is not None:
            params.setdefault("response_format", fmt)
        return params

    def choose_tool(self, request: ModelRequest) -> Any:
        """This step's ``tool_choice`` (None: not sent)."""
        choice = self.tool_choice
        if callable(choice):
            choice = choice(request)
        if choice is None and request.output_tool:
            choice = "required"
        if isinstance(choice, str) and choice not in _CHOICES:
            choice = {"type": "function", "function": {"name": choice}}
        return choice

    # ------------------------------------------------------------------ the stream

    def _where(self) -> str:
        return f"The model server at {self.base_url}" if self.base_url else "The OpenAI API"

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:  # type: ignore[override]
        client = self._get_client()
        params = self.request_params(request)
        sdk = _sdk()
        attempt = 0
        while True:
            produced = False
            response = None
            delay: Optional[float] = None
            try:
                response = await client.chat.completions.create(**params)
                acc = ChunkAccumulator()
                while True:
                    try:
                        chunk = await response.__anext__()
                    except StopAsyncIteration:
                        break
                    for ev in acc.feed(chunk):
                        produced = True
                        yield ev
                if acc.chunks == 0:
                    self._check_fits(params)  # an empty stream may be an oversized prompt
                for ev in acc.finish(self._where()):
                    yield ev
                return
            except Exception as exc:
                if not produced:
                    delay = self.retry.delay(sdk, exc, attempt)
                if delay is None:
                    raise self._final_error(sdk, exc, produced, attempt) from exc
            finally:
                if response is not None:
                    # closes the HTTP response at once: on abort the server sees the disconnect
                    await response.close()
            attempt += 1
            await asyncio.sleep(delay)

    def _check_fits(self, params: dict[str, Any]) -> None:
        """An empty stream from a request estimated over the context window is a context overflow.

        llama-cpp-python checks the prompt's length inside the stream: an oversized prompt
        gets HTTP 200 and an empty body (streamed), not its 400. Said so, compaction can answer it."""
        if not self.context_window:
            return
        size = len(json.dumps(params["messages"], ensure_ascii=False)) + len(json.dumps(params.get("tools") or []))
        estimate = size // 4
        if estimate > self.context_window:
            raise ContextWindowExceeded(
                f"{self._where()} returned an empty stream for a request of about {estimate} tokens (estimated), "
                f"more than the {self.context_window}-token context window of {self.model!r}")

    def _final_error(self, sdk: Any, exc: Exception, produced: bool, attempt: int) -> BaseException:
        err = translate(sdk, exc, produced=produced, where=self._where(), model=self.model)
        if err is exc:
            return exc
        if attempt and isinstance(err, ModelProviderError):
            err.args = (f"{err.args[0]} (gave up after {attempt} retr{'y' if attempt == 1 else 'ies'})",)
        return err


# --------------------------------------------------------------------------- construction checks


def _api_key(api_key: Optional[str], base_url: Optional[str]) -> str:
    if api_key is None:
        api_key = os.environ.get("OPENAI_API_KEY")
    if api_key is None:
        if base_url is None and not os.environ.get("OPENAI_BASE_URL"):
            raise ValueError(
                "OpenAIChatModel: no API key. Pass api_key=... or set OPENAI_API_KEY; for a local "
                "server (vLLM, Ollama, llama.cpp, LM Studio) pass base_url=... instead."
            )
        api_key = "not-needed"  # local servers ignore it, the client wants one
    return api_key


def _check(model: Any, context_window: Any, max_retries: Any, retry_base_delay: Any, retry_max_delay: Any,
           max_retry_after: Any, output_mode: Any, native_format: Any, tool_choice: Any,
           options: dict[str, Any]) -> None:
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
    if output_mode not in _MODES:
        raise ValueError(f"OpenAIChatModel(output_mode=...): expected 'tool', 'native' or 'prompted', "
                         f"got {output_mode!r}.")
    if native_format not in _FORMATS:
        raise ValueError(f"OpenAIChatModel(native_format=...): expected 'json_schema' (OpenAI, vLLM, "
                         f"llama-server) or 'json_object' (llama-cpp-python), got {native_format!r}.")
    if tool_choice is not None and not (callable(tool_choice) or isinstance(tool_choice, (str, dict))):
        raise TypeError("OpenAIChatModel(tool_choice=...): expected 'auto', 'none', 'required', a tool name, "
                        f"a dict or a function of the request, got {type(tool_choice).__name__}.")
    bad = sorted(set(options) & set(_RESERVED))
    if bad:
        raise TypeError(f"OpenAIChatModel: {', '.join(bad)} cannot be passed as options; the model sets them.")

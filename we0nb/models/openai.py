"""OpenAIChatModel: any OpenAI-compatible chat-completions server, through the official client.

Works with OpenAI, vLLM, Ollama, llama.cpp's ``llama-server``, llama-cpp-python's server,
LM Studio, DeepSeek and other servers that speak ``POST /v1/chat/completions`` with
``stream=True``. Install the extra: ``pip install 'we0nb[openai]'``.

The wire format lives in :mod:`we0nb.models._openai_wire`, the meaning of errors in
:mod:`we0nb.models._openai_errors`; the client, the retries, the error messages and the
closing of the HTTP response on abort are those of every HTTP adapter
(:mod:`we0nb.models._http`). This module builds the request.

Every error is recorded by the engine on the assistant message, which stays unfinished,
so ``mode="resume"`` continues.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional, Union

from ..errors import ContextWindowExceeded
from ._http import Failure, HttpModel
from ._openai_errors import describe, is_context_length_error
from ._openai_wire import ChunkAccumulator, NativeFormat, response_format, to_openai_messages, to_openai_tools
from .base import ModelEvent, ModelRequest, OutputMode

__all__ = ["OpenAIChatModel", "to_openai_messages", "to_openai_tools", "is_context_length_error", "ToolChoice"]

#: a ``tool_choice`` value, or a function of the request returning one (None: not sent)
ToolChoice = Union[str, dict, Callable[[ModelRequest], Any], None]

_CHOICES = ("auto", "none", "required")
_MODES = ("tool", "native", "prompted")
_FORMATS = ("json_schema", "json_object")


class OpenAIChatModel(HttpModel[ChunkAccumulator]):
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
      :mod:`we0nb.models._http`;
    * ``timeout`` — seconds for the HTTP request (None: the client's default);
    * ``stream_usage`` (True) — send ``stream_options={"include_usage": True}``; turn off
      for a server that rejects it;
    * ``send_reasoning`` (False) — send earlier reasoning back as ``reasoning_content``;
    * ``client`` — an ``openai.AsyncOpenAI`` to use instead of building one (its own
      ``max_retries`` then stays as you set it);
    * ``provider`` and ``price`` — what prices the model's calls: it is priced by its model
      name as provider ``"openai"`` whatever its ``base_url``, unless given another
      ``provider`` or its own ``price=(usd_per_million_input, usd_per_million_output)``
      (stored now; the cost itself is computed later, SPEC §13);
    * any other keyword (``temperature``, ``max_completion_tokens``, ``extra_body`` …) is
      passed to ``chat.completions.create`` as is.
    """

    sdk_module = "openai"
    sdk_extra = "openai"
    api_name = "The OpenAI API"
    default_url = "https://api.openai.com/v1"
    key_env = "OPENAI_API_KEY"
    url_env = "OPENAI_BASE_URL"
    example_model = "gpt-4o-mini"
    reserved = ("model", "messages", "stream", "stream_options", "tools")
    _provider = "openai"

    def __init__(self, model: str, base_url: Optional[str] = None, api_key: Optional[str] = None, *,
                 context_window: Optional[int] = None, tool_choice: ToolChoice = None,
                 output_mode: OutputMode = "tool", native_format: NativeFormat = "json_schema",
                 max_retries: int = 3, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 8.0, max_retry_after: float = 60.0, timeout: Optional[float] = None,
                 stream_usage: bool = True, send_reasoning: bool = False, client: Any = None,
                 model_id: Optional[str] = None, provider: Optional[str] = None, price: Any = None,
                 **options: Any):
        super().__init__(model, base_url=base_url, api_key=api_key, context_window=context_window,
                         max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, max_retry_after=max_retry_after, timeout=timeout,
                         client=client, model_id=model_id, provider=provider, price=price, options=options)
        _check(output_mode, native_format, tool_choice)
        if client is None:
            self._api_key = _api_key(api_key, base_url)
        self.tool_choice = tool_choice
        self.output_mode = output_mode
        self.native_format: NativeFormat = native_format
        self.stream_usage = bool(stream_usage)
        self.send_reasoning = bool(send_reasoning)

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

    # ------------------------------------------------------------------ the stream (see HttpModel)

    def _new_client(self, kwargs: dict[str, Any]) -> Any:
        return self.sdk().AsyncOpenAI(**kwargs)

    async def _open(self, client: Any, params: dict[str, Any]) -> Any:
        return await client.chat.completions.create(**params)

    def _accumulator(self) -> ChunkAccumulator:
        return ChunkAccumulator()

    def _finish(self, acc: ChunkAccumulator, params: dict[str, Any]) -> list[ModelEvent]:
        if acc.chunks == 0:
            self._check_fits(params)  # an empty stream may be an oversized prompt
        return acc.finish(self._where())

    def _describe(self, exc: BaseException) -> Optional[Failure]:
        return describe(self.sdk(), exc)

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


def _check(output_mode: Any, native_format: Any, tool_choice: Any) -> None:
    if output_mode not in _MODES:
        raise ValueError(f"OpenAIChatModel(output_mode=...): expected 'tool', 'native' or 'prompted', "
                         f"got {output_mode!r}.")
    if native_format not in _FORMATS:
        raise ValueError(f"OpenAIChatModel(native_format=...): expected 'json_schema' (OpenAI, vLLM, "
                         f"llama-server) or 'json_object' (llama-cpp-python), got {native_format!r}.")
    if tool_choice is not None and not (callable(tool_choice) or isinstance(tool_choice, (str, dict))):
        raise TypeError("OpenAIChatModel(tool_choice=...): expected 'auto', 'none', 'required', a tool name, "
                        f"a dict or a function of the request, got {type(tool_choice).__name__}.")

"""AnthropicModel: Claude through Anthropic's Messages API, with the official ``anthropic`` SDK.

Install the extra: ``pip install 'we0nb[anthropic]'``. The request and the stream mapping
live in :mod:`we0nb.models._anthropic_wire`, the meaning of errors in
:mod:`we0nb.models._anthropic_errors`; the client, the retries, the error messages and the
closing of the HTTP response on abort are those of every HTTP adapter
(:mod:`we0nb.models._http`). This module builds the request.

* Text and extended thinking (``thinking={"type": "enabled", "budget_tokens": 1024}``,
  passed to the API as is) stream as they arrive; each thinking block is kept with its
  signature (a redacted block with its data) and sent back as the API requires, from the
  transcript, so a resume in another process sends them too. Tool calls (``tool_use``,
  input streamed as ``input_json_delta``) are emitted one by one as their blocks end.
* Usage: ``input_tokens`` is the whole prompt (uncached + cache reads + cache writes),
  ``cached_tokens`` the cache reads, ``cache_write_tokens`` the cache writes,
  ``reasoning_tokens`` the thinking tokens when the API reports them.
* ``max_tokens`` (the API requires it) defaults to :data:`DEFAULT_MAX_TOKENS`.
* Structured output: the output tool is forced (``tool_choice={"type": "any"}``); with
  thinking on, the API allows no forced tool, so the choice is left to the model.

Errors (those of every HTTP adapter):

* 401 and 403 → :class:`~we0nb.errors.ModelAuthenticationError`, never retried; 404 and
  other 4xx → :class:`~we0nb.errors.ModelProviderError`, not retried;
* 408, 409, 429, 5xx, 529 (overloaded), an ``error`` event before any output and a failed
  connection → retried (the SDK's own retries are off) up to ``max_retries`` times,
  honouring ``retry-after`` / ``retry-after-ms`` (longer than ``max_retry_after``: not
  waited for), else with exponential backoff — only while nothing has been streamed;
* a prompt too long for the context window → :class:`~we0nb.errors.ContextWindowExceeded`
  (the engine compacts the history);
* an ``error`` event after output, a cut connection, an event that is not JSON or breaks the
  event sequence → :class:`~we0nb.errors.ModelProviderError`; the engine keeps what
  arrived and leaves the message unfinished, so ``mode="resume"`` continues.

Abort: the engine cancels the pending read and closes this generator; its ``finally``
closes the HTTP response at once.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ._anthropic_errors import describe
from ._anthropic_wire import StreamAccumulator, system_param, to_anthropic_messages, to_anthropic_tools
from ._http import Failure, HttpModel
from .base import ModelEvent, ModelRequest

__all__ = ["AnthropicModel", "DEFAULT_MAX_TOKENS"]

#: ``max_tokens`` when none is given: every current Claude model can produce this many
DEFAULT_MAX_TOKENS = 8192


class AnthropicModel(HttpModel[StreamAccumulator]):
    """A Claude model, streamed through ``anthropic.AsyncAnthropic().messages.create``.

    ``model`` is the API's model name (e.g. ``"claude-sonnet-4-5"``); ``api_key`` defaults to
    ``$ANTHROPIC_API_KEY``; ``base_url`` points at a proxy or a compatible server. Keywords:

    * ``max_tokens`` (:data:`DEFAULT_MAX_TOKENS`) — the most tokens one step may produce
      (thinking included: it must exceed a thinking ``budget_tokens``);
    * ``prompt_cache`` (False) — cache breakpoints on the system prompt, the tools and the
      latest turn, so each step re-reads the conversation from the cache;
    * ``context_window`` — the model's context size in tokens; compaction needs it;
    * ``max_retries`` (3), ``retry_base_delay`` (0.5 s, doubled per attempt, capped at
      ``retry_max_delay`` = 8 s), ``max_retry_after`` (60 s) — see the module docstring;
    * ``timeout`` — seconds for the HTTP request (None: the SDK's default);
    * ``client`` — an ``AsyncAnthropic`` (or a Bedrock/Vertex client) to use as it is;
    * ``provider`` (``"anthropic"``) and ``price`` — what prices the model's calls: its own
      ``price=(usd_per_million_input, usd_per_million_output)``, else the provider's price
      of its model name (stored now; the cost itself is computed later, SPEC §13);
    * any other keyword that ``messages.create`` of the installed SDK takes (``thinking``,
      ``stop_sequences``, ``metadata``, ``extra_headers``, ``extra_body`` …) goes to it as is.
    """

    sdk_module = "anthropic"
    sdk_extra = "anthropic"
    api_name = "The Anthropic API"
    default_url = "https://api.anthropic.com"
    key_env = "ANTHROPIC_API_KEY"
    url_env = "ANTHROPIC_BASE_URL"
    example_model = "claude-sonnet-4-5"
    reserved = ("model", "messages", "stream", "system", "tools")
    _provider = "anthropic"

    def __init__(self, model: str, *, api_key: Optional[str] = None, base_url: Optional[str] = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, prompt_cache: bool = False,
                 context_window: Optional[int] = None, max_retries: int = 3, retry_base_delay: float = 0.5,
                 retry_max_delay: float = 8.0, max_retry_after: float = 60.0, timeout: Optional[float] = None,
                 client: Any = None, model_id: Optional[str] = None, provider: Optional[str] = None,
                 price: Any = None, **options: Any):
        super().__init__(model, base_url=base_url, api_key=api_key, context_window=context_window,
                         max_retries=max_retries, retry_base_delay=retry_base_delay,
                         retry_max_delay=retry_max_delay, max_retry_after=max_retry_after, timeout=timeout,
                         client=client, model_id=model_id, provider=provider, price=price, options=options)
        _check_max_tokens(max_tokens, options)
        if client is None and api_key is None:
            api_key = os.environ.get("ANTHROPIC_API_KEY")
            if api_key is None and not os.environ.get("ANTHROPIC_AUTH_TOKEN"):
                if base_url is None:
                    raise ValueError("AnthropicModel: no API key. Pass api_key=... or set ANTHROPIC_API_KEY.")
                api_key = "not-needed"  # a local proxy may need none; the SDK wants one
            self._api_key = api_key
        self.max_tokens = max_tokens
        self.prompt_cache = bool(prompt_cache)

    # ------------------------------------------------------------------ request

    @property
    def thinking(self) -> bool:
        """Extended thinking is on (then the API allows no forced tool choice)."""
        t = self.options.get("thinking")
        return isinstance(t, dict) and t.get("type") not in (None, "disabled")

    def request_params(self, request: ModelRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request``."""
        cache = self.prompt_cache
        params: dict[str, Any] = dict(self.options)
        params["model"] = self.model
        params["max_tokens"] = self.max_tokens
        params["messages"] = to_anthropic_messages(request, cache=cache)
        params["stream"] = True
        system = system_param(request.system, cache=cache)
        if system is not None:
            params["system"] = system
        if request.tools:
            params["tools"] = to_anthropic_tools(request, cache=cache)
            if request.output_tool and not self.thinking:
                params["tool_choice"] = {"type": "any"}
        else:
            params.pop("tool_choice", None)
        return params

    # ------------------------------------------------------------------ the stream (see HttpModel)

    def _new_client(self, kwargs: dict[str, Any]) -> Any:
        return self.sdk().AsyncAnthropic(**kwargs)

    async def _open(self, client: Any, params: dict[str, Any]) -> Any:
        return await client.messages.create(**params)

    def _accumulator(self) -> StreamAccumulator:
        return StreamAccumulator(self._where())

    def _finish(self, acc: StreamAccumulator, params: dict[str, Any]) -> list[ModelEvent]:
        return [acc.finish()]

    def _describe(self, exc: BaseException) -> Optional[Failure]:
        return describe(self.sdk(), exc)


def _check_max_tokens(max_tokens: Any, options: dict[str, Any]) -> None:
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise ValueError("AnthropicModel(max_tokens=...): expected a positive number of tokens.")
    thinking = options.get("thinking")
    budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
    if isinstance(budget, int) and budget >= max_tokens:
        raise ValueError(f"AnthropicModel: thinking budget_tokens={budget} must be below "
                         f"max_tokens={max_tokens}; pass a larger max_tokens=....")

"""Drivers for the adapter conformance suite (tests/test_conformance.py).

A driver puts one model adapter behind a provider-neutral script: the tests say what the
model replies (:func:`R` reasoning, :func:`T` text, :func:`C` a tool call, a usage, and how
the reply ends: normally, held open, cut, with a malformed event or an error event) or
which error it answers with, and read back what the adapter sent (:class:`Sent`). Each
driver speaks its provider's wire format through a local server, or, for ScriptedModel,
builds the script itself. To add an adapter: write a driver and add it to :data:`DRIVERS`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import pytest

from we0nb.errors import ContextWindowExceeded, ModelAuthenticationError, ModelProviderError
from we0nb.messages import Usage
from we0nb.models.base import AssistantTurn, ToolResult, UserTurn

# --------------------------------------------------------------------------- the neutral script


@dataclass(frozen=True)
class R:
    """Streamed reasoning (the signing driver signs it)."""

    deltas: tuple[str, ...]
    signature: str = "sig-1"


@dataclass(frozen=True)
class T:
    deltas: tuple[str, ...]


@dataclass(frozen=True)
class C:
    """A tool call; ``input`` as a dict, or raw argument text. ``partial``: only its first half
    is sent (the stream is held or cut inside it)."""

    call_id: str
    name: str
    input: Union[dict, str]
    partial: bool = False

    @property
    def raw(self) -> str:
        return self.input if isinstance(self.input, str) else json.dumps(self.input)


def reasoning(*deltas: str, signature: str = "sig-1") -> R:
    return R(deltas, signature)


def text(*deltas: str) -> T:
    return T(deltas)


def call(call_id: str, name: str, input: Union[dict, str], partial: bool = False) -> C:
    return C(call_id, name, input, partial)


#: how a reply ends: normally (None), held open until the client goes away, the connection
#: cut, a malformed event, or an error event after what was sent
ENDS = (None, "hold", "cut", "bad", "error")


@dataclass
class Sent:
    """One request as the provider received it, in neutral terms. ``messages`` items:
    ``("user", text)`` · ``("assistant", text, ((id, name, input), …))`` ·
    ``("tool", call_id, content, is_error)`` (``is_error`` None when the wire has no such flag)."""

    system: Optional[str]
    messages: list[tuple]
    tools: list[str]
    forced: bool  # the request forces a tool call (structured output)
    signed: list[tuple] = field(default_factory=list)  # reasoning blocks sent back: (text, signature, redacted)


ERROR_KINDS = ("auth", "permission", "not-found", "rate-limit", "overloaded", "server", "context", "bad-request")


class Driver:
    name = "?"
    transport = True  # an HTTP adapter: retries, disconnects, wire-level faults
    signs_reasoning = False  # reasoning comes with a signature that must go back
    cache_writes = False  # usage reports cache writes
    key_env = ""

    def model(self, slow: bool = False, **kw: Any) -> Any:
        """The adapter under test (``slow``: slow enough to abort; only ScriptedModel needs it)."""
        raise NotImplementedError

    def reply(self, *items: Any, usage: Optional[Usage] = None, end: Optional[str] = None) -> Any:
        raise NotImplementedError

    def error(self, kind: str, retry_after: Optional[str] = None) -> Any:
        raise NotImplementedError

    def play(self, *responses: Any) -> None:
        raise NotImplementedError

    def sent(self, i: int) -> Sent:
        raise NotImplementedError

    @property
    def n_requests(self) -> int:
        raise NotImplementedError

    def request_times(self) -> list[float]:
        raise NotImplementedError

    def wait_disconnect(self, timeout: float) -> bool:
        return True

    async def held(self) -> None:
        """Returns once a held reply has started streaming (the model is blocked on it)."""
        raise NotImplementedError

    def expected_usage(self, u: Usage) -> Usage:
        return u if self.cache_writes else u.model_copy(update={"cache_write_tokens": 0})

    def require_transport(self) -> None:
        if not self.transport:
            pytest.skip(f"{self.name} has no transport: retries and wire faults belong to the HTTP adapters")

    async def aclose(self) -> None:
        """Close the HTTP clients of the models made (on the test's event loop) and the server."""
        for m in getattr(self, "models", ()):
            await m.aclose()
        self.close()

    def close(self) -> None:
        pass


def _halves(raw: str) -> tuple[str, str]:
    k = max(1, len(raw) // 2)
    return raw[:k], raw[k:]


# --------------------------------------------------------------------------- Anthropic


class AnthropicDriver(Driver):
    name = "anthropic"
    signs_reasoning = True
    cache_writes = True
    key_env = "ANTHROPIC_API_KEY"

    def __init__(self) -> None:
        pytest.importorskip("anthropic")
        import fake_anthropic as fa

        self.fa = fa
        self.server = fa.FakeAnthropic()
        self.models: list[Any] = []

    def model(self, slow: bool = False, **kw: Any) -> Any:
        from we0nb.models.anthropic import AnthropicModel

        kw.setdefault("api_key", "sk-ant-test")
        kw.setdefault("retry_base_delay", 0.01)
        self.models.append(AnthropicModel("claude-test", base_url=self.server.url, **kw))
        return self.models[-1]

    def reply(self, *items: Any, usage: Optional[Usage] = None, end: Optional[str] = None) -> Any:
        fa = self.fa
        u = usage or Usage()
        cached, written = u.cached_tokens, u.cache_write_tokens
        events = [fa.message_start(u.input_tokens - cached - written, written if usage else None,
                                   cached if usage else None)]
        calls = False
        for i, it in enumerate(items):
            if isinstance(it, (R, T)):
                block = (fa.thinking_block(i, *it.deltas, signature=it.signature) if isinstance(it, R)
                         else fa.text_block(i, *it.deltas))
                if end == "hold" and i == len(items) - 1:
                    block = [e for e in block if e["type"] != "content_block_stop" and
                             e.get("delta", {}).get("type") != "signature_delta"]  # held inside the block
                events += block
            elif it.partial:
                events += fa.tool_block(i, it.call_id, it.name, _halves(it.raw)[0])[:-1]  # no stop
            else:
                events += fa.tool_block(i, it.call_id, it.name, *_halves(it.raw))
                calls = True
        if end is None:
            events += [fa.ping(), fa.message_delta("tool_use" if calls else "end_turn", u.output_tokens,
                                                  u.reasoning_tokens or None), fa.message_stop()]
        elif end == "bad":
            events.append(fa.Raw(b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n'))
        elif end == "error":
            events.append(fa.error_event("overloaded_error", "Overloaded"))
        return fa.stream(events, hold=end == "hold", cut=end in ("cut", "bad", "error"))

    def error(self, kind: str, retry_after: Optional[str] = None) -> Any:
        fa = self.fa
        headers = {"retry-after": retry_after} if retry_after is not None else None
        table = {
            "auth": ("authentication_error", "invalid x-api-key"),
            "permission": ("permission_error", "Your API key does not have permission to use the specified resource."),
            "not-found": ("not_found_error", "model: claude-test"),
            "rate-limit": ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
            "overloaded": ("overloaded_error", "Overloaded"),
            "server": ("api_error", "Internal server error"),
            "context": ("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
            "bad-request": ("invalid_request_error", "temperature: Input should be less than or equal to 1"),
        }
        etype, message = table[kind]
        return fa.error(etype, message, headers=headers)

    def play(self, *responses: Any) -> None:
        self.server.play(*responses)

    def sent(self, i: int) -> Sent:
        body = self.server.bodies()[i]
        system = body.get("system")
        if isinstance(system, list):
            system = "".join(b["text"] for b in system)
        out: list[tuple] = []
        signed: list[tuple] = []
        for m in body["messages"]:
            if m["role"] == "user":
                for b in m["content"]:
                    if b["type"] == "text":
                        out.append(("user", b["text"]))
                    else:
                        out.append(("tool", b["tool_use_id"], b.get("content", ""), bool(b.get("is_error"))))
                continue
            blocks = m["content"]
            signed += [(b.get("thinking", ""), b.get("signature"), b.get("data"))
                       for b in blocks if b["type"] in ("thinking", "redacted_thinking")]
            out.append(("assistant", "".join(b["text"] for b in blocks if b["type"] == "text"),
                        tuple((b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use")))
        return Sent(system, out, [t["name"] for t in body.get("tools", [])],
                    body.get("tool_choice", {}).get("type") in ("any", "tool"), signed)

    @property
    def n_requests(self) -> int:
        return len(self.server.requests)

    def request_times(self) -> list[float]:
        return [r["time"] for r in self.server.requests]

    def wait_disconnect(self, timeout: float) -> bool:
        return self.server.client_closed.wait(timeout)

    async def held(self) -> None:
        assert await asyncio.to_thread(self.server.held.wait, 10), "the held stream never started"

    def close(self) -> None:
        self.server.stop()


# --------------------------------------------------------------------------- OpenAI chat completions


class OpenAIDriver(Driver):
    """Through the fake server of tests/test_openai_model.py (imported, not copied)."""

    name = "openai"
    key_env = "OPENAI_API_KEY"

    def __init__(self) -> None:
        pytest.importorskip("openai")
        import test_openai_model as om

        self.om = om
        self.server = om.FakeServer()
        self.models: list[Any] = []
        self._held = threading.Event()

    def model(self, slow: bool = False, **kw: Any) -> Any:
        from we0nb.models.openai import OpenAIChatModel

        kw.setdefault("api_key", "sk-test")
        kw.setdefault("retry_base_delay", 0.01)
        self.models.append(OpenAIChatModel("test-model", base_url=self.server.url, **kw))
        return self.models[-1]

    def reply(self, *items: Any, usage: Optional[Usage] = None, end: Optional[str] = None) -> Any:
        chunk = self.om.chunk
        events: list[Any] = [chunk({"role": "assistant", "content": ""})]
        calls = False
        k = -1
        for it in items:
            if isinstance(it, R):
                events += [chunk({"reasoning_content": d}) for d in it.deltas]
            elif isinstance(it, T):
                events += [chunk({"content": d}) for d in it.deltas]
            else:
                k += 1
                first, rest = _halves(it.raw)
                events.append(chunk({"tool_calls": [{"index": k, "id": it.call_id, "type": "function",
                                                     "function": {"name": it.name, "arguments": first}}]}))
                if not it.partial:
                    events.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": rest}}]}))
                    calls = True
        if end is None or (end == "hold" and calls):
            # chat completions deliver the calls with the finish reason
            events.append(chunk({}, "tool_calls" if calls else "stop"))
        if end is None and usage is not None:
            events.append(chunk(usage={
                "prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
                "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}))
        if end == "bad":
            events.append("{this is not json")
        elif end == "error":
            events.append({"error": {"message": "The server is overloaded", "type": "server_error"}})
        inner = self.om.sse(events, hold=end == "hold", cut=end == "cut")
        if end != "hold":
            return inner
        held = self._held

        def respond(h: Any) -> None:  # note when the stream is open: after its first chunk
            send = h.send_chunk

            def send_chunk(data: bytes) -> None:
                send(data)
                held.set()

            h.send_chunk = send_chunk
            inner(h)

        return respond

    def error(self, kind: str, retry_after: Optional[str] = None) -> Any:
        headers = {"Retry-After": retry_after} if retry_after is not None else None
        table = {
            "auth": (401, "Incorrect API key provided: sk-test.", "invalid_api_key"),
            "permission": (403, "You are not allowed to sample from this model", None),
            "not-found": (404, "The model `test-model` does not exist", "model_not_found"),
            "rate-limit": (429, "Rate limit reached for requests", "rate_limit_exceeded"),
            "overloaded": (503, "The engine is currently overloaded, please try again later", None),
            "server": (500, "The server had an error while processing your request.", None),
            "context": (400, "This model's maximum context length is 4096 tokens. However, you requested "
                             "5000 tokens.", "context_length_exceeded"),
            "bad-request": (400, "Unknown parameter: 'foo'.", None),
        }
        code, message, ecode = table[kind]
        return self.om.status(code, {"error": {"message": message, "type": "invalid_request_error",
                                               "code": ecode}}, headers)

    def play(self, *responses: Any) -> None:
        self.server.play(*responses)

    def sent(self, i: int) -> Sent:
        body = self.server.bodies()[i]
        system = None
        out: list[tuple] = []
        for m in body["messages"]:
            role = m["role"]
            if role == "system":
                system = m["content"]
            elif role == "user":
                out.append(("user", m["content"]))
            elif role == "assistant":
                out.append(("assistant", m.get("content") or "", tuple(
                    (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                    for c in m.get("tool_calls") or ())))
            else:
                out.append(("tool", m["tool_call_id"], m["content"], None))
        return Sent(system, out, [t["function"]["name"] for t in body.get("tools", [])],
                    body.get("tool_choice") == "required")

    @property
    def n_requests(self) -> int:
        return len(self.server.requests)

    def request_times(self) -> list[float]:
        return [r["time"] for r in self.server.requests]

    def wait_disconnect(self, timeout: float) -> bool:
        return self.server.client_closed.wait(timeout)

    async def held(self) -> None:
        assert await asyncio.to_thread(self._held.wait, 10), "the held stream never started"

    def close(self) -> None:
        self.server.stop()


# --------------------------------------------------------------------------- ScriptedModel


class ScriptedDriver(Driver):
    """ScriptedModel plays the same replies; a held reply is a slow one (``delay``) that the
    abort interrupts, and wire faults are the provider errors they become."""

    name = "scripted"
    transport = False
    cache_writes = False

    def __init__(self) -> None:
        self.steps: list[list[Any]] = []
        self._model: Any = None

    def model(self, slow: bool = False, **kw: Any) -> Any:
        from we0nb import ScriptedModel

        if self._model is None:
            self._model = ScriptedModel(self.steps, delay=0.05 if slow else 0.0, model_id="scripted", **kw)
            self.steps = self._model.steps  # (the model keeps its own list: play into it)
        return self._model

    async def held(self) -> None:
        while not self._model.requests:  # the model sleeps before its first delta
            await asyncio.sleep(0.005)

    def reply(self, *items: Any, usage: Optional[Usage] = None, end: Optional[str] = None) -> Any:
        import we0nb.testing as s

        out: list[Any] = []
        for it in items:
            if isinstance(it, R):
                out.append(s.reasoning(list(it.deltas)))
            elif isinstance(it, T):
                out.append(s.text(list(it.deltas)))
            elif not it.partial:
                out.append(s.tool_call(it.name, it.input, call_id=it.call_id))
        if usage is not None:
            out.append(s.usage(usage.input_tokens, usage.output_tokens, usage.reasoning_tokens, usage.cached_tokens))
        if end == "hold":
            out.append(s.text(["(never reached: the abort comes first)"]))
        elif end == "cut":
            out.append(s.fail(ModelProviderError("The stream broke off mid-way (connection reset)", retryable=True)))
        elif end == "bad":
            out.append(s.fail(ModelProviderError("The model sent a malformed stream event", retryable=True)))
        elif end == "error":
            out.append(s.fail(ModelProviderError("The model reported an error mid-stream (overloaded): Overloaded",
                                                 status_code=529, retryable=True)))
        return out

    def error(self, kind: str, retry_after: Optional[str] = None) -> Any:
        import we0nb.testing as s

        table = {
            "auth": ModelAuthenticationError("refused the API key (HTTP 401: invalid key)", status_code=401),
            "permission": ModelAuthenticationError("denied access (HTTP 403: no permission)", status_code=403),
            "not-found": ModelProviderError("answered HTTP 404 (model not found)", status_code=404),
            "rate-limit": ModelProviderError("answered HTTP 429: rate limit", status_code=429, retryable=True),
            "overloaded": ModelProviderError("answered HTTP 529: Overloaded", status_code=529, retryable=True),
            "server": ModelProviderError("answered HTTP 500: Internal server error", status_code=500, retryable=True),
            "context": ContextWindowExceeded("prompt is too long: 210000 tokens > 200000 maximum", status_code=400),
            "bad-request": ModelProviderError("answered HTTP 400: bad parameter", status_code=400),
        }
        return [s.fail(table[kind])]

    def play(self, *responses: Any) -> None:
        self.steps.extend(list(r) for r in responses)

    def sent(self, i: int) -> Sent:
        req = self._model.requests[i]
        out: list[tuple] = []
        signed: list[tuple] = []
        for m in req.messages:
            if isinstance(m, UserTurn):
                out.append(("user", m.text))
            elif isinstance(m, AssistantTurn):
                out.append(("assistant", m.text, tuple((c.call_id, c.name, c.input) for c in m.tool_calls)))
                signed += [(b.text, b.signature, b.redacted) for b in m.reasoning_blocks]
            elif isinstance(m, ToolResult):
                out.append(("tool", m.call_id, m.content, m.is_error))
        return Sent(req.system, out, [t.name for t in req.tools], req.output_tool is not None, signed)

    @property
    def n_requests(self) -> int:
        return len(self._model.requests) if self._model is not None else 0


DRIVERS = {"scripted": ScriptedDriver, "openai": OpenAIDriver, "anthropic": AnthropicDriver}

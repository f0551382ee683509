"""A local server speaking Anthropic's Messages API (``POST /v1/messages``, streamed), for tests.

Written from the public API reference: a stream is ``message_start``, then per content block
``content_block_start`` / ``content_block_delta``… / ``content_block_stop``, then
``message_delta`` (stop reason, cumulative usage) and ``message_stop``; ``ping`` may come
anywhere and an ``error`` event may end the stream. Each SSE event has an ``event:`` line
naming its type and a ``data:`` line with JSON carrying the same ``type``. Errors before the
stream are JSON bodies ``{"type": "error", "error": {"type": …, "message": …}}`` with the
HTTP status of their type.

The server plays a script, one responder per request, records every request (time, path,
headers, JSON body) and notices when a client goes away from a held stream.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Optional, Sequence, Union

from fake_http import Responder, ScriptedHandler, ScriptedServer, client_closed, wait_for_disconnect


#: the HTTP status of each error type, as the API reference lists them
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                "overloaded_error": 529}


class Raw(bytes):
    """Bytes sent as they are (a malformed event, a comment line)."""


class FakeAnthropic(ScriptedServer):
    """The server (127.0.0.1, a free port), started at once; ``stop()`` it."""

    @property
    def url(self) -> str:
        """The base URL (the SDK appends ``/v1/messages``)."""
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def nothing_left(self) -> Responder:
        return error("api_error", "the test server has no scripted response left")


# --------------------------------------------------------------------------- responders


def stream(events: Sequence[Union[dict, bytes]], *, cut: bool = False, hold: bool = False,
           headers: Optional[dict[str, str]] = None) -> Responder:
    """Stream ``events`` (dicts as named SSE events, :class:`Raw` bytes as they are).

    ``cut``: drop the connection after them (no end of the chunked body); ``hold``: keep the
    stream open until the client disconnects, recording when it did.
    """

    def respond(h: ScriptedHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("request-id", "req_test")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        try:
            for ev in events:
                if isinstance(ev, bytes):
                    h.send_chunk(bytes(ev))
                else:
                    h.send_chunk(f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            # the client closed while the events were still being written (an abort on an
            # early event, on a fast machine): that is the disconnect a held stream waits for
            h.close_connection = True
            if hold:
                client_closed(h.server.fake)
            return
        h.close_connection = cut or hold
        if cut:
            h.connection.shutdown(socket.SHUT_RDWR)
        elif hold:
            wait_for_disconnect(h)
        else:
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()

    return respond


def error(etype: str, message: str, status: Optional[int] = None,
          headers: Optional[dict[str, str]] = None) -> Responder:
    """An HTTP error before the stream, with the body and status of its type."""

    def respond(h: ScriptedHandler) -> None:
        data = json.dumps({"type": "error", "error": {"type": etype, "message": message},
                           "request_id": "req_test"}).encode()
        h.send_response(status or ERROR_STATUS.get(etype, 500))
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("request-id", "req_test")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    return respond


# --------------------------------------------------------------------------- events


def message_start(input_tokens: int = 0, cache_write: Optional[int] = None, cache_read: Optional[int] = None,
                  model: str = "claude-test") -> dict:
    usage: dict[str, Any] = {"input_tokens": input_tokens, "output_tokens": 1}
    if cache_write is not None:
        usage["cache_creation_input_tokens"] = cache_write
    if cache_read is not None:
        usage["cache_read_input_tokens"] = cache_read
    return {"type": "message_start", "message": {"id": "msg_test", "type": "message", "role": "assistant",
                                                 "content": [], "model": model, "stop_reason": None,
                                                 "stop_sequence": None, "usage": usage}}


def block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict:
    return {"type": "content_block_stop", "index": index}


def text_block(index: int, *deltas: str) -> list[dict]:
    return [block_start(index, {"type": "text", "text": ""}),
            *[block_delta(index, {"type": "text_delta", "text": d}) for d in deltas], block_stop(index)]


def thinking_block(index: int, *deltas: str, signature: Optional[str] = "sig") -> list[dict]:
    out = [block_start(index, {"type": "thinking", "thinking": "", "signature": ""}),
           *[block_delta(index, {"type": "thinking_delta", "thinking": d}) for d in deltas]]
    if signature is not None:
        out.append(block_delta(index, {"type": "signature_delta", "signature": signature}))
    return [*out, block_stop(index)]


def redacted_block(index: int, data: str) -> list[dict]:
    return [block_start(index, {"type": "redacted_thinking", "data": data}), block_stop(index)]


def tool_block(index: int, call_id: str, name: str, *pieces: str) -> list[dict]:
    return [block_start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
            *[block_delta(index, {"type": "input_json_delta", "partial_json": p}) for p in pieces],
            block_stop(index)]


def message_delta(stop_reason: str = "end_turn", output_tokens: int = 1, thinking_tokens: Optional[int] = None) -> dict:
    usage: dict[str, Any] = {"output_tokens": output_tokens}
    if thinking_tokens is not None:
        usage["output_tokens_details"] = {"thinking_tokens": thinking_tokens}
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": usage}


def message_stop() -> dict:
    return {"type": "message_stop"}


def ping() -> dict:
    return {"type": "ping"}


def error_event(etype: str, message: str) -> dict:
    return {"type": "error", "error": {"type": etype, "message": message}}


def reply(*blocks: list[dict], stop: Optional[str] = None, input_tokens: int = 0, output_tokens: int = 1,
          cache_write: Optional[int] = None, cache_read: Optional[int] = None) -> list[dict]:
    """A whole message: ``message_start``, the blocks, a ``ping``, ``message_delta``, ``message_stop``.
    ``stop`` defaults to ``tool_use`` when a block is a tool call, else ``end_turn``."""
    events = [message_start(input_tokens, cache_write, cache_read)]
    calls = False
    for b in blocks:
        events.extend(b)
        calls = calls or any(e.get("content_block", {}).get("type") == "tool_use" for e in b)
    events.append(ping())
    events.append(message_delta(stop or ("tool_use" if calls else "end_turn"), output_tokens))
    events.append(message_stop())
    return events

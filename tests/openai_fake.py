"""A local OpenAI-compatible chat-completions server for the tests (127.0.0.1, a thread).

It speaks the streaming protocol (SSE over chunked HTTP/1.1) and plays a script: one
response per request. It records every request and notices when a client goes away.

Like the real servers, it checks what it receives before it plays the script: by default
it refuses an assistant message with ``"content": null`` the way llama-cpp-python's server
does (HTTP 500, a pydantic validation error), so the unit suite guards what real servers
need. Add or drop checks through ``FakeServer.checks`` (e.g. :func:`reject_json_schema`,
llama-cpp-python's answer to ``response_format={"type": "json_schema", ...}``).

Importable by other test files: ``from openai_fake import FakeServer, sse, words, chunk, status``.
"""

from __future__ import annotations

import json
import socket
from typing import Any, Callable, Optional

from fake_http import Responder, ScriptedHandler, ScriptedServer, client_closed, wait_for_disconnect

__all__ = ["FakeServer", "Responder", "Check", "chunk", "words", "sse", "status", "empty_stream",
           "reject_null_content", "reject_json_schema"]

#: a check of a request body: a responder that refuses it, or None to accept it
Check = Callable[[Any], Optional[Responder]]


class FakeServer(ScriptedServer):
    """``checks``: request checks run before the script (default: :func:`reject_null_content`)."""

    def __init__(self, checks: Optional[list[Check]] = None) -> None:
        self.checks: list[Check] = [reject_null_content] if checks is None else list(checks)
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def refusal(self, payload: Any) -> Optional[Responder]:
        return next((r for r in (check(payload) for check in self.checks) if r is not None), None)

    def nothing_left(self) -> Responder:
        return status(500, {"error": {"message": "the test server has no scripted response left"}})


def chunk(delta: Optional[dict] = None, finish: Optional[str] = None, usage: Optional[dict] = None,
          **extra: Any) -> dict:
    c: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": []}
    if delta is not None or finish is not None:
        c["choices"] = [{"index": 0, "delta": delta if delta is not None else {}, "finish_reason": finish}]
    if usage is not None:
        c["usage"] = usage
    c.update(extra)
    return c


def words(*pieces: str, finish: str = "stop", usage: Optional[dict] = None) -> list:
    out: list = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces]
    out.append(chunk({}, finish))
    if usage is not None:
        out.append(chunk(usage=usage))
    return out


def sse(events: list, *, cut: bool = False, hold: bool = False) -> Responder:
    """Stream ``events`` (dicts as JSON, str as a raw data line, ``b"..."`` as raw bytes).

    ``cut``: drop the connection after them (no [DONE], no end of the chunked body);
    ``hold``: keep the stream open until the client disconnects, and record when it did.
    """

    def respond(h: ScriptedHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for ev in events:
                if isinstance(ev, bytes):
                    h.send_chunk(ev)
                elif isinstance(ev, str):
                    h.send_chunk(f"data: {ev}\n\n".encode())
                else:
                    h.send_chunk(f"data: {json.dumps(ev)}\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):  # the client left while we were writing
            h.close_connection = True
            if hold:  # the disconnect a held stream waits for
                client_closed(h.server.fake)
            return
        if cut:
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if hold:
            h.close_connection = True
            wait_for_disconnect(h)
            return
        h.send_chunk(b"data: [DONE]\n\n")
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    return respond


def status(code: int, body: Any, headers: Optional[dict[str, str]] = None) -> Responder:
    def respond(h: ScriptedHandler) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    return respond


def empty_stream() -> Responder:
    """HTTP 200 with SSE headers and an empty body: what llama-cpp-python sends when it fails
    inside the stream (e.g. on ``tool_choice="required"``)."""

    def respond(h: ScriptedHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    return respond


def _validation_error(count: int, detail: str) -> Responder:
    # llama-cpp-python 0.3.36's answer: HTTP 500 carrying FastAPI's RequestValidationError
    noun = "error" if count == 1 else "errors"
    return status(500, {"error": {"message": f"{count} validation {noun}:\n  {detail}",
                                  "type": "internal_server_error"}})


def reject_null_content(body: Any) -> Optional[Responder]:
    """llama-cpp-python 0.3: a message whose ``content`` is null fails validation (HTTP 500)."""
    for i, m in enumerate((body or {}).get("messages") or ()):
        if isinstance(m, dict) and "content" in m and m["content"] is None:
            return _validation_error(7, f"{{'type': 'string_type', 'loc': ('body', 'messages', {i}, "
                                        "'ChatCompletionRequestAssistantMessage', 'content'), "
                                        "'msg': 'Input should be a valid string', 'input': None}")
    return None


def reject_json_schema(body: Any) -> Optional[Responder]:
    """llama-cpp-python 0.3: ``response_format`` must be ``{"type": "json_object", "schema": …}``."""
    fmt = (body or {}).get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in ("text", "json_object"):
        return _validation_error(1, "{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
                                    "'msg': \"Input should be 'text' or 'json_object'\", "
                                    f"'input': {fmt.get('type')!r}}}")
    return None

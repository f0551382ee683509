"""What the tests' local model servers share: a threaded HTTP/1.1 server on 127.0.0.1 that
plays a script (one responder per POST), records every request and notices when a client
leaves a held stream. ``openai_fake`` and ``fake_anthropic`` add their protocol's responders."""

from __future__ import annotations

import json
import select
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

Responder = Callable[["ScriptedHandler"], None]


class ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_HTTPServer"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:  # noqa: N802
        fake = self.server.fake
        body = self.rfile.read(int(self.headers.get("content-length", "0") or 0))
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        with fake.lock:
            fake.requests.append({"time": time.monotonic(), "path": self.path,
                                  "headers": {k.lower(): v for k, v in self.headers.items()}, "body": payload})
            respond = fake.refusal(payload) or (fake.script.pop(0) if fake.script else None)
        (respond or fake.nothing_left())(self)

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    fake: "ScriptedServer"


class ScriptedServer:
    """The server, started at once; ``stop()`` it (or use it as a context manager)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.script: list[Responder] = []
        self.requests: list[dict[str, Any]] = []
        self.held = threading.Event()
        self.client_closed = threading.Event()
        self.closed_at: Optional[float] = None
        self.httpd = _HTTPServer(("127.0.0.1", 0), ScriptedHandler)
        self.httpd.fake = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def refusal(self, payload: Any) -> Optional[Responder]:
        """A responder refusing this request before the script plays (None: play the script)."""
        return None

    def nothing_left(self) -> Responder:
        """The answer when the script is spent."""
        raise NotImplementedError

    def play(self, *responders: Responder) -> None:
        with self.lock:
            self.script.extend(responders)

    def bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def client_closed(fake: ScriptedServer) -> None:
    fake.closed_at = time.monotonic()
    fake.client_closed.set()


def wait_for_disconnect(h: ScriptedHandler) -> None:
    """Hold the stream open until the client goes away (20 s at most), recording when it did."""
    fake = h.server.fake
    fake.held.set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ready, _, _ = select.select([h.connection], [], [], 0.05)
        if ready:
            try:
                data = h.connection.recv(1024)
            except OSError:
                data = b""
            if not data:
                client_closed(fake)
                return

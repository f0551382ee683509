"""A payments service on 127.0.0.1 that deduplicates on the ``Idempotency-Key`` header.

It behaves the way Stripe documents idempotent requests
(https://docs.stripe.com/api/idempotent_requests): the first request with a key runs and
its status code and body are saved; every later request with that key gets the saved
response (with ``Idempotent-Replayed: true``) and creates nothing; a request that arrives
while one with the same key is still running gets ``409`` and may be retried; a key reused
with different parameters gets ``400``. The charge is made by the server, so a client
killed in the middle of a request leaves the charge made and its response unread — the
case an idempotency key exists for.

``charges`` is the ground truth of the effects: one entry per charge created; ``attempts``
the ``X-Attempt`` header of each request answered other than 409 (one per execution).
``hold(phase)`` makes the next request wait at ``"before_charge"`` or ``"after_charge"``
until released, so a test can kill its client at that exact point.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional


@dataclass
class Hold:
    phase: str
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    key: Optional[str] = None


class PaymentsService:
    """``POST /v1/charges`` with a JSON body ``{"amount": int}`` and an ``Idempotency-Key``."""

    def __init__(self, latency: float = 0.01) -> None:
        self.latency = latency
        self.charges: list[dict[str, Any]] = []
        self.requests = 0
        self.attempts: list[tuple[str, Optional[str]]] = []  # (key, X-Attempt) of each request not answered 409
        self._saved: dict[str, tuple[dict[str, Any], int, bytes]] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self._hold: Optional[Hold] = None
        self._server: Optional[ThreadingHTTPServer] = None
        self.url = ""

    # ------------------------------------------------------------------ life
    def start(self) -> str:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                status, body, replayed = service.handle(self.path, self.headers.get("Idempotency-Key"),
                                                        self.rfile.read(length), self.headers.get("X-Attempt"))
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    if replayed:
                        self.send_header("Idempotent-Replayed", "true")
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client was killed: its charge stands
                    pass

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def hold(self, phase: str) -> Hold:
        """Make the next new charge request wait at ``phase`` until ``release`` is set."""
        assert phase in ("before_charge", "after_charge")
        self._hold = Hold(phase)
        return self._hold

    def charges_by_key(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            out: dict[str, list[dict[str, Any]]] = {}
            for c in self.charges:
                out.setdefault(c["idempotency_key"], []).append(c)
            return out

    # ------------------------------------------------------------------ one request
    def handle(self, path: str, key: Optional[str], raw: bytes, attempt: Optional[str] = None) -> tuple[int, bytes,
                                                                                                    bool]:
        """(status, body, replayed) for one request; ``attempt`` (the client's ``X-Attempt``) is
        recorded with its key for each request answered other than 409."""
        status, body, replayed = self._answer(path, key, raw)
        if status != 409 and key:
            with self._lock:
                self.attempts.append((key, attempt))
        return status, body, replayed

    def _answer(self, path: str, key: Optional[str], raw: bytes) -> tuple[int, bytes, bool]:
        if path != "/v1/charges":
            return 404, _error("invalid_request_error", f"no such route {path}"), False
        try:
            params = json.loads(raw)
            amount = int(params["amount"])
        except (ValueError, KeyError, TypeError):
            return 400, _error("invalid_request_error", "amount: an integer is required"), False
        if not key:
            return 400, _error("invalid_request_error", "this service requires an Idempotency-Key"), False
        with self._lock:
            self.requests += 1
            saved = self._saved.get(key)
            if saved is not None:
                if saved[0] != params:
                    return 400, _error("idempotency_error", "Keys for idempotent requests can only be used with "
                                       "the same parameters they were first used with."), False
                return saved[1], saved[2], True
            if key in self._running:  # nothing saved: safe to retry
                return 409, _error("idempotency_error", "There is currently another in-progress request "
                                   "using this Idempotent Key. Please try again later."), False
            self._running.add(key)
        try:
            self._wait("before_charge", key)
            time.sleep(self.latency)
            with self._lock:
                charge = {"id": f"ch_{len(self.charges) + 1:04d}", "amount": amount, "idempotency_key": key}
                self.charges.append(charge)
            self._wait("after_charge", key)
            time.sleep(self.latency)
            body = json.dumps({"id": charge["id"], "object": "charge", "amount": amount, "paid": True}).encode()
            with self._lock:
                self._saved[key] = (params, 200, body)
            return 200, body, False
        finally:
            with self._lock:
                self._running.discard(key)

    def _wait(self, phase: str, key: str) -> None:
        h = self._hold
        if h is not None and h.phase == phase and h.key in (None, key):
            h.key = key
            self._hold = None
            h.reached.set()
            h.release.wait(60)


def _error(kind: str, message: str) -> bytes:
    return json.dumps({"error": {"type": kind, "message": message}}).encode()

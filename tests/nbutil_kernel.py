"""A small driver for a real Jupyter kernel (jupyter_client): execute, click widgets, subshells.

Every iopub message is kept (``Kernel.iopub``) so tests and the W6 bench can count display
messages and bytes. Waiting is on messages and states, never on sleeps.
"""

from __future__ import annotations

import json
import os
import queue
import time
from typing import Any, Optional

from jupyter_client import KernelManager

START_TIMEOUT = float(os.environ.get("WE0NB_KERNEL_START_TIMEOUT", "120"))


class KernelError(AssertionError):
    pass


def _size(msg: dict[str, Any]) -> int:
    """Bytes of a message as it goes on the wire (its JSON frames, signatures excluded)."""
    return sum(len(json.dumps(msg.get(k, {}), default=str)) for k in ("header", "parent_header", "metadata", "content"))


class Kernel:
    """``kernel_dirs``/``kernel_name``: another kernelspec (e.g. an older ipykernel, see kernel_venvs)."""

    def __init__(self, cwd: Optional[str] = None, env: Optional[dict[str, str]] = None,
                 kernel_name: str = "python3", kernel_dirs: Optional[list[str]] = None):
        last: Optional[BaseException] = None
        for attempt in range(2):  # a fresh kernel occasionally misses its first heartbeat on a busy machine
            kw_km: dict[str, Any] = {}
            if kernel_dirs:
                from jupyter_client.kernelspec import KernelSpecManager

                kw_km["kernel_spec_manager"] = KernelSpecManager(kernel_dirs=kernel_dirs)
            km = KernelManager(kernel_name=kernel_name, **kw_km)
            try:
                kw: dict[str, Any] = {}
                if cwd:
                    kw["cwd"] = cwd
                if env:
                    kw["env"] = {**os.environ, **env}
                km.start_kernel(**kw)
                kc = km.client()
                kc.start_channels()
                kc.wait_for_ready(timeout=START_TIMEOUT)
            except Exception as exc:  # retry once
                last = exc
                try:
                    km.shutdown_kernel(now=True)
                except Exception:
                    pass
                continue
            self.km, self.kc = km, kc
            break
        else:
            raise KernelError(f"the kernel did not start twice: {last!r}")
        self.iopub: list[dict[str, Any]] = []
        self._by_parent: dict[str, list[dict[str, Any]]] = {}
        self._replies: dict[str, dict[str, Any]] = {}
        self._idle: set[str] = set()
        self.info = self._kernel_info()

    # ------------------------------------------------------------------ plumbing

    def _kernel_info(self) -> dict[str, Any]:
        msg_id = self.kc.kernel_info()
        reply = self._reply(msg_id, 60)
        return reply["content"]

    def _pump(self, timeout: float) -> bool:
        """Read one iopub message (and any shell replies); False when nothing came in time."""
        got = False
        while True:
            try:
                m = self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                break
            self._replies[m["parent_header"].get("msg_id", "")] = m
            got = True
        try:
            m = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return got
        self.iopub.append(m)
        pid = m["parent_header"].get("msg_id", "")
        self._by_parent.setdefault(pid, []).append(m)
        if m["msg_type"] == "status" and m["content"].get("execution_state") == "idle":
            self._idle.add(pid)
        return True

    def _reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while msg_id not in self._replies:
            if time.monotonic() > end:
                raise KernelError(f"no reply to {msg_id} within {timeout} s")
            self._pump(0.05)
        return self._replies[msg_id]

    def wait_idle(self, msg_id: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while msg_id not in self._idle:
            if time.monotonic() > end:
                raise KernelError(f"the kernel did not go idle after {msg_id} within {timeout} s")
            self._pump(0.05)

    def messages(self, msg_id: str) -> list[dict[str, Any]]:
        return self._by_parent.get(msg_id, [])

    # ------------------------------------------------------------------ execute

    def submit(self, code: str) -> str:
        return self.kc.execute(code, store_history=True, allow_stdin=False)

    def result(self, msg_id: str, timeout: float = 120) -> dict[str, Any]:
        reply = self._reply(msg_id, timeout)
        self.wait_idle(msg_id, timeout)
        msgs = self.messages(msg_id)
        stdout = "".join(m["content"]["text"] for m in msgs
                         if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")
        stderr = "".join(m["content"]["text"] for m in msgs
                         if m["msg_type"] == "stream" and m["content"]["name"] == "stderr")
        errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
        return {"reply": reply["content"], "stdout": stdout, "stderr": stderr, "errors": errors, "msgs": msgs}

    def run(self, code: str, timeout: float = 120) -> dict[str, Any]:
        """Execute ``code``; raise with the traceback if it failed."""
        r = self.result(self.submit(code), timeout)
        if r["reply"]["status"] != "ok":
            tb = "\n".join(r["reply"].get("traceback", [])) or str(r["errors"])
            raise KernelError(f"cell failed:\n{code}\n---\n{tb}\nstderr: {r['stderr']}")
        return r

    def eval(self, expr: str, timeout: float = 60) -> Any:
        out = self.run(f"import json as _j; print(_j.dumps({expr}, default=str))", timeout)["stdout"]
        return json.loads(out.strip().splitlines()[-1])

    def wait_for(self, expr: str, timeout: float = 60, what: str = "") -> Any:
        """Poll ``expr`` in the kernel until truthy (each poll is a round trip, not a sleep)."""
        end = time.monotonic() + timeout
        while True:
            value = self.eval(expr)
            if value:
                return value
            if time.monotonic() > end:
                raise KernelError(f"timed out waiting for {what or expr}")
            self._pump(0.02)  # drain iopub between polls

    # ------------------------------------------------------------------ widgets and subshells

    def click(self, comm_id: str, subshell_id: Optional[str] = None) -> str:
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id,
                                              "data": {"method": "custom", "content": {"event": "click"}}})
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def update_widget(self, comm_id: str, state: dict[str, Any], subshell_id: Optional[str] = None) -> str:
        """What a front end sends when a person edits a widget (a text box): its new state."""
        msg = self.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": state,
                                                                           "buffer_paths": []}})
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    @property
    def supports_subshells(self) -> bool:
        return "kernel subshells" in self.info.get("supported_features", [])

    def create_subshell(self, timeout: float = 30) -> str:
        msg = self.kc.session.msg("create_subshell_request", {})
        self.kc.control_channel.send(msg)
        end = time.monotonic() + timeout
        while True:
            try:
                reply = self.kc.control_channel.get_msg(timeout=1)
            except queue.Empty:
                if time.monotonic() > end:
                    raise KernelError("no create_subshell_reply")
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                content = reply["content"]
                if content.get("status") != "ok":
                    raise KernelError(f"create_subshell_request failed: {content}")
                return content["subshell_id"]

    # ------------------------------------------------------------------ stats

    def display_messages(self, since: int = 0) -> list[dict[str, Any]]:
        return [m for m in self.iopub[since:] if m["msg_type"] in ("display_data", "update_display_data")]

    @staticmethod
    def size(msg: dict[str, Any]) -> int:
        return _size(msg)

    def drain(self, quiet: float = 0.3) -> None:
        while self._pump(quiet):
            pass

    def shutdown(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


def execute_notebook(nb: Any, folder: Any, timeout: int = 120) -> Any:
    """Execute ``nb`` in place with nbclient, in ``folder``. nbclient waits only 4 s (its default
    ``iopub_timeout``) for a cell's outputs after the kernel's reply, then drops them with a
    warning: on a loaded machine a cell's printed text went missing that way. Wait as long as
    the cell may run, and fail loudly instead of losing output."""
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", iopub_timeout=timeout,
                            raise_on_iopub_timeout=True, resources={"metadata": {"path": str(folder)}})
    client.execute()
    return nb

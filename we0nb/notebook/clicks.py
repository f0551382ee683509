"""Abort clicks that reach a run while another cell awaits, and when each click happened.

ipykernel 6 queues every shell message — widget clicks included — behind the cell that is
running, so an Abort clicked while the next cell awaits ``panel.wait()`` would only be
handled once that cell ended (after the run, and its side effects, had finished).
ipykernel 7.4 dispatches comm messages past a running cell, and 7.0–7.3 do when the
front end sends them on a kernel subshell (JupyterLab 4.4+ does by default).

On ipykernel 6 the shell socket's messages still arrive on the kernel's event loop at
once (only their handling is queued), so :func:`install` wraps that receive callback:
each incoming message is peeked at — its signature checked with the session key, nothing
consumed — and a click on a registered Abort button aborts the run right there. The
message then joins the queue as before; when its turn comes the button's handler sees
that this click was already handled (:func:`handled`) and does nothing.

The Approve and Deny buttons of the approval rows are registered the same way, and so are
their text boxes (:func:`register_state`): an edit of the arguments is an ``update``
message queued behind the running cell too, so its value is read as it arrives and the
click that follows it uses what the person typed.

A blocking cell (``time.sleep``, a sync call) holds the loop itself: no version can
handle a click then, and the click waits until that cell ends.
"""

from __future__ import annotations

import datetime as _dt
import hmac
import logging
import time
import weakref
from functools import partial
from typing import Any, Callable, Optional

__all__ = ["install", "register", "register_state", "unregister", "handled", "click_time", "kernel_version",
           "current_click_header"]

log = logging.getLogger(__name__)

#: comm id of an Abort button -> weak reference to the callback taking the click's header
_targets: dict[str, Callable[[], Optional[Callable[[dict], None]]]] = {}
#: comm id of a text box -> weak reference to the callback taking its new state (``update`` messages)
_states: dict[str, Callable[[], Optional[Callable[[dict], None]]]] = {}
#: msg ids of clicks already handled on arrival (their queued copies are skipped)
_early: set[str] = set()


def _kernel() -> Any:
    try:
        from IPython.core.getipython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    return getattr(ip, "kernel", None) if ip is not None else None


def current_click_header() -> Optional[dict]:
    """The header of the comm message being handled (a click), when there is one."""
    kernel = _kernel()
    try:
        parent = kernel.get_parent("shell") if kernel is not None else None
    except Exception:  # pragma: no cover - kernels without get_parent
        return None
    header = (parent or {}).get("header") or {}
    return header if header.get("msg_type") == "comm_msg" else None


def kernel_version() -> Optional[tuple[int, ...]]:
    try:
        import ipykernel
    except ImportError:
        return None
    parts = []
    for piece in str(getattr(ipykernel, "__version__", "0")).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _ref(fn: Callable[..., None]) -> Callable[[], Optional[Callable[..., None]]]:
    return weakref.WeakMethod(fn) if hasattr(fn, "__self__") else (lambda: fn)


def register(comm_id: str, on_click: Callable[[dict], None]) -> None:
    """Call ``on_click(header)`` as soon as a click on the widget ``comm_id`` arrives."""
    _targets[comm_id] = _ref(on_click)


def register_state(comm_id: str, on_state: Callable[[dict], None]) -> None:
    """Call ``on_state(state)`` as soon as a state update of the widget ``comm_id`` arrives
    (a text box edited while another cell runs); the update itself is still applied in turn."""
    _states[comm_id] = _ref(on_state)


def unregister(comm_id: str) -> None:
    _targets.pop(comm_id, None)
    _states.pop(comm_id, None)


def handled(header: Optional[dict]) -> bool:
    """Whether the click of this message header was already handled on arrival (then forget it)."""
    msg_id = (header or {}).get("msg_id")
    if msg_id in _early:
        _early.discard(msg_id)
        return True
    return False


def click_time(header: Optional[dict]) -> float:
    """When the front end sent the message (its header ``date``, epoch seconds); now if unknown."""
    date = (header or {}).get("date")
    if isinstance(date, str):
        try:
            date = _dt.datetime.fromisoformat(date.replace("Z", "+00:00"))
        except ValueError:
            date = None
    if isinstance(date, _dt.datetime):
        if date.tzinfo is None:
            date = date.replace(tzinfo=_dt.timezone.utc)
        return date.timestamp()
    return time.time()


def _peek(session: Any, msg_list: list) -> None:
    if not _targets and not _states:
        return
    _idents, frames = session.feed_identities(msg_list, copy=False)
    raw = [getattr(f, "bytes", f) for f in frames[:5]]
    if len(raw) < 5:
        return
    if session.auth is not None and not hmac.compare_digest(raw[0], session.sign(raw[1:5])):
        return  # not signed with this kernel's key: leave it to the normal path, which rejects it
    header = session.unpack(raw[1])
    if header.get("msg_type") != "comm_msg":
        return
    content = session.unpack(raw[4])
    data = content.get("data") or {}
    if data.get("method") == "update":
        ref = _states.get(content.get("comm_id"))
        on_state = ref() if ref is not None else None
        if on_state is not None and isinstance(data.get("state"), dict):
            on_state(data["state"])
        return
    if data.get("method") != "custom" or (data.get("content") or {}).get("event") != "click":
        return
    ref = _targets.get(content.get("comm_id"))
    target = ref() if ref is not None else None
    if target is not None:
        _early.add(header.get("msg_id"))
        target(header)


def install() -> bool:
    """Handle Abort clicks on arrival in this kernel (ipykernel 6 only; later ones need nothing).

    Returns whether the fast path is active. Safe to call more than once.
    """
    kernel = _kernel()
    if kernel is None:
        return False
    if getattr(kernel, "_we0nb_fast_clicks", False):
        return True
    version = kernel_version()
    stream = getattr(kernel, "shell_stream", None)
    if version is None or version[0] != 6 or stream is None or not hasattr(kernel, "schedule_dispatch"):
        return False
    original = partial(kernel.schedule_dispatch, kernel.dispatch_shell)

    def on_recv(msg_list: list) -> None:
        try:
            _peek(kernel.session, msg_list)
        except Exception:  # never lose a message because of the peek
            log.exception("we0nb: could not inspect a shell message")
        original(msg_list)

    stream.on_recv(on_recv, copy=False)
    kernel._we0nb_fast_clicks = True
    return True

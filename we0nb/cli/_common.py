"""What every command shares: the user-facing error, printing, quoting hints, and Ctrl-C.

Ctrl-C is an abort: while a run goes on it sets that run's abort event (the run stops where
it is and everything so far is persisted); anywhere else it cancels the command. Either
way the command ends with one line and exit code 130, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["CliError", "CtrlC", "say", "rule", "hint", "json_object", "safe_url", "check_name", "EXIT_INTERRUPTED"]

EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error whose message is shown to the user as is (exit code 1)."""


def say(s: str = "") -> None:
    print(s, flush=True)


def rule(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(3, 78 - len(title)))


def hint(*words: str) -> str:
    """A command line the user can paste: every word shell-quoted (ids and URLs may hold spaces),
    a URL's password hidden (it is never printed)."""
    return " ".join(shlex.quote(safe_url(w) if "://" in w else w) for w in words)


def safe_url(url: str) -> str:
    """The URL with its password hidden (for messages); a URL without one as it is."""
    try:
        from sqlalchemy.engine import make_url

        u = make_url(url)
    except Exception:  # (it does not parse: hide what looks like a password all the same)
        from ..persistence.sql.errors import masked_url

        return masked_url(url)
    return url if u.password is None else u.render_as_string(hide_password=True)


def check_name(value: str, flag: str, what: str = "session ids") -> str:
    """An id typed on the command line, by the engine's rule (``check_session_id``), refused in
    the words of the flag that gave it (the API's messages name its parameters)."""
    from ..engine.request import check_session_id

    try:
        return check_session_id(value, flag, what)
    except ValueError as e:
        raise CliError(str(e)) from None


def check_batch(value: str, flag: str) -> str:
    """A batch name typed on the command line, by the engine's rule (``check_batch_name``)."""
    from ..engine.request import check_batch_name

    try:
        return check_batch_name(value, flag)
    except ValueError as e:
        raise CliError(str(e)) from None


def json_object(text: str, flag: str, holding: str, example: str, outcome: str = "") -> dict[str, Any]:
    """The JSON object a flag such as ``--input`` holds; anything else is one line naming the
    flag, what it should hold and an example (``holding``: "the corrected arguments"), then
    ``outcome`` (e.g. "Nothing was sent.")."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{flag} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); expected "
                       f"{holding} as a JSON object, e.g. {flag} '{example}'. {outcome}".rstrip()) from None
    if not isinstance(value, dict):
        raise CliError(f"{flag} must be a JSON object ({{...}}) holding {holding}, got {type(value).__name__}. {outcome}".rstrip())
    return value


class CtrlC:
    """Ctrl-C (SIGINT) for one command: aborts the run going on, else cancels the command.

    ``pressed`` says whether it happened; :meth:`during` marks the span of one run.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._abort: Optional[asyncio.Event] = None
        self._task: Optional[asyncio.Task] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def install(self) -> "CtrlC":
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
            self._loop = loop
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            self._loop = None
        return self

    def uninstall(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._loop = None

    @contextmanager
    def during(self, abort: asyncio.Event) -> Iterator[None]:
        """Within this block Ctrl-C sets ``abort`` instead of cancelling the command."""
        self._abort = abort
        try:
            yield
        finally:
            self._abort = None

    def _on_sigint(self) -> None:
        self.pressed = True
        if self._abort is not None and not self._abort.is_set():
            self._abort.set()
            sys.stderr.write("\n^C: aborting the run where it is (everything so far is persisted)\n")
            sys.stderr.flush()
        elif self._task is not None:  # outside a run, or a second Ctrl-C: stop the command
            self._task.cancel()

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

__all__ = ["CliError", "CtrlC", "say", "rule", "hint", "json_object", "EXIT_INTERRUPTED"]

EXIT_INTERRUPTED = 130


class CliError(Exception):
    """An error whose message is shown to the user as is (exit code 1)."""


def say(s: str = "") -> None:
    print(s, flush=True)


def rule(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(3, 78 - len(title)))


def hint(*words: str) -> str:
    """A command line the user can paste: every word shell-quoted (ids and URLs may hold spaces)."""
    return " ".join(shlex.quote(w) for w in words)


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

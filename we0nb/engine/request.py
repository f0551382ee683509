"""The run request and result, and the validation every entry point goes through.

``build_request()`` is the single gate: ``stream()`` and ``invoke()`` validate through
it, so the exact ``ValueError`` messages of the spec come from here and only here.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

from .._ids import new_id
from .._text import clean
from ..messages import ToolPart, Usage, _Displayable

__all__ = ["UserInput", "user_message", "RunRequest", "RunResult", "build_request", "check_session_id", "Mode",
           "MAX_SESSION_ID"]

Mode = Literal["prompt", "resume"]
MODES = ("prompt", "resume")

#: control characters (C0, DEL, C1), line and paragraph separators, the invisible bidi and
#: zero-width format characters (an id that reads as another, or reorders the line it is shown
#: in), and lone surrogates
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]")

#: the longest session id, on every backend (PostgreSQL indexes it as varchar(255))
MAX_SESSION_ID = 255


def check_session_id(session_id: object, where: str = "session_id", what: str = "session ids") -> str:
    """The one rule for session ids on every backend: a non-empty string of at most 255
    characters, without control characters (NUL included) or invisible format characters
    (:data:`_UNPRINTABLE`). Raises TypeError/ValueError, saying
    ``where`` the value came from and ``what`` it is (a batch's name follows the same rule)."""
    if not isinstance(session_id, str):
        raise TypeError(f"{where} must be a string, got {type(session_id).__name__}.")
    if not session_id.strip():
        raise ValueError(f"{where} must not be empty.")
    if len(session_id) > MAX_SESSION_ID:
        raise ValueError(f"{where} is {len(session_id)} characters long; {what} have at most "
                         f"{MAX_SESSION_ID} characters. Use a shorter id (or a hash of yours).")
    bad = _UNPRINTABLE.search(session_id)
    if bad is not None:
        raise ValueError(f"{where} contains the character {bad.group()!r}; {what} must be printable "
                         "text (no control or invisible format characters).")
    return session_id


def check_batch_name(name: object, where: str = "name") -> str:
    """A batch's name: the rule of session ids, and no space at either end — typed again by hand on
    another host (``we0nb batch work``), a stray space would name a second batch, all of whose
    items run again."""
    check_session_id(name, where, "batch names")
    assert isinstance(name, str)
    if name != name.strip():
        raise ValueError(f"{where} {name!r} starts or ends with a space; batch names are typed again on every "
                         f"worker: use {name.strip()!r}.")
    return name


@dataclass(frozen=True)
class UserInput:
    """One user message to write at the start of a prompt run."""

    text: str


def user_message(text: str) -> UserInput:
    """A user message for ``messages=[...]`` of a prompt run."""
    if not isinstance(text, str):
        raise TypeError(f"user_message() expects a string, got {type(text).__name__}.")
    return UserInput(clean(text))


@dataclass(frozen=True)
class RunRequest(_Displayable):
    """A validated run: what ``stream()``/``invoke()`` will do. Building it runs nothing."""

    abort: asyncio.Event = field(repr=False)
    mode: Mode
    session_id: str
    messages: Optional[tuple[UserInput, ...]]
    run_id: str
    new_session: bool = False


@dataclass
class RunResult(_Displayable):
    """How a run ended.

    ``finish_reason`` is the model's reason for ending the last step: ``"stop"``,
    ``"length"`` when the reply was cut at the token limit (``truncated`` is then True),
    ``"content-filter"``, … (None when no step ran).

    ``result``: ``"stop"`` (the turn is over), ``"compact"`` (the history was summarised;
    resume continues) or ``"approval"`` (calls wait for a person's decision: they are in
    ``approvals``, in call order; approve or deny them, then resume).
    """

    result: Literal["stop", "compact", "approval"]
    session_id: str
    text: str = ""
    output: Any = None
    message_id: Optional[str] = None
    steps: int = 0
    usage: Usage = field(default_factory=Usage)
    run_id: str = ""
    approvals: list[ToolPart] = field(default_factory=list)
    finish_reason: Optional[str] = None
    #: the run's model calls' cost in USD (None when any of them has no known price)
    cost: Optional[float] = None

    @property
    def truncated(self) -> bool:
        """The last reply was cut at the token limit (``max_tokens``): the text is incomplete."""
        return self.finish_reason == "length"


def build_request(*, abort: Optional[asyncio.Event] = None, mode: str = "prompt",
                  session_id: Optional[str] = None,
                  messages: Optional[Sequence[UserInput]] = None) -> RunRequest:
    if mode not in MODES:
        raise ValueError(f"mode must be 'prompt' or 'resume', got {mode!r}.")
    if abort is None:
        abort = asyncio.Event()
    elif not isinstance(abort, asyncio.Event):
        raise TypeError(
            f"abort must be an asyncio.Event, got {type(abort).__name__}. "
            "Create one with asyncio.Event() and call .set() on it to abort the run."
        )
    if mode == "prompt":
        if messages is None:
            raise ValueError("messages is required in prompt mode.")
        if isinstance(messages, (str, bytes, UserInput)) or not isinstance(messages, Sequence):
            raise TypeError(
                "messages must be a list of user_message(...) items, "
                f"e.g. messages=[user_message('hi')]; got {type(messages).__name__}."
            )
        if len(messages) == 0:
            raise ValueError("messages must contain at least one user_message(...) in prompt mode.")
        for i, m in enumerate(messages):
            if not isinstance(m, UserInput):
                raise TypeError(
                    f"messages[{i}] must be built with user_message(text), got {type(m).__name__}."
                )
        msgs: Optional[tuple[UserInput, ...]] = tuple(messages)
    else:
        if messages is not None:
            raise ValueError("messages is not allowed in resume mode.")
        msgs = None
    new_session = False
    if session_id is None:
        if mode == "resume":
            raise ValueError(
                "session_id is required in resume mode: pass the id of the session to resume."
            )
        session_id = new_id("ses")
        new_session = True
    else:
        check_session_id(session_id)
    return RunRequest(abort=abort, mode=mode, session_id=session_id, messages=msgs,  # type: ignore[arg-type]
                      run_id=new_id("run"), new_session=new_session)

"""Errors a caller can catch by name; every message says what happened and what to do."""

from __future__ import annotations

__all__ = [
    "We0Error",
    "ReplayMismatchError",
    "SessionBusyError",
    "LeaseLostError",
    "MaxStepsExceeded",
    "ModelError",
    "OutputValidationError",
    "ScriptExhaustedError",
    "PersistenceError",
    "CorruptRecordError",
    "SchemaVersionError",
    "ModelProviderError",
    "ModelAuthenticationError",
    "ContextWindowExceeded",
    "CompactionError",
    "MCPServerError",
]


class We0Error(Exception):
    """Base class of we0nb's own errors."""


class SessionBusyError(We0Error):
    """Another run holds the session's lease (in this process or another one)."""

    def __init__(self, session_id: str, owner: str | None = None):
        self.session_id = session_id
        self.owner = owner
        held = f" (held by {owner})" if owner else ""
        super().__init__(
            f"Session {session_id!r} is busy: another run is in progress{held}. "
            "Wait for it to finish or abort it, then try again."
        )


class LeaseLostError(SessionBusyError):
    """A run lost its session lease to another run (its heartbeat could not renew it in time).

    The run stops at its next durability point and writes nothing more: the other run now
    owns the session.
    """

    def __init__(self, session_id: str, owner: str | None = None):
        SessionBusyError.__init__(self, session_id, owner)
        held = f" to {owner}" if owner else ""
        self.args = (
            f"The run on session {session_id!r} lost its lease{held} (it could not renew it within "
            "lease_ttl, e.g. the event loop was blocked or the host was unreachable). It stopped and "
            "wrote nothing more; another run owns the session now. Resume it once that run has ended.",
        )


class MaxStepsExceeded(We0Error):
    """The run reached the agent's ``max_steps`` without the model ending its turn."""

    def __init__(self, session_id: str, max_steps: int):
        self.session_id = session_id
        self.max_steps = max_steps
        super().__init__(
            f"The run on session {session_id!r} reached max_steps={max_steps} without the model "
            "ending its turn. Everything so far is persisted; raise We0Agent(max_steps=...) and "
            "resume with mode='resume' to continue."
        )


class ModelError(We0Error):
    """The model failed during a step; the error is recorded on the assistant message.

    The message is left unfinished, so ``mode="resume"`` continues the turn. A provider's
    own error (a :class:`ModelProviderError` such as :class:`ModelAuthenticationError`) reaches
    the caller as itself; any other exception a model raises arrives wrapped in a
    ``ModelError`` whose ``cause`` (and ``__cause__``) is the original. Either way
    ``session_id`` and ``message_id`` say where it happened.
    """

    session_id: "str | None" = None
    message_id: "str | None" = None
    cause: "BaseException | None" = None

    def __init__(self, session_id: "str | None" = None, message_id: "str | None" = None,
                 cause: "BaseException | None" = None, *, message: "str | None" = None):
        """The engine's wrapper of a model's exception; a subclass passes its own ``message``."""
        self.session_id = session_id
        self.message_id = message_id
        self.cause = cause
        if message is None:
            message = (
                f"The model failed in session {session_id!r} (assistant message {message_id!r}): "
                f"{type(cause).__name__}: {str(cause).rstrip('.')}. The partial output is persisted; "
                "run again with mode='resume' to continue the turn."
            )
        super().__init__(message)


class OutputValidationError(We0Error):
    """The model kept returning structured output that does not validate."""


class ScriptExhaustedError(ModelError):
    """A ScriptedModel was called more often than it was scripted."""

    def __init__(self, message: str):
        super().__init__(message=message)


class PersistenceError(We0Error):
    """The persistence backend cannot be used as configured."""


class CorruptRecordError(PersistenceError):
    """A persisted row does not parse or validate; names the ids involved."""


class SchemaVersionError(PersistenceError):
    """The database was written by a newer version of we0nb."""


class ModelProviderError(ModelError):
    """A model provider (an HTTP API) failed: a status error after retries, a cut stream, bad data.

    ``status_code`` is the HTTP status when there was one; ``retryable`` says whether trying
    again later may help (rate limits, 5xx, a dropped connection). The engine sets
    ``session_id``/``message_id`` before the error reaches the caller; the SDK's own
    exception, when there was one, is its ``__cause__``.
    """

    def __init__(self, message: str, *, status_code: int | None = None, retryable: bool = False):
        super().__init__(message=message)
        self.status_code = status_code
        self.retryable = retryable


class ModelAuthenticationError(ModelProviderError):
    """The provider refused the credentials (HTTP 401/403); retrying will not help."""


class ContextWindowExceeded(ModelProviderError):
    """The request does not fit the model's context window.

    The engine answers it with a compaction (a summary of the history) instead of failing
    the run, unless compaction is disabled (``We0Agent(compaction_threshold=None)``).
    """


class CompactionError(We0Error):
    """Compaction cannot shrink the history enough: summarising again would loop.

    Raised when the summary itself is too large for the threshold, or when the first step
    after a summary is already over the threshold (or over the context window).
    """


class MCPServerError(We0Error):
    """An MCP server could not be started or connected (its first connection: a run raises it
    before writing anything). Failures of a server during calls are tool errors instead."""


class ReplayMismatchError(ModelError):
    """A :class:`~we0nb.ReplayModel` call that the recording cannot answer: in strict mode the
    history sent differs from what the recorded run sent at that step (the message names the
    step, from 1, and shows a diff of the first difference), or the call is past the last
    recorded step."""

    def __init__(self, message: str, *, step: int):
        super().__init__(message=message)
        self.step = step

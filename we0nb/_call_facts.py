"""The one reading of what SPEC §11 (exactly-once) keeps in a tool state's metadata.

The engine writes ``idempotency_key``, ``attempt``, ``in_doubt`` and ``reconciled``; everything
that shows them — :class:`~we0nb.messages.ToolPart`'s properties, the frames of every store,
transcripts, the CLI, the plots — reads them with these functions, so a call is "in doubt" in
one sense only, and is described in the same words everywhere (re-exported by
:mod:`we0nb.messages`).
"""

from __future__ import annotations

from typing import Any, Optional

from ._ids import call_key

__all__ = ["call_key_of", "attempts_of", "in_doubt_of", "effect_label", "MAY_HAVE_RUN", "NEVER_STARTED",
           "COMPLETED_ON_RESUME"]


def call_key_of(session_id: str, part_id: str, stored: Any) -> str:
    """A call's idempotency key: ``stored`` (its metadata's) when it is a string, else derived."""
    return stored if isinstance(stored, str) else call_key(session_id, part_id)


def attempts_of(stored: Any) -> int:
    """How many executions started, from metadata ``attempt`` (0 when absent or not an int)."""
    return stored if isinstance(stored, int) and not isinstance(stored, bool) else 0


def in_doubt_of(interrupted: bool, stored: Any) -> Optional[bool]:
    """Metadata ``in_doubt`` of an interrupted call (True/False as written); None otherwise."""
    return stored if interrupted and isinstance(stored, bool) else None


#: what a person reads about a call recovery settled (badges, the CLI, the plots' legend)
MAY_HAVE_RUN = "may have run"
NEVER_STARTED = "never started"
COMPLETED_ON_RESUME = "completed on resume"


def effect_label(in_doubt: Optional[bool], reconciled: bool) -> Optional[str]:
    """The words for what recovery knows of a call's effect: interrupted and in doubt → "may have
    run", interrupted and not in doubt → "never started", completed by its reconcile → "completed
    on resume"; None for any other call."""
    if in_doubt is True:
        return MAY_HAVE_RUN
    if in_doubt is False:
        return NEVER_STARTED
    return COMPLETED_ON_RESUME if reconciled else None

"""The batch records at the persistence port: a named batch, its items, and an item's end.

A batch is a list of prompts, each run as its own session (see :mod:`we0nb.batch`). The
store keeps, per item, its prompt, its session id and its state, so several processes on
one database share the work: an item is *claimed* (``status == "running"``, an ``owner``
and an ``expires`` time the owner keeps renewing) and then *ended* with its outcome. An
item is claimable when it is ``queued`` (someone should run it) and its claim has expired
(``expires < now``): never claimed, given up, or held by a worker that stopped renewing.
Every write that ends or renews a claim is conditional on the owner still holding it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["BATCH_STATUSES", "ENDED", "BatchItem", "BatchInfo", "ItemEnd", "NewItem", "fingerprint",
           "check_same_prompts"]

#: every status an item can have (``pending``: never started; ``running``: claimed by a worker)
BATCH_STATUSES = ("pending", "running", "stop", "compact", "approval", "failed", "aborted")
#: statuses a continuation does not run again by itself (approval waits for a decision,
#: failed for ``retry_failed=True``)
ENDED = ("stop", "compact", "approval", "failed")


@dataclass(frozen=True)
class NewItem:
    """An item as a batch is created: its prompt (JSON text: the user messages) and session."""

    prompt: str
    session_id: str


@dataclass
class BatchItem:
    """One item as stored. Counts are the session's totals (steps, tool calls, tokens);
    ``duration`` the seconds its runs took, summed; ``attempts`` how many runs it had."""

    batch: str
    item: int
    session_id: str
    prompt: str
    status: str = "pending"
    queued: bool = True
    owner: Optional[str] = None
    expires: float = 0.0
    attempts: int = 0
    started: Optional[float] = None
    finished: Optional[float] = None
    duration: float = 0.0
    text: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class ItemEnd:
    """How one run of an item ended, written by :meth:`Persistence.end_batch_item`.

    ``status`` is the item's new status; ``queued`` whether it should run again (an
    aborted or rate-limited item: yes); ``not_before`` keeps it unclaimable until then
    (a back-off); ``attempts``/``started`` are absolute (a claim that never started a run
    gives its attempt back); ``run_time`` is added to the item's ``duration``.
    """

    status: str
    queued: bool = False
    finished: Optional[float] = None
    run_time: float = 0.0
    attempts: int = 0
    started: Optional[float] = None
    not_before: float = 0.0
    text: Optional[str] = None
    output: Optional[str] = None
    error: Optional[str] = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class BatchInfo:
    """A batch: ``counts`` by status; ``unfinished`` items still queued or running."""

    name: str
    created: float
    updated: float
    items: int
    fingerprint: str
    counts: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0


def fingerprint(items: Sequence[NewItem]) -> str:
    """A digest of every prompt, in order (a quick equality test of two batches' prompts)."""
    h = hashlib.sha256()
    for it in items:
        h.update(it.prompt.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def check_same_prompts(name: str, stored: Sequence[tuple[str, str]], given: Sequence[NewItem],
                       session_ids_given: bool) -> None:
    """Raise ValueError naming the batch and the first item that differs.

    ``stored``: ``(prompt, session_id)`` per item, in order. Session ids are compared only
    when the caller gave them (generated ones differ by construction).
    """
    for i in range(max(len(stored), len(given))):
        if i >= len(stored) or i >= len(given):
            raise ValueError(
                f"Batch {name!r} already exists with {len(stored)} items, but {len(given)} prompts were given: "
                f"item {i} differs. Pass the same prompts to continue it, or another name for a new batch."
            )
        prompt, sid = stored[i]
        if prompt != given[i].prompt:
            raise ValueError(
                f"Batch {name!r} already exists with other prompts: item {i} differs (stored {_short(prompt)}, "
                f"given {_short(given[i].prompt)}). Pass the same prompts to continue it, or another name "
                "for a new batch."
            )
        if session_ids_given and sid != given[i].session_id:
            raise ValueError(
                f"Batch {name!r} already exists with other session ids: item {i} differs (stored {sid!r}, "
                f"given {given[i].session_id!r}). Pass the same session_ids (or none) to continue it."
            )


def _short(prompt_json: str, n: int = 60) -> str:
    return repr(prompt_json if len(prompt_json) <= n else prompt_json[: n - 1] + "…")

"""The frames' column reads: a store's sessions, messages, parts and batches as columns, in bulk.

:class:`ColumnReads` is the capability (a store that has it opens a :class:`ColumnReader`);
the reader returns plain Python columns (:class:`Fetched`: chunks of ``name → tuple``) that the
notebook layer types into DataFrames — no pandas here. Every store of this package has it:
:class:`~we0nb.SqlPersistence` reads its tables with one SQL query per view
(:mod:`.sql.columns`), :class:`~we0nb.MemoryPersistence` its own records (:mod:`.memory_columns`).
Both give the same columns for the same history (the conformance suite checks it).

The columns: the flattened ones of :mod:`.sql.tables` (the one definition, NUL → U+FFFD and
lengths cut as stored) plus the values only a record's JSON holds (text, tool input/output,
approval details), whole. ``since``/``until`` select by creation time in whole microseconds
(``floor(t * 1e6 + 0.5)``, since inclusive, until exclusive): sessions by their own, messages by
theirs, parts by their message's.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from .batches import BatchInfo, BatchItem

__all__ = ["CATEGORIES", "CorruptRow", "Fetched", "ColumnReader", "ColumnReads", "Convert",
           "SESSION_NAMES", "MESSAGE_NAMES", "PART_NAMES", "TOOL_CALL_NAMES"]

#: the values a categorical column can hold, in the order frames show them
CATEGORIES: dict[str, tuple[str, ...]] = {
    "role": ("user", "assistant"),
    "type": ("text", "reasoning", "tool", "step-start", "step-finish", "compaction"),
    "status": ("pending", "running", "completed", "error"),
    "interrupt_reason": ("resume", "prompt", "blocked", "fork"),
    "approval": ("requested", "approved", "denied"),
}

#: the columns of each view, in the order a reader returns them
SESSION_NAMES = ("session_id", "created", "updated", "messages", "revert_message_id", "title", "forked_from",
                 "forked_at")
MESSAGE_NAMES = ("session_id", "message_id", "role", "created", "completed", "parent_id", "model_id", "finish_reason",
                 "error_reason", "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "summary",
                 "error_message", "cost")
PART_NAMES = ("session_id", "message_id", "part_id", "tool", "status", "start", "end", "type", "text")
TOOL_CALL_NAMES = ("session_id", "message_id", "part_id", "tool", "status", "start", "end", "call_id", "interrupted",
                   "interrupt_reason", "recalled", "input", "output", "error", "metadata", "approval",
                   "approval_reason", "approved_input", "decided", "idempotency_key", "attempts", "in_doubt",
                   "reconciled", "attachments")

#: applied to each chunk (``name → tuple of values``) as it is read (e.g. into arrays)
Convert = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True)
class CorruptRow:
    """A row whose JSON document does not parse: its ids, and why."""

    table: str
    session_id: Optional[str]
    message_id: Optional[str]
    part_id: Optional[str]
    detail: str

    def __str__(self) -> str:
        if self.part_id is not None:
            what = f"part {self.part_id!r} of message {self.message_id!r}"
        elif self.message_id is not None:
            what = f"message {self.message_id!r}"
        else:
            what = "the session row"
        return f"{what} in session {self.session_id!r} ({self.table}: {self.detail})"


@dataclass
class Fetched:
    """A view's rows: ``chunks`` of columns (``convert`` applied), named ``names``.

    A chunk is a dict of column name → tuple of values (str, float, int, bool, None).
    ``corrupt`` lists the rows whose document did not parse. Rows are in no particular order.
    """

    names: list[str]
    chunks: list[Any] = field(default_factory=list)
    corrupt: list[CorruptRow] = field(default_factory=list)


@runtime_checkable
class ColumnReader(Protocol):
    """Synchronous bulk reads of one store (a frame is a plain call in a notebook cell).

    ``ids``: only these sessions; ``since``/``until``: creation times in microseconds (see the
    module). Close it (or use it as a context manager) when done."""

    #: the store as error messages and warnings name it
    where: str

    @abc.abstractmethod
    def sessions(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        """One row per session: :data:`SESSION_NAMES` (``messages``: how many it has)."""

    @abc.abstractmethod
    def messages(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        """One row per message: :data:`MESSAGE_NAMES`."""

    @abc.abstractmethod
    def parts(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
              until: Optional[int] = None, convert: Optional[Convert] = None, *, tools_only: bool = False) -> Fetched:
        """One row per part (:data:`PART_NAMES`; ``text``: a text/reasoning part's text or a compaction's
        summary), or per tool call with ``tools_only`` (:data:`TOOL_CALL_NAMES`: input and metadata as
        compact JSON, the approval's reason, corrected input and decision time, and the exactly-once
        facts as :class:`~we0nb.messages.ToolPart` reads them: ``idempotency_key``, ``attempts``,
        ``in_doubt`` (None unless interrupted) and ``reconciled``)."""

    @abc.abstractmethod
    def batches(self) -> list[BatchInfo]:
        """Every batch with its counts."""

    @abc.abstractmethod
    def batch_items(self, name: str) -> list[BatchItem]:
        """The items of batch ``name``, in item order."""

    def message_costs(self, ids: Optional[Sequence[str]] = None) -> Fetched:
        """``session_id``, ``role`` and ``cost`` of each message (what ``sessions_df`` sums per session);
        by default :meth:`messages`' rows, which have them (a reader may read just those three)."""
        return self.messages(ids)

    def close(self) -> None:
        """Release what the reader holds (an engine of its own)."""
        return None

    def __enter__(self) -> "ColumnReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@runtime_checkable
class ColumnReads(Protocol):
    """The capability of a store whose records the frames read in bulk."""

    @abc.abstractmethod
    def column_reader(self) -> ColumnReader:
        """A reader of this store (synchronous: callable from a notebook cell while a loop runs)."""

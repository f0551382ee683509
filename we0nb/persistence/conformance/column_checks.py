"""Checks of :class:`~we0nb.persistence.columns.ColumnReads`: the frames' columns agree with the records.

The reference is :class:`~we0nb.persistence.memory_columns.TranscriptColumns` over the transcripts
the store loads back: the flattening the SQL tables are written with, applied to the objects. A
store's bulk reads (SQL's one query per view) must give the same rows, whatever the backend.
Readers are synchronous (a frame is a plain call): the checks read in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional, Sequence, TypeVar

from ..._ids import call_key, new_id
from ...messages import ToolApproval, ToolPart, ToolStateCompleted, ToolStatePending, ToolTime
from ..batches import ItemEnd, NewItem
from ..columns import Fetched
from ..memory_columns import TranscriptColumns
from .harness import Check, Harness, check, equal, expect
from .history import nul_history, write

__all__ = ["CHECKS"]

CHECKS: list[Check] = []
columns = check(CHECKS, "sessions", "columns")
T = TypeVar("T")


async def _reading(h: Harness, read: Callable[[Any], T]) -> T:
    """``read(reader)`` on a reader of the store, in a worker thread; the reader closed after."""
    def go() -> T:
        with h.store.column_reader() as reader:
            return read(reader)

    return await asyncio.to_thread(go)


def _approvals(sid: str, message_id: str) -> list[ToolPart]:
    mk: dict[str, Any] = dict(session_id=sid, message_id=message_id)
    return [
        ToolPart(id=new_id("prt"), call_id="ap1", tool="deploy", state=ToolStatePending(input={"env": "prod"}),
                 approval="requested", approval_detail=ToolApproval(requested=20.0, why="it deploys"), **mk),
        ToolPart(id=new_id("prt"), call_id="ap2", tool="deploy",
                 state=ToolStateCompleted(input={"env": "test"}, output="ok", time=ToolTime(start=21.0, end=22.0),
                                          metadata={"original_input": {"env": "prod"}}),
                 approval="approved", approval_detail=ToolApproval(requested=20.0, decided=20.5, input={"env": "test"}),
                 **mk),
        ToolPart(id=new_id("prt"), call_id="ap3", tool="deploy", state=ToolStatePending(input={}), approval="denied",
                 approval_detail=ToolApproval(requested=20.0, decided=20.7, reason="not today"), **mk),
    ]


async def _histories(h: Harness) -> list[str]:
    """Three sessions: every kind of part, NUL everywhere, approvals (of a message created at 11.0)."""
    p = h.store
    a, b = new_id("ses"), new_id("ses")
    msgs, _ = await write(p, a, title="first")
    s, (u, m), parts = nul_history(b)
    await p.upsert_session(s)
    await p.commit([(u, parts[:1], None), (m, parts[1:], None)])
    await p.commit([(None, _approvals(a, msgs[1].id), None)])
    c = new_id("ses")
    await write(p, c, title="third")
    return [a, b, c]


def _rows(got: Fetched) -> list[tuple[Any, ...]]:
    """The rows of a view, whatever its chunks, sorted (a reader gives them in no order)."""
    out: list[tuple[Any, ...]] = []
    for chunk in got.chunks:
        cols = [chunk[n] for n in got.names]
        out.extend(tuple(_plain(v) for v in row) for row in zip(*cols))
    return sorted(out, key=repr)


def _plain(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v  # (a driver may give a boolean column as 0/1)


async def _reference(h: Harness, sids: Sequence[str]) -> TranscriptColumns:
    q = h.fresh()
    transcripts = [await q.load_transcript(sid) for sid in sids]
    return TranscriptColumns("reference", lambda: transcripts, lambda: [], lambda name: [])


def _compare(reader: Any, ref: TranscriptColumns, ids: Optional[list[str]], since: Optional[int],
             until: Optional[int]) -> dict[str, int]:
    counts = {}
    for view, call in (("sessions", lambda r: r.sessions(ids, since, until)),
                       ("messages", lambda r: r.messages(ids, since, until)),
                       ("parts", lambda r: r.parts(ids, since, until)),
                       ("tool calls", lambda r: r.parts(ids, since, until, tools_only=True))):
        got, want = call(reader), call(ref)
        equal(got.names, want.names, f"the columns of {view}")
        equal(got.corrupt, [], f"corrupt rows in {view}")
        rows, expected = _rows(got), _rows(want)
        for r, e in zip(rows, expected):
            equal(dict(zip(got.names, r)), dict(zip(want.names, e)), f"a row of {view}")
        equal(len(rows), len(expected), f"the number of rows of {view}")
        counts[view] = len(rows)
    return counts


@columns
async def column_reads_agree_with_the_records(h: Harness) -> None:
    """Sessions, messages, parts and tool calls as columns: the records' own values (NUL, approvals,
    every part kind), read in bulk."""
    sids = await _histories(h)
    ref = await _reference(h, sids)
    where, counts = await _reading(h, lambda reader: (reader.where, _compare(reader, ref, sids, None, None)))
    expect(isinstance(where, str) and where, "the reader names its store")
    equal(counts, {"sessions": 3, "messages": 6, "parts": 34, "tool calls": 19}, "the rows read")


@columns
async def column_reads_select_sessions_and_creation_times(h: Harness) -> None:
    """``ids`` selects sessions; ``since``/``until`` creation times in whole microseconds (since
    inclusive, until exclusive; parts by their message's)."""
    sids = await _histories(h)
    ref = await _reference(h, sids)

    def read(reader: Any) -> None:
        only = _compare(reader, ref, sids[:1], None, None)
        equal(only, {"sessions": 1, "messages": 2, "parts": 16, "tool calls": 10}, "one session's rows")
        window = _compare(reader, ref, sids, 11_000_000, 11_000_001)  # the assistant messages created at 11.0
        equal(window, {"sessions": 0, "messages": 2, "parts": 27, "tool calls": 17}, "rows created at 11.0")
        equal(_compare(reader, ref, sids, None, 1_500_000)["sessions"], 0, "sessions created before 1.5 s")
        equal(_compare(reader, ref, sids, 1_500_000, None)["sessions"], 3, "sessions created from 1.5 s")

    await _reading(h, read)


@columns
async def column_reads_of_exactly_once_facts(h: Harness) -> None:
    """A tool call's key, attempts, in doubt and reconciled (SPEC §11) as the engine wrote them in
    its metadata; a member of the wrong JSON type is not read (the key is then derived)."""
    sids = await _histories(h)
    got = await _reading(h, lambda reader: reader.parts(sids[:2], tools_only=True))
    every = [dict(zip(got.names, row)) for chunk in got.chunks for row in zip(*(chunk[n] for n in got.names))]
    rows = {r["call_id"]: r for r in every if r["session_id"] == sids[0]}
    names = ("idempotency_key", "attempts", "in_doubt", "reconciled")

    def facts(call_id: str) -> tuple[Any, ...]:
        r = rows[call_id]
        return tuple(_plain(r[n]) if n != "in_doubt" else r[n] for n in names)

    def derived(call_id: str) -> str:
        return call_key(rows[call_id]["session_id"], rows[call_id]["part_id"])

    equal(facts("c1"), (derived("c1"), 0, None, 0), "a pending call with members of the wrong types")
    equal(facts("c2"), ("key-c2", 1, None, 0), "a running call")
    equal(facts("c3"), (derived("c3"), 2, None, 0), "a recalled call without a stored key")
    equal(facts("c4"), ("key-c4", 1, True, 0), "a call interrupted while running")
    equal(facts("c6"), ("key-c6", 1, None, 1), "a call completed by its reconcile")
    equal(facts("c7"), (derived("c7"), 0, False, 0), "a call interrupted before it started")
    nul = [r for r in every if r["tool"] == "t2"]
    equal([(_plain(r["attempts"]), r["in_doubt"], _plain(r["reconciled"]), r["idempotency_key"]) for r in nul],
          [(0, None, 0, call_key(nul[0]["session_id"], nul[0]["part_id"]))],
          "an interrupted call whose members have the wrong types (read off a document with NUL)")


@check(CHECKS, "batches", "columns")
async def column_reads_of_batches_match_the_queue(h: Harness) -> None:
    p = h.store
    name = new_id("bat")
    await p.open_batch(name, [NewItem(f'["q{i}"]', new_id("ses")) for i in range(3)], session_ids_given=True,
                       now=time.time())
    t = time.time()
    (it,) = await p.claim_batch_items(name, "h:1:w", 1, now=t, expires=t + 60)
    await p.end_batch_item(name, it.item, "h:1:w", ItemEnd(status="failed", finished=t, attempts=1, error="x\x00y"))
    items, infos = await _reading(h, lambda reader: (reader.batch_items(name), reader.batches()))
    equal(items, await p.batch_items(name), "the items read by the reader")
    equal([i for i in infos if i.name == name], await p.list_batches(name), "the batch read")

"""MemoryPersistence: the port in Python dicts, for tests, notebooks and demos.

It stores JSON snapshots, never the engine's live objects, so it behaves like a real
store: what was not written is not there, and a loaded object is always a fresh copy. It holds no event-loop objects, so one instance works
across successive ``asyncio.run()`` calls. The lease is per instance (one process).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from pydantic import TypeAdapter

from .scores import ScoreRecord, ScoreStore
from ..errors import SessionBusyError
from ..messages import Message, MessageWithParts, Part, Session, Transcript, assembled
from .base import Lease, Persistence, Write, lease_owner
from .batches import BatchInfo, BatchItem, BatchQueue, ItemCost, ItemEnd, NewItem, check_same_prompts, fingerprint
from .columns import ColumnReader, ColumnReads

__all__ = ["MemoryPersistence"]


_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
_PART: TypeAdapter[Part] = TypeAdapter(Part)


class _Stored:
    __slots__ = ("info", "parts", "call")

    def __init__(self, info: bytes, call: "Optional[tuple[Optional[float]]]"):
        self.info = info
        self.parts: dict[str, bytes] = {}
        self.call = call  # an assistant message (a model call): ``(its cost,)``; else None


class MemoryPersistence(Persistence, BatchQueue, ColumnReads, ScoreStore):
    """Every capability of the port (:mod:`.base`) in this process's memory."""

    def __init__(self) -> None:
        self._sessions: dict[str, bytes] = {}
        self._messages: dict[str, dict[str, _Stored]] = {}
        self._leases: dict[str, str] = {}
        self._batches: dict[str, tuple[BatchInfo, list[BatchItem]]] = {}
        self._first_queued: dict[str, int] = {}  # per batch: no queued item before this index
        self._scores: dict[tuple[str, int, str], ScoreRecord] = {}

    def __repr__(self) -> str:
        return f"MemoryPersistence(sessions={len(self._sessions)})"

    async def get_session(self, session_id: str) -> Optional[Session]:
        s = self._sessions.get(session_id)
        return Session.model_validate_json(s) if s is not None else None

    async def upsert_session(self, session: Session) -> None:
        self._put_session(session.id, session.__pydantic_serializer__.to_json(session))

    def _put_session(self, session_id: str, data: bytes) -> None:
        self._sessions[session_id] = data
        self._messages.setdefault(session_id, {})

    async def list_sessions(self) -> list[Session]:
        return [Session.model_validate_json(self._sessions[k]) for k in sorted(self._sessions)]

    async def commit(self, writes: Sequence[Write], *, lease: Optional[Lease] = None,
                     session: Optional[Session] = None) -> None:
        """Every row serialized and checked first, then stored with nothing awaited in between:
        all of the commit or, on an error, none of it."""
        if lease is not None:
            self._check_lease_now(lease)
        messages, parts = _encode(writes)
        store = self._messages
        if parts:
            written = {(m[0], m[1]) for m in messages}
            for sid, mid, pid, _ in parts:
                if mid not in store.get(sid, ()) and (sid, mid) not in written:
                    raise KeyError(f"Part {pid!r} refers to message {mid!r} of session {sid!r}, which was never "
                                   "written; write the message first (in this commit or an earlier one).")
        if session is not None:
            self._put_session(session.id, session.__pydantic_serializer__.to_json(session))
        for sid, mid, data, call in messages:
            msgs = store.get(sid)
            if msgs is None:
                msgs = store[sid] = {}
            stored = msgs.get(mid)
            if stored is None:
                msgs[mid] = _Stored(data, call)
            else:
                stored.info, stored.call = data, call
        for sid, mid, pid, data in parts:
            store[sid][mid].parts[pid] = data

    async def check_lease(self, lease: Lease) -> None:
        self._check_lease_now(lease)

    def _check_lease_now(self, lease: Lease) -> None:
        holder = self._leases.get(lease.session_id)
        if holder != lease.owner:
            raise lease.mark_lost(holder)
        lease.check()

    async def load_transcript(self, session_id: str) -> Transcript:
        return self._transcript(session_id)

    def _transcript(self, session_id: str) -> Transcript:
        session = self._sessions.get(session_id)
        if session is None:
            return Transcript(session=None, messages=[])
        msgs = self._messages.get(session_id, {})
        out = []
        for mid in sorted(msgs):
            stored = msgs[mid]
            out.append(assembled(MessageWithParts, info=_MESSAGE.validate_json(stored.info),
                                 parts=[_PART.validate_json(stored.parts[pid]) for pid in sorted(stored.parts)]))
        return assembled(Transcript, session=Session.model_validate_json(session), messages=out)

    def column_reader(self) -> ColumnReader:
        """The frames' column reads of this store (:class:`~.memory_columns.TranscriptColumns`)."""
        from .memory_columns import TranscriptColumns

        return TranscriptColumns("MemoryPersistence", lambda: [self._transcript(k) for k in sorted(self._sessions)],
                                 lambda: self._infos(None), lambda name: self._items(name))

    async def delete_messages(self, session_id: str, message_ids: Sequence[str]) -> None:
        msgs = self._messages.get(session_id, {})
        for mid in message_ids:
            msgs.pop(mid, None)

    async def acquire_lease(self, session_id: str, run_id: str) -> Lease:
        holder = self._leases.get(session_id)
        if holder is not None:
            raise SessionBusyError(session_id, holder)
        owner = lease_owner(run_id)
        self._leases[session_id] = owner
        return Lease(session_id=session_id, run_id=run_id, owner=owner, persistence=self)

    async def release_lease(self, lease: Lease) -> None:
        if self._leases.get(lease.session_id) == lease.owner:
            del self._leases[lease.session_id]

    # ------------------------------------------------------------------ batches (one process)

    async def open_batch(self, name: str, items: Sequence[NewItem], *, session_ids_given: bool,
                         now: float) -> BatchInfo:
        fp = fingerprint(items)
        got = self._batches.get(name)
        if got is None:
            info = BatchInfo(name=name, created=now, updated=now, items=len(items), fingerprint=fp)
            rows = [BatchItem(batch=name, item=i, session_id=it.session_id, prompt=it.prompt)
                    for i, it in enumerate(items)]
            self._batches[name] = (info, rows)
            return _info(info, rows)
        info, rows = got
        if info.fingerprint != fp or info.items != len(items) or session_ids_given:
            check_same_prompts(name, [(r.prompt, r.session_id) for r in rows], items, session_ids_given)
        return _info(info, rows)

    async def claim_batch_items(self, name: str, owner: str, n: int, *, now: float, expires: float,
                                token: Optional[str] = None) -> list[BatchItem]:
        out: list[BatchItem] = []
        rows = self._rows(name)
        start = self._first_queued.get(name, 0)
        while start < len(rows) and not rows[start].queued:
            start += 1
        self._first_queued[name] = start
        for r in rows[start:]:
            if len(out) >= n:
                break
            if r.queued and r.expires < now:
                r.status, r.owner, r.expires = "running", owner, expires
                r.attempts += 1
                if r.started is None:
                    r.started = now
                out.append(dataclasses.replace(r))
        return out

    async def renew_batch_claims(self, name: str, owner: str, expires: float) -> list[int]:
        held = [r for r in self._rows(name) if r.owner == owner and r.status == "running"]
        for r in held:
            r.expires = expires
        return [r.item for r in held]

    async def release_batch_claims(self, name: str, owner: str, items: Sequence[int]) -> int:
        rows, n = self._rows(name), 0
        for i in items:
            r = rows[i] if 0 <= i < len(rows) else None
            if r is not None and r.owner == owner and r.status == "running":
                r.expires = 0.0
                self._first_queued[name] = min(self._first_queued.get(name, 0), i)
                n += 1
        return n

    async def free_dead_claims(self, name: str, live: Sequence[str]) -> int:
        """A claim of this process (``lease_owner``'s ``host:pid:``) whose worker is not live — a
        batch call that ended on an error — is claimable at once, not when it lapses."""
        alive, mine = set(live), lease_owner("")
        dead = [r for r in self._rows(name) if r.status == "running" and r.owner is not None
                and r.owner.startswith(mine) and r.owner not in alive]
        for r in dead:
            r.expires = 0.0
            self._first_queued[name] = min(self._first_queued.get(name, 0), r.item)
        return len(dead)

    async def end_batch_item(self, name: str, item: int, owner: str, end: ItemEnd) -> bool:
        rows = self._rows(name)
        r = rows[item] if 0 <= item < len(rows) else None
        if r is None or r.owner != owner or r.status != "running":
            return False
        r.status, r.queued, r.owner, r.expires = end.status, end.queued, None, end.not_before
        if end.queued:
            self._first_queued[name] = min(self._first_queued.get(name, 0), item)
        r.attempts, r.started = end.attempts, end.started
        r.finished = end.finished
        r.duration += end.run_time
        r.text, r.output, r.error = end.text, end.output, end.error
        r.steps, r.tool_calls = end.steps, end.tool_calls
        r.input_tokens, r.output_tokens = end.input_tokens, end.output_tokens
        if end.finished is not None:
            info = self._batches[name][0]
            info.updated = max(info.updated, end.finished)
        return True

    async def requeue_batch_items(self, name: str, items: Sequence[int]) -> int:
        rows, n = self._rows(name), 0
        for i in items:
            if 0 <= i < len(rows) and rows[i].status != "running" and not rows[i].queued:
                rows[i].queued, rows[i].expires = True, 0.0
                self._first_queued[name] = min(self._first_queued.get(name, 0), i)
                n += 1
        return n

    async def batch_items(self, name: str) -> list[BatchItem]:
        return self._items(name)

    def _items(self, name: str) -> list[BatchItem]:
        return [dataclasses.replace(r) for r in self._rows(name)]

    async def list_batches(self, name: Optional[str] = None) -> list[BatchInfo]:
        return self._infos(name)

    async def write_scores(self, scores: Sequence[ScoreRecord]) -> None:
        for s in scores:
            self._scores[(s.batch, s.item, s.scorer)] = s

    async def read_scores(self, batch: str, scorer: Optional[str] = None) -> list[ScoreRecord]:
        return [self._scores[k] for k in sorted(self._scores)
                if k[0] == batch and (scorer is None or k[2] == scorer)]

    async def batch_costs(self, name: str) -> list[ItemCost]:
        # (from the costs kept beside the messages: decoding every transcript took ~0.2 s at the
        # end of a 1,000-item batch, its messages alone ~0.1 s)
        return [_item_cost(it.item, self._messages.get(it.session_id, {})) for it in self._rows(name)]

    def _infos(self, name: Optional[str]) -> list[BatchInfo]:
        names = sorted(self._batches) if name is None else [name] if name in self._batches else []
        return [_info(*self._batches[k]) for k in names]

    def _rows(self, name: str) -> list[BatchItem]:
        got = self._batches.get(name)
        return got[1] if got is not None else []


def _item_cost(item: int, msgs: dict[str, _Stored]) -> ItemCost:
    priced, unpriced = 0.0, 0
    for m in msgs.values():
        if m.call is not None:
            cost = m.call[0]
            if cost is None:
                unpriced += 1
            else:
                priced += cost
    return ItemCost(item, priced, unpriced)


def _encode(writes: Sequence[Write]) -> tuple[list[tuple[str, str, bytes, Any]], list[tuple[str, str, str, bytes]]]:
    """The rows of a commit as JSON: messages ``(session, id, json, call)`` and parts ``(session, message, id, json)``."""
    messages: list[tuple[str, str, bytes, Any]] = []
    parts: list[tuple[str, str, str, bytes]] = []
    for message, ps, _view in writes:
        if message is not None:
            messages.append((message.session_id, message.id, message.__pydantic_serializer__.to_json(message),
                             (message.cost,) if message.role == "assistant" else None))  # (what batch_costs reads)
        for p in ps:
            d = p.__dict__  # (a part's ids read from its field dict: pydantic's attribute hook makes each read slow)
            parts.append((d["session_id"], d["message_id"], d["id"], p.__pydantic_serializer__.to_json(p)))
    return messages, parts


def _info(info: BatchInfo, rows: Sequence[BatchItem]) -> BatchInfo:
    """A copy of ``info`` with its counts."""
    counts: dict[str, int] = {}
    unfinished = 0
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
        if r.queued or r.status == "running":
            unfinished += 1
    return dataclasses.replace(info, counts=counts, unfinished=unfinished)

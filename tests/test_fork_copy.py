"""Fork on SQL stores (W11): the copy made in the database (CopyStore) is the copy made from objects.

Each test forks one source twice — once through the store's copy capability, once through the
object path every store has (the same store seen without the capability) — and compares every
column of every copied row, ids replaced by their positions: the documents, the flattened
columns and the model views must be equal. The source mixes what the database can copy renamed
(finished turns, keyed calls, unicode and quotes, a session id JSON must escape) with what the
engine writes as objects (a message with an error, calls without keys, an unfinished message,
a document laid out otherwise)."""

from __future__ import annotations

import asyncio

import pytest

from enginekit import Log, make_tools, seed, state
from sql_support import SQL_STORES as _SQL
from we0nb import ScriptedModel, We0Agent, text, tool_call, user_message
from we0nb.messages import MessageError
from we0nb.persistence.copies import CopyStore

SQL_STORES = [*_SQL, pytest.param("postgres-sqlalchemy", marks=pytest.mark.postgres)]

#: a source session id JSON must escape (quotes, a backslash) with text it writes as it is
SOURCE = 'ses "q" \\ é 🙂'
MESSAGES = ("id, session_id, role, created, completed, parent_id, model_id, finish_reason, error_reason, "
            "error_message, input_tokens, output_tokens, reasoning_tokens, cached_tokens, summary, data, model_view")
PARTS = ("id, session_id, message_id, type, tool, call_id, status, time_start, time_end, interrupted, "
         "interrupt_reason, recalled, data")


class _Objects:
    """A store seen without its copy capability: the fork takes the object path."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in ("session_index", "load_messages", "copy_rows"):
            raise AttributeError(name)
        return getattr(self._store, name)


def _rows(sql, sid: str) -> tuple[list, list]:
    """Every column of session ``sid``'s messages and parts, ids replaced by their positions."""
    ms = sql.raw(f"SELECT {MESSAGES} FROM we0_messages WHERE session_id = '{sid}' ORDER BY id")
    ps = sql.raw(f"SELECT {PARTS} FROM we0_parts WHERE session_id = '{sid}' ORDER BY message_id, id")
    names = {r[0]: f"M{i}" for i, r in enumerate(ms)}
    names.update({r[0]: f"P{i}" for i, r in enumerate(ps)})
    names[sid] = "FORK"

    def norm(v):
        if isinstance(v, str):
            for old, new in names.items():
                v = v.replace(old, new)
        return v

    return [tuple(norm(v) for v in r) for r in ms], [tuple(norm(v) for v in r) for r in ps]


async def _both(store, at=None) -> tuple[str, str]:
    """The source forked through the database and through objects (times of closing made equal)."""
    from we0nb.engine.fork import fork_session

    assert isinstance(store, CopyStore) and not isinstance(_Objects(store), CopyStore)
    a = await fork_session(store, SOURCE, at=at, new_session_id="ses_fork_in_db")
    b = await fork_session(_Objects(store), SOURCE, at=at, new_session_id="ses_fork_as_obj")
    return a, b


def _source(store, log: Log):
    """Two finished turns (a keyed call, text with quotes, a backslash and unicode), then a seeded
    message with an error and calls without keys; then another finished turn."""
    agent = We0Agent(ScriptedModel([[tool_call("write", {"path": 'a "b" \\ é'})], [text('done "é" \\ 🙂')],
                                    [text("second")], [text("after the error")]]),
                     tools=make_tools(log), persistence=store)

    async def go():
        await agent.invoke(session_id=SOURCE, messages=[user_message('write "it" \\ é')])
        await agent.invoke(session_id=SOURCE, messages=[user_message("again")])
        err = MessageError(reason="Aborted", message="stopped", metadata={"parent_id": "not a parent"})
        await seed(store, SOURCE, [("write", state("completed")), ("rm", state("error"))], completed=True,
                   error=err)
        await agent.invoke(session_id=SOURCE, messages=[user_message("more")])
        return [m.info.id for m in (await agent.transcript(SOURCE)).messages]

    return go


def test_copy_in_the_database_equals_the_copy_from_objects(sql, monkeypatch):
    store, log = sql.fresh(), Log()
    copied = []
    from we0nb.engine import fork as F
    original = F._copy_message

    def spy(m, *a, **k):
        copied.append(m.info.id)
        return original(m, *a, **k)

    monkeypatch.setattr(F, "_copy_message", spy)
    ids = asyncio.run(_source(store, log)())
    assert len(ids) == 9  # (two turns: 3 + 2 messages; the seeded 2, the last turn 2)
    for at in (None, ids[3], ids[6]):
        copied.clear()
        a, b = asyncio.run(_both(store, at))
        in_db, as_objects = _rows(sql, a), _rows(sql, b)
        assert in_db == as_objects
        n = len(ids) if at is None else ids.index(at) + 1
        assert len(in_db[0]) == n and len(copied) >= n  # (the object path wrote every message)
        # only the seeded messages (stored without model views; an error, calls without keys) were
        # written as objects in the database's copy
        object_ones = copied[:len(copied) - n]
        assert object_ones == (ids[5:7] if at != ids[3] else [])
        for table, column in (("we0_messages", "session_id"), ("we0_parts", "session_id"), ("we0_sessions", "id")):
            sql.raw(f"DELETE FROM {table} WHERE {column} IN ('ses_fork_in_db', 'ses_fork_as_obj')")
    assert log.count("write") == 1


def test_an_unfinished_message_and_a_document_laid_out_otherwise(sql, monkeypatch):
    store = sql.fresh()
    monkeypatch.setattr("we0nb.engine.fork.now", lambda: 7.0)
    monkeypatch.setattr("we0nb.engine.executor.now", lambda: 7.0)

    async def go():
        await seed(store, SOURCE, [("write", state("completed")), ("write", state("running")),
                                   ("rm", state("pending"))])
        return await store.load_transcript(SOURCE)

    tr = asyncio.run(go())
    user_part = tr.messages[0].parts[0].id
    # a document another writer laid out with a space: not copyable renamed, so written as an object
    sql.raw(f"UPDATE we0_parts SET data = '{{ ' || substr(data, 2) WHERE id = '{user_part}'")
    index = asyncio.run(store.session_index(SOURCE))
    assert [p.copyable for m in index.messages for p in m.parts][:1] == [False]
    assert [m.role for m in index.messages] == ["user", "assistant"] and not index.messages[1].completed
    a, b = asyncio.run(_both(store))
    assert _rows(sql, a) == _rows(sql, b)
    fork = asyncio.run(store.load_transcript(a))
    assert fork.messages[0].text == "do it"
    calls = fork.messages[1].tool_parts
    assert [c.state.status for c in calls] == ["completed", "error", "error"]
    assert [c.state.metadata.get("reason") for c in calls] == [None, "fork", "fork"]


def test_index_upto_and_a_clash_writes_nothing(sql):
    store = sql.fresh()
    ids = asyncio.run(_source(store, Log())())
    index = asyncio.run(store.session_index(SOURCE, ids[2]))
    assert [m.id for m in index.messages] == ids[:3] and index.session.id == SOURCE
    assert asyncio.run(store.session_index("ses_none")) is None
    assert [m.parent_id for m in index.messages] == [None, ids[0], ids[0]]
    call = next(p for m in index.messages for p in m.parts if p.type == "tool")
    assert call.keyed and call.copyable and call.status == "completed"

    async def clash():
        from we0nb import PersistenceError
        from we0nb._ids import new_id
        from we0nb.messages import Session, SessionTime

        lease = await store.acquire_lease("ses_clash", new_id("run"))
        session = Session(id="ses_clash", time=SessionTime(created=1.0, updated=1.0))
        try:
            # the new id of the second message is the first one's: the copy fails as a whole
            with pytest.raises(PersistenceError):
                await store.copy_rows(SOURCE, "ses_clash", [(ids[0], "msg_new", None), (ids[1], "msg_new", "msg_new")],
                                      [], [], session=session, lease=lease)
        finally:
            await lease.release()
        assert await store.get_session("ses_clash") is None

    asyncio.run(clash())


def test_a_call_whose_output_holds_a_nul_is_copied_too(sql):
    """PostgreSQL's json cannot read a document with an escaped NUL back: the index must not try
    (such a call is written as an object) — the fork is the same either way."""
    from we0nb.messages import ToolStateCompleted, ToolTime

    store = sql.fresh()
    done = ToolStateCompleted(input={"path": "a\x00b"}, output="out\x00put", time=ToolTime(start=1.0, end=2.0),
                              metadata={"idempotency_key": "key-nul", "attempt": 1})
    asyncio.run(seed(store, SOURCE, [("write", done)], completed=True))
    index = asyncio.run(store.session_index(SOURCE))
    call = index.messages[1].parts[-1]
    assert call.type == "tool" and call.copyable
    a, b = asyncio.run(_both(store))
    assert _rows(sql, a) == _rows(sql, b)
    fork = asyncio.run(store.load_transcript(a))
    state = fork.messages[1].tool_parts[0].state
    assert state.output == "out\x00put" and state.metadata["idempotency_key"] == "key-nul"


def test_a_record_the_database_cannot_read_is_named_and_nothing_is_written(sql):
    """A call's document that the database's JSON cannot read (PostgreSQL's json refuses a lone
    surrogate escape; the index reads it there) fails the fork as the corrupt record it is, naming
    the part — not as a failing database — and no session is made."""
    from we0nb import CorruptRecordError
    from we0nb.messages import ToolStateCompleted, ToolTime

    store = sql.fresh()
    done = ToolStateCompleted(input={"path": "a"}, output="OUTPUT", time=ToolTime(start=1.0, end=2.0),
                              metadata={"idempotency_key": "key-1", "attempt": 1})
    asyncio.run(seed(store, SOURCE, [("write", done)], completed=True))
    part = asyncio.run(store.load_transcript(SOURCE)).messages[1].tool_parts[0].id
    sql.raw(f"UPDATE we0_parts SET data = replace(data, '\"OUTPUT\"', '\"\\udc00\"') WHERE id = '{part}'")
    before = len(asyncio.run(store.list_sessions()))
    with pytest.raises(CorruptRecordError, match=part):
        asyncio.run(store_fork(store))
    assert len(asyncio.run(store.list_sessions())) == before


async def store_fork(store) -> str:
    from we0nb.engine.fork import fork_session

    return await fork_session(store, SOURCE, new_session_id="ses_fork_of_corrupt")

"""The frames' columns, read from the SQL tables in bulk: one query per view, no object per row.

:func:`open_reader` turns what a frame was given — a store with the column-read capability
(:class:`~we0nb.persistence.columns.ColumnReads`: a :class:`SqlPersistence` gives a
:class:`SqlReader`, a MemoryPersistence its own reader), an agent using one, a SQLAlchemy
``Engine`` or ``AsyncEngine``, a URL — into a :class:`~we0nb.persistence.columns.ColumnReader`
(``None`` for a store without that capability: read that one through its port). The reader's
``sessions``/``messages``/``parts`` run one SQL query each over the flattened columns of
:mod:`.tables` and return :class:`Fetched`: the rows in chunks of plain Python columns
(tuples), unordered, through one connection. This module imports no pandas, NumPy or
Arrow: a caller that wants arrays passes ``convert=``, applied to each chunk as it
arrives, so a chunk's row tuples are freed while still in cache. The reads are
synchronous (a frame is a plain call in a notebook cell).

The values only the JSON document ``data`` holds (text, tool input/output/error/metadata)
are extracted by the database (``json_extract`` on SQLite, ``#>``/``#>>`` on PostgreSQL).
Two kinds of rows are read in Python instead, from their document:

* rows whose document holds a NUL (stored as the escape ``\\u0000``): SQLite's JSON
  functions cut a string at a NUL and PostgreSQL refuses to extract it, so the query hands
  such rows' ``data`` over and ``json.loads`` reads them. Free text kept in a flat column
  (a session's title, a message's error message) is taken from the document there too, so
  every backend shows the stored value whole.
* corrupt rows: when the database cannot parse a document (``malformed JSON``, ``invalid
  input syntax for type json``), the query runs again reading every needed document here;
  a document that does not parse is reported in :attr:`Fetched.corrupt` (its ids and why)
  and its row keeps its flat columns, with ``None`` for the values of its document.

Every driver error becomes the :class:`~we0nb.PersistenceError` SqlPersistence raises for
the same cause (original chained). Reading never creates anything: a URL naming a SQLite
file that does not exist is refused, a database without the we0nb tables too.
"""

from __future__ import annotations

import contextlib
import gc
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NoReturn, Optional, Sequence

from ..columns import CATEGORIES, TOOL_CALL_NAMES, ColumnReader, Convert, CorruptRow, Fetched
from . import tables as T
from .doc_values import (TEXT_TYPES, attachment_count, cost_of, error_message, json_member,
                         part_text, tool_call_columns)
from .sources import driver_errors, engine_for, persistence_of, read_error, where_of

__all__ = ["CATEGORIES", "CorruptRow", "Fetched", "SqlReader", "open_reader", "persistence_of"]

_CHUNK = 4_096  # rows per fetch: a chunk's row tuples stay in cache until converted
_MAX_SQL_IDS = 1_000  # a longer session id list is filtered here, not sent as bound parameters
_NUL = "\\u0000"  # how a JSON document stores a NUL character


@dataclass(frozen=True)
class _Doc:
    """A column whose true value is in the row's JSON document."""

    name: str
    sql: Any  # its expression in the fast path: a flat column, or an extraction from ``data``
    value: Callable[[dict], Any]  # its value read off the parsed document
    extracted: bool  # ``sql`` reads ``data`` (fails on a corrupt document; PostgreSQL refuses NUL)


@dataclass
class _Query:
    table: Any
    flat: list[tuple[str, Any]]  # (name, expression); session_id first
    docs: list[_Doc]
    where: list = field(default_factory=list)
    applies: Any = None  # the rows whose document holds doc values (None: all)
    created: Any = None  # the creation time that since/until select by
    join: Any = None  # (table, on) needed for ``created``
    finish: Any = None  # chunk -> chunk: columns made from the read ones (before ``convert``)
    finished: Optional[list[str]] = None  # the columns once ``finish`` made them (None: ``names``)

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.flat] + [d.name for d in self.docs]


def _getter(key: str) -> Callable[[dict], Any]:
    """A document member as a column's value (a string, or None)."""
    return lambda d: d.get(key) if isinstance(d.get(key), str) else None


class _DocumentError(Exception):
    """The database could not read a JSON document (the fast path): read them in Python."""


def _is_document_error(e: BaseException) -> bool:
    text = str(getattr(e, "orig", None) or e).lower()
    return "json" in text or "unicode escape" in text


def open_reader(source: Any) -> Optional["SqlReader"]:
    """A :class:`SqlReader` on ``source``, or ``None`` for a persistence without SQL.

    ``source``: a SqlPersistence (its own engine), an agent, a SQLAlchemy ``Engine``, an
    ``AsyncEngine`` or a URL (see :func:`.sources.engine_for`); an Engine or a URL must name
    a database with the we0nb tables (``ValueError`` otherwise).
    """
    got = engine_for(source)
    if got is None:
        return None
    reader = SqlReader(got.engine, got.owned)
    if got.check:
        try:
            reader.check_tables()
        except BaseException:
            reader.close()
            raise
    return reader


# --------------------------------------------------------------------------- the reader


class SqlReader(ColumnReader):
    """Bulk reads of one database (synchronous; the engine is disposed on close if it is ours)."""

    def __init__(self, engine: Any, owned: bool):
        self.engine = engine
        self.owned = owned
        self.dialect: str = engine.dialect.name
        self.where = where_of(engine.url)

    def close(self) -> None:
        if self.owned:
            self.engine.dispose()

    def _fail(self, e: BaseException, opening: bool = False) -> NoReturn:
        raise read_error(e, self.where, self.dialect, opening=opening) from e

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        errors = driver_errors()
        try:
            conn = self.engine.connect()
        except errors as e:
            self._fail(e, opening=True)
        try:
            yield conn
        finally:
            conn.close()

    def check_tables(self) -> None:
        """Refuse a database without the we0nb tables (ValueError: it is not the one meant)."""
        import sqlalchemy as sa

        with self._connection() as conn:
            try:
                found = sa.inspect(conn).has_table(T.parts.name)
            except driver_errors() as e:
                self._fail(e)
        if not found:
            raise ValueError(f"{self.where} has no we0nb tables ({T.parts.name} …): is it a SqlPersistence database?")

    # ------------------------------------------------------------------ batches (few rows: read as records)

    def batches(self) -> list[Any]:
        """Every batch with its counts (:class:`~we0nb.persistence.batches.BatchInfo`); none without the tables."""
        from .batches import read_infos

        return self._records(read_infos)

    def batch_items(self, name: str) -> list[Any]:
        """The items of batch ``name`` (:class:`~we0nb.persistence.batches.BatchItem`), in item order."""
        from .batches import read_items

        return self._records(lambda conn: read_items(conn, name))

    def batch_costs(self, name: str) -> list[Any]:
        """What each item of batch ``name`` cost so far (:class:`~we0nb.persistence.batches.ItemCost`)."""
        from .batches import read_costs

        return self._records(lambda conn: read_costs(conn, name))

    def scores(self, name: str) -> list[Any]:
        """The scores of batch ``name`` (:class:`~we0nb.persistence.scores.ScoreRecord`), by item and scorer."""
        from .scores import read_scores

        return self._records(lambda conn: read_scores(conn, name))

    def _records(self, read: Callable[[Any], list[Any]]) -> list[Any]:
        with self._connection() as conn:
            try:
                return read(conn)
            except driver_errors() as e:
                self._fail(e)

    # ------------------------------------------------------------------ views

    def sessions(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        """session_id, title, created, updated, messages (count), revert_message_id, forked_from,
        forked_at (the fork's lineage, members of the session's document)."""
        import sqlalchemy as sa

        s, m = T.sessions, T.messages
        count = sa.select(sa.func.count()).where(m.c.session_id == s.c.id).scalar_subquery()
        q = _Query(s, [("session_id", s.c.id), ("created", s.c.created), ("updated", s.c.updated),
                       ("messages", count), ("revert_message_id", s.c.revert_message_id)],
                   [_Doc("title", s.c.title, lambda d: d.get("title"), False),
                    *(_Doc(k, _extract(self.dialect, s.c.data, (k,), False), _getter(k), True)
                      for k in ("forked_from", "forked_at"))], created=s.c.created)
        return self._read(q, ids, since, until, convert)

    def messages(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
                 until: Optional[int] = None, convert: Optional[Convert] = None) -> Fetched:
        """The message columns of :func:`.tables.message_columns` (``id`` as message_id)."""
        m = T.messages
        flat = [("session_id", m.c.session_id), ("message_id", m.c.id), ("role", m.c.role)]
        flat += [(c, m.c[c]) for c in ("created", "completed", "parent_id", "model_id", "finish_reason",
                                       "error_reason", "input_tokens", "output_tokens", "reasoning_tokens",
                                       "cached_tokens", "summary")]
        q = _Query(m, flat, [_Doc("error_message", m.c.error_message, error_message, False), self._cost()],
                   created=m.c.created)
        return self._read(q, ids, since, until, convert)

    def message_costs(self, ids: Optional[Sequence[str]] = None) -> Fetched:
        """session_id, role and cost of every message: what a session's cost is summed from."""
        m = T.messages
        q = _Query(m, [("session_id", m.c.session_id), ("role", m.c.role)], [self._cost()], created=m.c.created)
        return self._read(q, ids, None, None, None)

    def _cost(self) -> "_Doc":
        """A message's ``cost`` (USD, None when unknown), a member of its document."""
        import sqlalchemy as sa

        sql = _extract(self.dialect, T.messages.c.data, ("cost",), False)
        if sql is not None and self.dialect == "postgresql":
            sql = sa.cast(sql, sa.Float)
        return _Doc("cost", sql, cost_of, True)

    def parts(self, ids: Optional[Sequence[str]] = None, since: Optional[int] = None,
              until: Optional[int] = None, convert: Optional[Convert] = None, *,
              tools_only: bool = False) -> Fetched:
        """Parts: ids, type, tool, status, start, end and text (a text/reasoning part's text, a
        compaction's summary). ``tools_only``: tool parts, with call_id, the interrupt/recall
        flags and input/metadata (compact JSON text), output and error instead of type/text,
        and the approval columns (see :func:`approval_columns`)."""
        import sqlalchemy as sa

        p, m = T.parts, T.messages
        flat = [("session_id", p.c.session_id), ("message_id", p.c.message_id), ("part_id", p.c.id),
                ("tool", p.c.tool), ("status", p.c.status), ("start", p.c.time_start), ("end", p.c.time_end)]
        q = _Query(p, flat, [], created=m.c.created, join=(m, m.c.id == p.c.message_id))
        if tools_only:
            q.flat += [("call_id", p.c.call_id), ("interrupted", p.c.interrupted),
                       # (a reason only where the call was interrupted: schema 9 and older also kept
                       # a denial's reason there, which is the approval's, not an interrupt's)
                       ("interrupt_reason", sa.case((p.c.interrupted, p.c.interrupt_reason), else_=sa.null())),
                       ("recalled", p.c.recalled)]
            q.docs = [self._member("input", ("state", "input"), True), self._member("output", ("state", "output")),
                      self._member("error", ("state", "error")), self._member("metadata", ("state", "metadata"), True),
                      self._member("approval", ("approval",)), self._member("approval_detail", ("approval_detail",), True),
                      _Doc("attachments", _array_length(self.dialect, T.parts.c.data, ("state", "attachments")),
                           attachment_count, True)]
            q.finish, q.finished = tool_call_columns, list(TOOL_CALL_NAMES)
            q.where.append(p.c.type == "tool")  # a scan of the table; a session filter uses its index
        else:
            q.flat.append(("type", p.c.type))
            text, summary = self._extract(("text",)), self._extract(("summary",))
            sql = None if text is None else sa.case((p.c.type.in_(TEXT_TYPES), text),
                                                    (p.c.type == "compaction", summary), else_=sa.null())
            q.docs = [_Doc("text", sql, part_text, True)]
            q.applies = p.c.type.in_((*TEXT_TYPES, "compaction"))
        return self._read(q, ids, since, until, convert)

    # ------------------------------------------------------------------ query parts

    def _extract(self, path: tuple[str, ...], as_json: bool = False) -> Any:
        """A member of ``data``, extracted by the database (None: a dialect we read in Python)."""
        return _extract(self.dialect, T.parts.c.data, path, as_json)

    def _member(self, name: str, path: tuple[str, ...], as_json: bool = False) -> _Doc:
        return _Doc(name, self._extract(path, as_json), lambda d: json_member(d, path, as_json), True)

    def _has_nul(self, data: Any) -> Any:
        import sqlalchemy as sa

        if self.dialect == "sqlite":
            return data.op("GLOB")("*" + _NUL + "*")  # GLOB: exact, and cheaper than instr()
        if self.dialect == "postgresql":
            return sa.func.strpos(data, _NUL) > 0
        return None

    def _statement(self, q: _Query, careful: bool, ids: Optional[Sequence[str]], since: Optional[int],
                   until: Optional[int]) -> Any:
        """The query: the fast path, or (``careful``) every needed document read in Python."""
        import sqlalchemy as sa

        data = q.table.c.data
        nul = self._has_nul(data)
        careful = careful or nul is None or any(d.sql is None for d in q.docs)
        cols = [e.label(n) for n, e in q.flat]
        for d in q.docs:
            e: Any
            if d.extracted and careful:
                e = sa.null()
            elif d.extracted and nul is not None and self.dialect == "postgresql":  # (not careful: nul is known)
                e = sa.case((nul, sa.null()), else_=d.sql)  # PostgreSQL refuses to extract a NUL
            else:
                e = d.sql
            cols.append(e.label(d.name))
        flagged = sa.true() if careful or nul is None else nul  # (nul None made it careful)
        if q.applies is not None:
            flagged = sa.and_(q.applies, flagged)
        cols.append(sa.case((flagged, data), else_=sa.null()).label("data"))
        stmt = sa.select(*cols).where(*q.where)
        if ids is not None:
            stmt = stmt.where(q.flat[0][1].in_(list(ids)))
        if since is not None or until is not None:
            if q.join is not None:
                stmt = stmt.join(*q.join)
            stmt = _time_filter(stmt, q.created, since, until)
        return stmt

    # ------------------------------------------------------------------ fetch

    def _read(self, q: _Query, ids: Optional[Sequence[str]], since: Optional[int], until: Optional[int],
              convert: Optional[Convert]) -> Fetched:
        wanted = None
        if ids is not None and len(ids) > _MAX_SQL_IDS:
            wanted, ids = frozenset(ids), None
        try:
            return self._fetch(q, self._statement(q, False, ids, since, until), wanted, convert, careful=False)
        except _DocumentError:
            return self._fetch(q, self._statement(q, True, ids, since, until), wanted, convert, careful=True)

    def _fetch(self, q: _Query, stmt: Any, wanted: Optional[frozenset], convert: Optional[Convert],
               careful: bool) -> Fetched:
        """Run ``stmt``; each chunk of rows becomes columns (documents read where flagged), then ``convert``."""
        out = Fetched(q.finished or q.names)
        with _gc_paused(), self._connection() as conn:
            try:
                result = conn.execute(stmt)
                cursor = result.cursor
                while True:
                    rows = cursor.fetchmany(_CHUNK)
                    if not rows:
                        break
                    if wanted is not None:
                        rows = [r for r in rows if r[0] in wanted]
                    chunk = self._columns(q, rows, out.corrupt)
                    out.chunks.append(convert(chunk) if convert is not None else chunk)
                    del rows, chunk
                result.close()
            except driver_errors() as e:
                if not careful and _is_document_error(e):
                    raise _DocumentError() from e
                self._fail(e)
        return out

    def _columns(self, q: _Query, rows: list, corrupt: list[CorruptRow]) -> dict[str, Any]:
        names = q.names
        cols: list[Any] = list(zip(*rows)) if rows else [()] * (len(names) + 1)
        docs = cols.pop()
        if docs.count(None) != len(docs):
            self._read_documents(q, cols, docs, corrupt)
        chunk = dict(zip(names, cols))
        return q.finish(chunk) if q.finish is not None else chunk

    def _read_documents(self, q: _Query, cols: list, docs: Sequence[Optional[str]], corrupt: list[CorruptRow]) -> None:
        """The doc columns of the flagged rows, read off their documents with ``json.loads``."""
        first = len(q.flat)
        values = {first + j: list(cols[first + j]) for j in range(len(q.docs))}
        names = q.names
        ids = [names.index(n) if n in names else None for n in ("session_id", "message_id", "part_id")]
        for r, text in enumerate(docs):
            if text is None:
                continue
            doc: Optional[dict] = None  # (set only when the text is a JSON object)
            try:
                parsed = json.loads(text)
                doc = parsed if isinstance(parsed, dict) else None
                detail = None if doc is not None else f"its JSON is a {type(parsed).__name__}, not an object"
            except ValueError as e:
                detail = f"its JSON does not parse: {e}"
            for j, d in enumerate(q.docs):
                if doc is not None:
                    values[first + j][r] = d.value(doc)
                elif d.extracted:
                    values[first + j][r] = None
            if detail is not None:
                sid, mid, pid = (None if i is None else cols[i][r] for i in ids)
                corrupt.append(CorruptRow(q.table.name, sid, mid, pid, detail))
        for i, v in values.items():
            cols[i] = v


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while rows are fetched (restored after; nothing here makes cycles).

    Fetched rows are tracked tuples: with the GC on, allocating a million of them triggers
    repeated full collections that cost more than the fetch itself.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _extract(dialect: str, col: Any, path: Sequence[str], as_json: bool) -> Any:
    """A JSON member of a text column, extracted by the database: text (or JSON text)."""
    import sqlalchemy as sa

    if dialect == "sqlite":
        # json_extract gives SQL text for strings and compact JSON text for objects
        return sa.func.json_extract(col, "$." + ".".join(path))
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        doc = sa.cast(col, postgresql.JSON)  # json (not jsonb) keeps the stored text as is
        if as_json:
            return sa.cast(doc[tuple(path)], sa.Text)
        return doc[tuple(path)].astext
    return None  # read ``data`` and extract in Python (other databases)


def _array_length(dialect: str, col: Any, path: Sequence[str]) -> Any:
    """The length of a JSON array member of ``data`` (0 when it is missing or not an array), by the database."""
    import sqlalchemy as sa

    if dialect == "sqlite":  # (json_array_length is 0 for a non-array, NULL for a missing member)
        return sa.func.coalesce(sa.func.json_array_length(col, "$." + ".".join(path)), 0)
    if dialect == "postgresql":
        from sqlalchemy.dialects import postgresql

        member = sa.cast(col, postgresql.JSON)[tuple(path)]
        return sa.case((sa.func.json_typeof(member) == "array", sa.func.json_array_length(member)), else_=0)
    return None


def _time_filter(stmt: Any, col: Any, since: Optional[int], until: Optional[int]) -> Any:
    """Keep rows whose time, in whole microseconds as the frames show it, is in [since, until).

    ``floor(t * 1e6 + 0.5) >= since`` ⟺ ``t * 1e6 + 0.5 >= since`` for an integer bound:
    the same double arithmetic as the frames and the transcript reader, so a time read off a
    frame selects its own row. A coarse bound on the bare column comes first (indexable).
    """
    exact = col * 1e6 + 0.5
    if since is not None:
        stmt = stmt.where(col >= (since - 2) / 1e6, exact >= since)
    if until is not None:
        stmt = stmt.where(col < (until + 2) / 1e6, exact < until)
    return stmt

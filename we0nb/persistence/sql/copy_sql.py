"""The SQL text of a copy inside the database (:class:`~we0nb.persistence.copies.CopyStore`).

A row's ``data`` is its exact pydantic document, and pydantic writes the fields in their declared
order, so a document begins with the ids a copy changes: ``{"id":"…","session_id":…`` and, for a
part, ``,"message_id":"…"``. A copy replaces that beginning (the rest of the text is kept as it
is); an assistant message's ``"error":null,"parent_id":"…"`` (its first occurrence: nothing before
it can hold that text unescaped) is replaced the same way. A row whose document does not begin as
expected, an assistant message with an error and a parent, or a message without its stored model
view (the copy would lack it too) is not *copyable*: the index says so and the engine writes it
as an object instead; the copy statements leave such rows out too.

Parameters: ``sid`` (the source session), ``upto`` (the last message an ``_upto`` index reads), ``src`` and ``dstj`` (the source and target session ids
as JSON strings, exactly as pydantic writes them), ``dst`` (the target session id) and ``rows``
(a JSON array of ``[old id, new id, new referred id]``).

A copy reads the renames first and looks each source row up by its key (SQLite: a ``CROSS JOIN``,
whose order it keeps; PostgreSQL: a ``LATERAL`` subquery it cannot flatten). Otherwise a planner
may scan the session's rows and, for each, all the renames: seconds for a thousand. The texts
differ per dialect only in the parameter style, ``instr``/``strpos``, that lookup, how ``rows`` is
unpacked and how a tool call's key is found (SQLite's ``json_type``; PostgreSQL parses the document
as ``json`` only when the key's name is in it and no escaped NUL is, which its ``json`` refuses).
"""

from __future__ import annotations

__all__ = ["copy_statements"]

_MESSAGE_COLUMNS = ("role", "created", "completed", "model_id", "finish_reason", "error_reason", "error_message",
                    "input_tokens", "output_tokens", "reasoning_tokens", "cached_tokens", "summary")
_PART_COLUMNS = ("type", "tool", "call_id", "status", "time_start", "time_end", "interrupted", "interrupt_reason",
                 "recalled")


def copy_statements(dialect: str) -> dict[str, str]:
    """``name → SQL`` for ``"sqlite"`` or ``"postgresql"`` (psycopg's parameter style)."""
    sqlite = dialect == "sqlite"

    def p(name: str) -> str:
        return f":{name}" if sqlite else f"CAST(%({name})s AS text)"

    instr = "instr" if sqlite else "strpos"
    src, dstj = p("src"), p("dstj")

    def msg_prefix(t: str) -> str:  # what a message's document begins with in the source
        return f"""'{{"id":"' || {t}.id || '","session_id":' || {src}"""

    def part_prefix(t: str) -> str:
        return f"""'{{"id":"' || {t}.id || '","session_id":' || {src} || ',"message_id":"' || {t}.message_id || '"'"""

    def parent(t: str) -> str:  # an assistant message's parent, as its document has it
        return f"""'"error":null,"parent_id":"' || {t}.parent_id || '"'"""

    def begins(t: str, prefix: str) -> str:
        return f"substr({t}.data, 1, length({prefix})) = {prefix}"

    msg_ok = (f"s.model_view IS NOT NULL AND {begins('s', msg_prefix('s'))} AND (s.parent_id IS NULL OR "
              f"(s.error_reason IS NULL AND {instr}(s.data, {parent('s')}) > 0))")
    part_ok = begins("p", part_prefix("p"))
    if sqlite:
        keyed = ("CASE WHEN p.type <> 'tool' THEN 1 WHEN json_valid(p.data) THEN "
                 "json_type(p.data, '$.state.metadata.idempotency_key') IS NOT NULL ELSE 0 END")
        rows = ("(SELECT json_extract(value, '$[0]') AS o, json_extract(value, '$[1]') AS n, "
                "json_extract(value, '$[2]') AS x FROM json_each(:rows)) AS m")
    else:
        # (a document with an escaped NUL is not parsed: PostgreSQL's json cannot read one back; such a
        # call is written as an object, exactly as the other path would)
        keyed = ("CASE WHEN p.type <> 'tool' THEN 1 WHEN strpos(p.data, '\"idempotency_key\":') = 0 THEN 0 "
                 "WHEN strpos(p.data, '\\u0000') > 0 THEN 0 "
                 "WHEN (CAST(p.data AS json) #> '{state,metadata}') ->> 'idempotency_key' IS NOT NULL THEN 1 "
                 "ELSE 0 END")
        rows = ("(SELECT e ->> 0 AS o, e ->> 1 AS n, e ->> 2 AS x "
                "FROM json_array_elements(CAST(%(rows)s AS json)) AS e) AS m")

    def lookup(table: str, t: str) -> str:  # each rename's source row, by its id (a key lookup)
        if sqlite:
            return f"CROSS JOIN {table} {t} WHERE {t}.id = m.o"
        # (OFFSET 0: the subquery is not pulled up into a join, which PostgreSQL may plan as a scan
        # of the session's rows against every rename when the table's statistics are stale)
        return f"CROSS JOIN LATERAL (SELECT * FROM {table} WHERE {table}.id = m.o OFFSET 0) AS {t} WHERE true"

    sid, dst = p("sid"), p("dst")
    cols = ", ".join(f"t.{c}" for c in _MESSAGE_COLUMNS)
    pcols = ", ".join(f"p.{c}" for c in _PART_COLUMNS)
    new_parent = """'"error":null,"parent_id":"' || t.x || '"'"""
    message_index = (f"SELECT s.id, s.role, s.created, CASE WHEN s.completed IS NULL THEN 0 ELSE 1 END, s.parent_id, "
                     f"CASE WHEN {msg_ok} THEN 1 ELSE 0 END FROM we0_messages s WHERE s.session_id = {sid}")
    part_index = (f"SELECT p.id, p.message_id, p.type, p.status, CASE WHEN {part_ok} THEN 1 ELSE 0 END, {keyed} "
                  f"FROM we0_parts p WHERE p.session_id = {sid}")
    upto = p("upto")
    return {
        "message_index": f"{message_index} ORDER BY s.id",
        "part_index": f"{part_index} ORDER BY p.message_id, p.id",
        "message_index_upto": f"{message_index} AND s.id <= {upto} ORDER BY s.id",
        "part_index_upto": f"{part_index} AND p.message_id <= {upto} ORDER BY p.message_id, p.id",
        "copy_parts": (
            f"INSERT INTO we0_parts (id, session_id, message_id, {', '.join(_PART_COLUMNS)}, data) "
            f"SELECT m.n, {dst}, m.x, {pcols}, "
            f"""'{{"id":"' || m.n || '","session_id":' || {dstj} || ',"message_id":"' || m.x || '"' || """
            f"substr(p.data, length({part_prefix('p')}) + 1) "
            f"FROM {rows} {lookup('we0_parts', 'p')} AND p.session_id = {sid} AND {part_ok}"),
        "copy_messages": (
            f"INSERT INTO we0_messages (id, session_id, {', '.join(_MESSAGE_COLUMNS)}, parent_id, data, model_view) "
            f"SELECT t.n, {dst}, {cols}, t.x, "
            f"""'{{"id":"' || t.n || '","session_id":' || {dstj} || CASE WHEN t.parent_id IS NULL THEN t.rest """
            f"ELSE substr(t.rest, 1, {instr}(t.rest, {parent('t')}) - 1) || {new_parent} || "
            f"substr(t.rest, {instr}(t.rest, {parent('t')}) + length({parent('t')})) END, t.model_view "
            f"FROM (SELECT m.n, m.x, s.*, substr(s.data, length({msg_prefix('s')}) + 1) AS rest "
            f"FROM {rows} {lookup('we0_messages', 's')} AND s.session_id = {sid} AND {msg_ok}) AS t"),
    }

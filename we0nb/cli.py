"""The ``we0nb`` command: a terminal demo of abort and resume, and a look into a session database.

::

    we0nb demo                  # scripted agent on ./we0nb-demo.db: run, abort mid-tool, resume
    we0nb demo --no-resume      # stop after the abort; then, in a new process:
    we0nb resume SESSION        # resume it (the demo's scripted continuation)
    we0nb sessions              # list the sessions of the database
    we0nb show SESSION          # print a session's transcript and tool table
    we0nb lab                   # open the tutorial notebooks in JupyterLab

Every command takes ``--db URL`` (a SQLAlchemy URL such as ``sqlite:///file.db`` or
``postgresql+psycopg://…``, or a plain file path meaning SQLite); the default is
``$WE0NB_DB`` or ``sqlite:///we0nb-demo.db``. Exit codes: 0 success, 1 an error the
message explains (unknown session, missing database, …), 2 bad command-line usage.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ._ids import new_id
from .engine import We0Agent, user_message
from .messages import UNFINISHED_REASON, AssistantMessage, ReasoningPart, TextPart, ToolPart, Transcript
from .models import ScriptedModel, text, tool_call
from .persistence import MemoryPersistence, Persistence
from .tools import tool

__all__ = ["main", "build_parser", "demo_agent", "DEMO_PROMPT"]

DEFAULT_DB = "sqlite:///we0nb-demo.db"
DEMO_PROMPT = "Order 2 coffee, check whether tea is in stock, and order 1 tea."
DEMO_TOOLS = ("place_order", "check_stock")
STOCK = {"coffee": 40, "tea": 14, "cocoa": 0}


class CliError(Exception):
    """An error whose message is shown to the user as is (exit code 1)."""


# =========================================================================== the demo agent


def ledger_path(db_url: str) -> Path:
    """Where the demo's side-effect tool records what it did: a JSON-lines file beside the database."""
    if db_url.startswith("sqlite") and ":///" in db_url:
        db_file = db_url.split(":///", 1)[1].split("?", 1)[0]
        if db_file and db_file != ":memory:":
            p = Path(db_file)
            return p.with_name(p.stem + ".orders.jsonl")
    return Path("we0nb-demo.orders.jsonl")


def read_ledger(path: Path, session_id: Optional[str] = None) -> list[dict[str, Any]]:
    """The orders recorded in ``path`` (those of ``session_id`` only, when given)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            if session_id is None or row.get("session_id") == session_id:
                rows.append(row)
    return rows


def demo_tools(ledger: Path, session_id: str, *, stock_seconds: float = 0.6) -> list:
    """The demo's two tools: ``place_order`` (side effects) and ``check_stock`` (read-only)."""

    @tool
    async def place_order(item: str, quantity: int) -> str:
        """Place an order with the supplier. A side effect: never run twice."""
        await asyncio.sleep(0.05)
        order_id = f"ord-{len(read_ledger(ledger)) + 1:04d}"
        row = {"order_id": order_id, "session_id": session_id, "item": item, "quantity": quantity,
               "pid": os.getpid(), "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        ledger.parent.mkdir(parents=True, exist_ok=True)
        with ledger.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        return f"Order {order_id} placed: {quantity} x {item}."

    @tool(side_effects=False)
    async def check_stock(item: str) -> dict:
        """How many units of an item the warehouse holds. Read-only: safe to run again."""
        await asyncio.sleep(stock_seconds)
        return {"item": item, "in_stock": STOCK.get(item, 0)}

    return [place_order, check_stock]


def demo_script() -> tuple[list, list]:
    """The scripted model's two steps: the tool calls, then the answer after recovery."""
    first = [
        text("I'll place the coffee order, check the tea stock, then order the tea."),
        tool_call("place_order", {"item": "coffee", "quantity": 2}),
        tool_call("check_stock", {"item": "tea"}),
        tool_call("place_order", {"item": "tea", "quantity": 1}),
    ]
    after_resume = [
        text("Coffee: 2 ordered. Tea: 14 in stock. The tea order was interrupted before it finished, "
             "and because ordering has side effects it was not replayed - say 'order tea' to place it again."),
    ]
    return first, after_resume


def demo_agent(persistence: Persistence, session_id: str, ledger: Path, *, delay: float = 0.03,
               continuation_only: bool = False, stock_seconds: float = 0.6) -> We0Agent:
    """The agent of ``we0nb demo`` (``continuation_only``: the model of ``we0nb resume``)."""
    first, after = demo_script()
    steps = [after] if continuation_only else [first, after]
    model = ScriptedModel(steps, delay=delay, model_id="scripted-demo")
    return We0Agent(model, tools=demo_tools(ledger, session_id, stock_seconds=stock_seconds),
                    persistence=persistence)


# =========================================================================== persistence


def normalize_db(db: str) -> str:
    """A SQLAlchemy URL; a plain path means a SQLite file; ``memory`` means MemoryPersistence."""
    if db == "memory" or "://" in db:
        return db
    return f"sqlite:///{db}"


def sqlite_file(url: str) -> Optional[Path]:
    if url.startswith("sqlite") and ":///" in url:
        f = url.split(":///", 1)[1].split("?", 1)[0]
        if f and f != ":memory:":
            return Path(f)
    return None


def open_persistence(url: str, *, must_exist: bool) -> Persistence:
    if url == "memory":
        if must_exist:
            raise CliError("--db memory holds nothing between commands; use a database URL "
                           "such as sqlite:///we0nb-demo.db.")
        return MemoryPersistence()
    f = sqlite_file(url)
    if must_exist and f is not None and not f.exists():
        raise CliError(f"no database at {f} (from --db {url}). Run `we0nb demo --db {url}` first, "
                       "or pass the --db URL the sessions were written to.")
    try:
        from .persistence.sql import SqlPersistence
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise CliError(f"SqlPersistence cannot be imported ({e}); install we0nb with its dependencies "
                       "(pip install -e .), or use --db memory for the demo.") from None
    try:
        return SqlPersistence(url)
    except Exception as e:
        raise CliError(f"cannot open the database {url!r}: {type(e).__name__}: {e}") from None


# =========================================================================== plain-text rendering


def _ts(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _short(s: str, width: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= width else s[: width - 3] + "..."


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], widths: Optional[dict[str, int]] = None) -> str:
    """A plain-text table (cells shortened to ``widths``)."""
    widths = widths or {}
    cells = [[_short(r.get(c, ""), widths.get(c, 40)) for c in columns] for r in rows]
    w = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w[i]) for i, v in enumerate(vals)).rstrip()  # noqa: E731
    out = [line(list(columns)), line(["-" * x for x in w])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def outcome(part: ToolPart, message: Any) -> str:
    """keep / recall / interrupt, read back from what was persisted."""
    st = part.state
    meta = getattr(st, "metadata", {}) or {}
    if st.status == "error" and meta.get("interrupted"):
        return f"interrupt ({meta.get('reason')})"
    if meta.get("recalled"):
        return "recall"
    err = getattr(message, "error", None)
    if err is not None and err.reason == UNFINISHED_REASON and st.status in ("completed", "error"):
        return "keep"
    if st.status in ("pending", "running"):
        return "(unfinished)"
    return "-"


def tool_rows(tr: Transcript) -> list[dict[str, Any]]:
    rows = []
    for m in tr.messages:
        for p in m.parts:
            if not isinstance(p, ToolPart):
                continue
            st = p.state
            result = getattr(st, "output", None)
            if result is None:
                result = getattr(st, "error", "")
            t = getattr(st, "time", None)
            dur = ""
            if t is not None and t.start is not None and t.end is not None:
                dur = f"{t.end - t.start:.2f}s"
            rows.append({"#": str(len(rows) + 1), "tool": p.tool, "call_id": p.call_id, "status": st.status,
                         "outcome": outcome(p, m.info), "input": _json(st.input), "duration": dur,
                         "output / error": result or ""})
    return rows


TOOL_COLUMNS = ("#", "tool", "status", "outcome", "input", "duration", "output / error")
TOOL_WIDTHS = {"input": 34, "output / error": 60}


def format_tools(tr: Transcript) -> str:
    rows = tool_rows(tr)
    return table(rows, TOOL_COLUMNS, TOOL_WIDTHS) if rows else "(no tool calls)"


def format_transcript(tr: Transcript, width: int = 88) -> str:
    """The transcript as plain text: one block per message."""
    out: list[str] = []
    if tr.session is not None:
        s = tr.session
        out.append(f"session {s.id}  created {_ts(s.time.created)}  updated {_ts(s.time.updated)}"
                   + (f"  title {s.title!r}" if s.title else ""))
    wrap = lambda s, ind: textwrap.fill(s, width, initial_indent=ind, subsequent_indent=ind)  # noqa: E731
    for m in tr.messages:
        info = m.info
        if info.role == "user":
            out.append(f"\n[user] {_ts(info.time.created)}  {info.id}")
        else:
            assert isinstance(info, AssistantMessage)
            state = "finished" if info.time.completed is not None else "UNFINISHED"
            extra = f"  finish={info.finish_reason}" if info.finish_reason else ""
            out.append(f"\n[assistant] {_ts(info.time.created)}  {info.id}  {state}{extra}")
            if info.error is not None:
                out.append(f"  ! {info.error.reason}: {info.error.message} {_json(info.error.metadata)}")
        for p in m.parts:
            if isinstance(p, TextPart):
                if p.text:
                    out.append(wrap(p.text, "  "))
            elif isinstance(p, ReasoningPart):
                if p.text:
                    out.append(wrap("(thinking) " + p.text, "  "))
            elif isinstance(p, ToolPart):
                st = p.state
                line = f"  -> {p.tool}({_short(_json(st.input), 60)})  [{st.status}]"
                oc = outcome(p, info)
                if oc not in ("-", "(unfinished)"):
                    line += f" {oc}"
                out.append(line)
                res = getattr(st, "output", None) or getattr(st, "error", None)
                if res:
                    out.append(wrap(_short(res, 200), "       "))
    if not tr.messages:
        out.append("(no messages)")
    return "\n".join(out)


def session_state(tr: Transcript) -> str:
    last = tr.last_assistant
    if not tr.messages:
        return "empty"
    if tr.messages[-1].info.role == "user":
        return "needs resume (no reply yet)"
    if last is not None:
        info = last.info
        if info.time.completed is None or any(p.state.status in ("pending", "running") for p in last.tool_parts):
            return "needs resume (interrupted)"
    return "complete"


# =========================================================================== live printing


class LivePrinter:
    """Prints a run's events as they arrive (text deltas inline, one line per tool change)."""

    def __init__(self, write: Callable[[str], Any] = sys.stdout.write):
        self._w = write
        self._col = 0

    def _line(self, s: str) -> None:
        if self._col:
            self._w("\n")
            self._col = 0
        self._w(s + "\n")
        sys.stdout.flush()

    def __call__(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        if kind == "user-message":
            self._line(f"[user] {ev['text']}")
        elif kind == "step-start":
            self._line(f"[assistant] step {ev['step']} of this run")
        elif kind in ("text-delta", "reasoning-delta"):
            if self._col == 0:
                self._w("  ")
                self._col = 2
            self._w(ev["text"])
            self._col += len(ev["text"])
            sys.stdout.flush()
        elif kind == "tool":
            p = ev["part"]
            st = p.state
            line = f"  tool {p.tool:<12} {st.status:<9} {_short(_json(st.input), 40)}"
            res = getattr(st, "output", None) or getattr(st, "error", None)
            if res:
                line += f" -> {_short(res, 70)}"
            self._line(line)
        elif kind == "recovery":
            if ev["action"] == "close":
                self._line("  recovery close      the unfinished assistant message (error UnfinishedAssistantMessage)")
            else:
                p = ev["part"]
                why = {"keep": "finished before the abort: its result is kept",
                       "recall": "read-only and unfinished: executed again with its persisted input",
                       "interrupt": "has side effects and never finished: marked interrupted, not executed again",
                       }[ev["action"]]
                self._line(f"  recovery {ev['action']:<9} {p.tool}({_short(_json(p.state.input), 40)}): {why}")
        elif kind == "step-finish":
            self._line(f"  (step {ev['step']} finished: {ev['finish_reason']})")
        elif kind == "finish":
            self._line(f"[finish] result={ev['result'].result!r}")

    def end(self) -> None:
        if self._col:
            self._w("\n")
            self._col = 0
        sys.stdout.flush()


def say(s: str = "") -> None:
    print(s, flush=True)


def rule(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(3, 78 - len(title)))


# =========================================================================== commands


async def _demo(args: argparse.Namespace) -> int:
    url = normalize_db(args.db)
    p = open_persistence(url, must_exist=False)
    try:
        session_id = args.session or new_id("ses")
        existing = await p.get_session(session_id)
        if existing is not None:
            raise CliError(f"session {session_id!r} already exists in {url}; pick another --session "
                           f"or resume it with `we0nb resume {session_id} --db {url}`.")
        ledger = ledger_path(url)
        agent = demo_agent(p, session_id, ledger, delay=args.delay)
        say(f"we0nb demo: a scripted agent (no API key, no network) on {url}")
        say(f"  session   {session_id}")
        say("  tools     place_order (side effects: never run twice)")
        say("            check_stock (side_effects=False: safe to run again)")
        say(f"  ledger    {ledger}  (place_order appends one line per order it really places)")

        rule("1. prompt run, aborted while check_stock is running")
        abort = asyncio.Event()
        loop = asyncio.get_running_loop()
        show = LivePrinter()
        aborted = False
        try:
            async for ev in agent.stream(abort=abort, mode="prompt", session_id=session_id,
                                         messages=[user_message(DEMO_PROMPT)]):
                show(ev)
                if ev["type"] == "tool" and ev["part"].tool == "check_stock" and ev["part"].state.status == "running":
                    # abort programmatically, mid-tool (a click on Abort does the same in a notebook)
                    loop.call_later(args.abort_after, abort.set)
        except asyncio.CancelledError:
            aborted = True
        show.end()
        if not aborted:
            raise CliError("the demo run was expected to be aborted mid-tool but finished; "
                           "try a smaller --abort-after.")
        say(f"!! abort.set() {args.abort_after:.2f}s into check_stock: the run stopped and raised CancelledError.")
        tr = await agent.transcript(session_id)
        last = tr.last_assistant
        say("What was persisted - nothing was closed; this is exactly what resume repairs:")
        say(f"  assistant message time.completed = {last.info.time.completed if last else None}")
        say(format_tools(tr))

        if args.no_resume:
            say()
            say("Stopped after the abort (--no-resume). Resume it, from this or any other process:")
            say(f"  we0nb resume {session_id} --db {url}")
            return 0

        rule("2. resume: mode='resume', same session_id, a fresh abort event")
        show = LivePrinter()
        async for ev in agent.stream(abort=asyncio.Event(), mode="resume", session_id=session_id):
            show(ev)
        show.end()

        return await _report(agent, session_id, url, ledger)
    finally:
        await p.close()


async def _report(agent: We0Agent, session_id: str, url: str, ledger: Path) -> int:
    tr = await agent.transcript(session_id)
    rule("3. the persisted transcript")
    say(format_transcript(tr))
    rule("4. tool calls: keep / recall / interrupt")
    say(format_tools(tr))
    rule("5. the side effect ran once")
    orders = read_ledger(ledger, session_id)
    ran = orders
    calls = [p for m in tr.messages for p in m.tool_parts if p.tool == "place_order"]
    for c in calls:
        item = c.state.input.get("item")
        n = sum(1 for o in ran if o.get("item") == item)
        verdict = {"completed": "completed before the abort, kept on resume (not run again)",
                   "error": "interrupted: never executed, not replayed"}.get(c.state.status, c.state.status)
        say(f"  place_order({item!r}): executed {n} time(s) per the ledger - {verdict}")
    say(f"  ledger {ledger}: {len(ran)} order(s) for this session: "
        + (", ".join(f"{o['order_id']} {o['quantity']} x {o['item']}" for o in ran) or "none"))
    ok = all(sum(1 for o in ran if o.get("item") == item) <= 1
             for item in {c.state.input.get("item") for c in calls})
    if not ok:
        say("FAILED: a side effect ran more than once.")
        return 1
    say("OK: every side effect ran at most once; the read-only check_stock was simply run again.")
    if url == "memory":
        return 0
    say()
    say("Look again later:")
    say(f"  we0nb sessions --db {url}")
    say(f"  we0nb show {session_id} --db {url}")
    return 0


def _is_demo_session(tr: Transcript) -> bool:
    first_user = next((m for m in tr.messages if m.info.role == "user"), None)
    if first_user is None or first_user.text != DEMO_PROMPT:
        return False
    return all(p.tool in DEMO_TOOLS for m in tr.messages for p in m.tool_parts)


async def _load_existing(url: str, session_id: str) -> tuple[Persistence, Transcript]:
    p = open_persistence(url, must_exist=True)
    tr = await p.load_transcript(session_id)
    if tr.session is None:
        await p.close()
        raise CliError(f"no session {session_id!r} in {url}. List the sessions with `we0nb sessions --db {url}`.")
    return p, tr


async def _resume(args: argparse.Namespace) -> int:
    url = normalize_db(args.db)
    p, tr = await _load_existing(url, args.session)
    try:
        state = session_state(tr)
        if state == "complete":
            say(f"session {args.session} is complete: nothing to resume (a resume would call no model "
                "and write nothing).")
            return 0
        if not _is_demo_session(tr):
            raise CliError(
                f"session {args.session!r} was not written by `we0nb demo`, so the command line has no model "
                "or tools for it. Resume it from Python with the agent that ran it:\n"
                f"    agent = We0Agent(model, tools=[...], persistence=SqlPersistence({url!r}))\n"
                f"    await agent.invoke(mode='resume', session_id={args.session!r})")
        ledger = ledger_path(url)
        agent = demo_agent(p, args.session, ledger, delay=args.delay, continuation_only=True)
        say(f"Resuming {args.session} ({state}) with the demo's tools and its scripted continuation.")
        show = LivePrinter()
        async for ev in agent.stream(abort=asyncio.Event(), mode="resume", session_id=args.session):
            show(ev)
        show.end()
        return await _report(agent, args.session, url, ledger)
    finally:
        await p.close()


async def _sessions(args: argparse.Namespace) -> int:
    url = normalize_db(args.db)
    p = open_persistence(url, must_exist=True)
    try:
        sessions = await p.list_sessions()
        if not sessions:
            say(f"no sessions in {url}")
            return 0
        rows = []
        for s in sorted(sessions, key=lambda s: s.time.created):
            tr = await p.load_transcript(s.id)
            rows.append({"session": s.id, "updated": _ts(s.time.updated), "messages": str(len(tr.messages)),
                         "tools": str(sum(len(m.tool_parts) for m in tr.messages)),
                         "state": session_state(tr), "title": s.title})
        say(table(rows, ("session", "updated", "messages", "tools", "state", "title"), {"title": 40}))
        say(f"\n{len(rows)} session(s) in {url}")
        return 0
    finally:
        await p.close()


async def _show(args: argparse.Namespace) -> int:
    url = normalize_db(args.db)
    p, tr = await _load_existing(url, args.session)
    try:
        say(format_transcript(tr))
        say()
        say("tool calls:")
        say(format_tools(tr))
        say(f"\nstate: {session_state(tr)}")
        return 0
    finally:
        await p.close()


def notebooks_dir() -> Optional[Path]:
    for cand in (Path.cwd() / "notebooks", Path(__file__).resolve().parent.parent / "notebooks"):
        if (cand / "01-quickstart.ipynb").exists():
            return cand
    return None


def _lab(args: argparse.Namespace) -> int:
    where = Path(args.dir) if args.dir else notebooks_dir()
    if where is None or not where.is_dir():
        raise CliError("cannot find the notebooks/ folder (it is in the source repository, not in the wheel). "
                       "Run `we0nb lab` from a clone of the repository, or pass --dir PATH.")
    extra = list(args.jupyter_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    cmd = [sys.executable, "-m", "jupyter", "lab", str(where), *extra]
    if args.dry_run:
        say(" ".join(cmd))
        return 0
    if shutil.which("jupyter-lab") is None:
        try:
            import jupyterlab  # noqa: F401
        except ImportError:
            raise CliError("JupyterLab is not installed: pip install jupyterlab 'we0nb[notebook]'") from None
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


# =========================================================================== argument parsing


def build_parser() -> argparse.ArgumentParser:
    default_db = os.environ.get("WE0NB_DB", DEFAULT_DB)
    db_help = (f"database: a SQLAlchemy URL (sqlite:///file.db, postgresql+psycopg://...) or a SQLite file path "
               f"(default: $WE0NB_DB or {DEFAULT_DB}, now {default_db})")
    parser = argparse.ArgumentParser(
        prog="we0nb",
        description="we0nb: an asyncio agent engine whose resume never repeats a side effect.",
        epilog="Start with `we0nb demo`. Every command takes --db URL.",
    )
    from . import __version__
    parser.add_argument("--version", action="version", version=f"we0nb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    d = sub.add_parser(
        "demo", help="run a scripted agent, abort it mid-tool, resume it, print the transcript",
        description="A scripted agent (no API key, no network) with two tools - place_order (side effects) and "
                    "check_stock (read-only) - runs on a database, is aborted while check_stock is running, then "
                    "resumed: place_order that finished is kept, check_stock is recalled (run again), the "
                    "unstarted place_order is interrupted (never run). The transcript, the tool table and a "
                    "ledger proving the side effect ran once are printed.")
    d.add_argument("--db", default=default_db, help=db_help)
    d.add_argument("--session", help="session id to create (default: a new ses_... id)")
    d.add_argument("--no-resume", action="store_true",
                   help="stop after the abort; resume later with `we0nb resume SESSION`")
    d.add_argument("--delay", type=float, default=0.03, help="seconds between streamed words (default 0.03)")
    d.add_argument("--abort-after", type=float, default=0.15,
                   help="seconds into check_stock (which takes 0.6 s) at which to abort (default 0.15)")
    d.set_defaults(run=_demo)

    s = sub.add_parser("sessions", help="list the sessions of a database",
                       description="List every session: id, last update, message and tool-call counts, and "
                                   "whether it is complete or needs a resume.")
    s.add_argument("--db", default=default_db, help=db_help)
    s.set_defaults(run=_sessions)

    sh = sub.add_parser("show", help="print a session's transcript and tool table",
                        description="Print the persisted transcript of SESSION and a table of its tool calls "
                                    "with their keep / recall / interrupt outcome.")
    sh.add_argument("session", metavar="SESSION", help="session id (see `we0nb sessions`)")
    sh.add_argument("--db", default=default_db, help=db_help)
    sh.set_defaults(run=_show)

    r = sub.add_parser("resume", help="resume an interrupted demo session (mode='resume')",
                       description="Resume SESSION with mode='resume': recovery keeps finished tool calls, "
                                   "recalls read-only ones, interrupts those with side effects, then the model "
                                   "continues. The command line only has the demo's tools and its scripted "
                                   "continuation, so it resumes sessions made by `we0nb demo`; resume others "
                                   "from Python with the agent that ran them.")
    r.add_argument("session", metavar="SESSION", help="session id (see `we0nb sessions`)")
    r.add_argument("--db", default=default_db, help=db_help)
    r.add_argument("--delay", type=float, default=0.03, help="seconds between streamed words (default 0.03)")
    r.set_defaults(run=_resume)

    from .cli_batch import add_parsers as batch_parsers

    batch_parsers(sub, lambda p: p.add_argument("--db", default=default_db, help=db_help), normalize_db)

    lab = sub.add_parser("lab", help="open the tutorial notebooks in JupyterLab",
                         description="Run `jupyter lab notebooks/` (extra arguments go to jupyter lab).")
    lab.add_argument("--dir", help="notebook folder (default: ./notebooks or the repository's notebooks/)")
    lab.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    lab.add_argument("jupyter_args", nargs=argparse.REMAINDER, help="arguments passed to jupyter lab")
    lab.set_defaults(run=_lab)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .cli_batch import BatchCliError

    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    for name in ("delay", "abort_after"):
        v = getattr(args, name, None)
        if v is not None and v < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    try:
        if asyncio.iscoroutinefunction(args.run):
            return asyncio.run(args.run(args))
        return args.run(args)
    except (CliError, BatchCliError) as e:
        sys.stdout.flush()
        print(f"we0nb {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an error of the engine or the database: say what, without a traceback wall
        from .errors import We0Error

        if isinstance(e, We0Error):
            print(f"we0nb {args.command}: error: {e}", file=sys.stderr)
            return 1
        try:
            from sqlalchemy.exc import SQLAlchemyError
        except ImportError:  # pragma: no cover
            SQLAlchemyError = ()  # type: ignore[assignment,misc]
        import sqlite3

        if isinstance(e, (SQLAlchemyError, sqlite3.Error, OSError)):
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"we0nb {args.command}: error: the database {getattr(args, 'db', '')!r} cannot be used: "
                  f"{type(e).__name__}: {first}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

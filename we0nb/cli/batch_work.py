"""``we0nb batch run`` and ``we0nb batch work``: a batch worker on any host.

``batch run MODULE:ATTR --prompts FILE --name NAME --db URL`` creates the batch (or continues
it: the same prompts under the same name) and works on it; ``batch work MODULE:ATTR NAME --db
URL`` joins one that exists. Workers share a batch through the database (PostgreSQL for many
hosts), exactly as ``agent.batch(prompts, name=...)`` in several processes does. Each shows
the notebook's progress as a text bar and returns once every item has ended.

Ctrl-C or SIGTERM (a scheduler stopping the worker) stops it cleanly: its running items are
cut where they are and queued again, what it had claimed is given back, and the other workers
(or the next one started) take them; a second signal cancels at once. Exit codes: 0 the batch
is complete, 1 it is not (``--max-failures`` reached, or an error), 130 Ctrl-C, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import signal
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from ._common import EXIT_INTERRUPTED, CliError, CtrlC, check_batch, check_name, hint, say
from ._db import from_env, normalize_db, open_store, read_sync, safe_url, sqlite_file
from ._target import load_agent, read_prompts

__all__ = ["add_work_parsers", "cmd_run", "cmd_work", "EXIT_TERMINATED"]

EXIT_TERMINATED = 128 + signal.SIGTERM  # 143, as a shell reports a process SIGTERM ended
#: the largest --concurrency and --max-failures (a bigger count is a typo, and overflows the database)
MAX_CONCURRENCY = 1000
MAX_FAILURES = 1_000_000_000


class Stopper:
    """SIGINT and SIGTERM for a worker: the first stops the batch (``stop``), a second cancels it."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.signal: Optional[int] = None
        #: the second signal, which cancelled the worker at once (None: it stopped, or goes on)
        self.cancelled_by: Optional[int] = None
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._installed: list[int] = []

    def install(self) -> "Stopper":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._loop.add_signal_handler(sig, self._on_signal, sig)
                self._installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        return self

    def uninstall(self) -> None:
        if signal.SIGTERM in self._installed:
            self._loop.remove_signal_handler(signal.SIGTERM)  # (SIGINT: the command's CtrlC removes it)

    def _on_signal(self, sig: int) -> None:
        if self.signal is None:
            self.signal = sig
            self.stop.set()
            sys.stderr.write(f"\n{_signal_name(sig)}: stopping; the items this worker holds go back to the batch "
                             "(another signal cancels at once)\n")
            sys.stderr.flush()
        elif self._task is not None and self.cancelled_by is None:
            self.cancelled_by = sig
            self._task.cancel()

    def exit_code(self) -> int:
        """130 when Ctrl-C ended the worker, 143 when SIGTERM did (the signal that cancelled it, if any)."""
        last = self.cancelled_by if self.cancelled_by is not None else self.signal
        return EXIT_INTERRUPTED if last == signal.SIGINT else EXIT_TERMINATED


def _signal_name(sig: Optional[int]) -> str:
    """The two signals a worker handles, as its lines name them."""
    return "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"


def _db_args(args: argparse.Namespace, url: str) -> tuple[str, ...]:
    """``--db URL`` for a suggested command — none when the URL came from ``$WE0NB_DB``, which the
    pasted command reads too (its password stays out of sight, and is not pasted back as ``***``)."""
    return () if args.db is None and from_env() is not None else ("--db", url)


def _store_url(args: argparse.Namespace) -> Optional[str]:
    db = args.db if args.db is not None else from_env()
    if db is None:
        return None
    url = normalize_db(db)
    if url == "memory" or (url.startswith("sqlite") and sqlite_file(url) is None):
        raise CliError(f"--db {safe_url(url)}: a batch in memory is not shared and not kept; pass a database URL "
                       "(postgresql://… for workers on several hosts, or sqlite:///file.db).")
    return url


@asynccontextmanager
async def _on_database(agent: Any, args: argparse.Namespace) -> AsyncIterator[tuple[Any, str]]:
    """The agent working on ``--db`` (a copy of it on that store), and the URL for messages."""
    from ..persistence import MemoryPersistence

    url = _store_url(args)
    if url is None:
        if isinstance(agent.persistence, MemoryPersistence):
            raise CliError(f"{args.agent} keeps its sessions in memory: pass --db URL (or set $WE0NB_DB), "
                           "the database the batch's workers share.")
        yield agent, getattr(agent.persistence, "url", "the agent's database")
        return
    store = open_store(url, read_only=False)
    worker = copy.copy(agent)
    worker.persistence = store
    try:
        yield worker, url
    finally:
        await store.close()


async def _work(agent: Any, args: argparse.Namespace, ctrl: CtrlC, url: str,
                prompts: Optional[list[str]]) -> int:
    from ..batch import work_batch
    from ..persistence.batches import batch_queue

    stop = asyncio.Event()
    stopper = Stopper(stop).install()  # (replaces the command's Ctrl-C: a stop gives back, not an abort)
    options = dict(concurrency=args.concurrency, abort=stop, progress=not args.no_progress,
                   max_failures=args.max_failures)
    result: Any = None
    try:
        if prompts is not None:
            result = await agent.batch(prompts, name=args.name, **options)
        else:
            result = await work_batch(agent, args.name, **options)
    except asyncio.CancelledError:
        if stopper.cancelled_by is None:
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # (the second signal's cancel, handled here: the worker reports and exits)
    finally:
        stopper.uninstall()
    (info,) = await batch_queue(agent.persistence).list_batches(args.name)
    counts = ", ".join(f"{k}={v}" for k, v in sorted(info.counts.items()))
    db = _db_args(args, url)
    again = hint("we0nb", "batch", "work", args.agent, args.name, *db)
    if info.unfinished == 0:
        waiting = info.counts.get("approval", 0)
        asks = (f"; {waiting} ended waiting for a person's approval: `{hint('we0nb', 'approvals', *db)}` "
                "lists the calls" if waiting else "")
        say(f"batch {args.name}: complete, {info.items} items ({counts}); "
            f"`{hint('we0nb', 'batch', 'show', args.name, *db)}` shows it{asks}")
        return 0
    say(f"batch {args.name}: {info.unfinished} of {info.items} items unfinished ({counts})")
    if stopper.signal is not None:
        held = await _held_here(agent, args.name)
        left = ("nothing held" if not held else
                f"{held} item(s) still held by this process (taken over once their claims lapse)")
        how = (f"stopped by {_signal_name(stopper.signal)}" if stopper.cancelled_by is None else
               f"cancelled at once by a second {_signal_name(stopper.cancelled_by)}")
        print(f"we0nb batch: {how}: {left}; `{again}` continues it.", file=sys.stderr, flush=True)
        return stopper.exit_code()
    why = "--max-failures reached" if result.stopped == "max_failures" else f"stopped ({result.stopped})"
    raise CliError(f"batch {args.name}: {why}; `{hint('we0nb', 'batch', 'show', args.name, *db)}` "
                   f"lists the failures, `{again}` goes on.")


async def _held_here(agent: Any, name: str) -> int:
    """The batch's items the store says a worker of this process still holds (running, claimed)."""
    from ..persistence.base import lease_owner
    from ..persistence.batches import batch_queue

    here = lease_owner("")  # (host:pid: — every owner this process's workers use starts so)
    items = await batch_queue(agent.persistence).batch_items(name)
    return sum(1 for it in items if it.status == "running" and (it.owner or "").startswith(here))


async def cmd_run(args: argparse.Namespace, ctrl: CtrlC) -> int:
    check_batch(args.name, "--name")
    prompts = read_prompts(args.prompts, args.column)  # (a bad file says so before the agent loads)
    async with _on_database(await load_agent(args.agent), args) as (agent, url):
        return await _work(agent, args, ctrl, safe_url(url), prompts)


def _create_hint(args: argparse.Namespace, url: str) -> str:
    return hint("we0nb", "batch", "run", args.agent, "--prompts", "FILE", "--name", args.name, *_db_args(args, url))


def _check_batch(args: argparse.Namespace) -> None:
    """``work`` only joins a batch: one ``--db`` lacks is refused before the store is opened for
    writing (which would create the database, or we0nb's tables in another application's)."""
    from ..persistence.sql.batches import read_infos

    url = _store_url(args)
    if url is None:  # (the agent's own store, opened by its module: checked by work_batch)
        return
    infos = read_sync(url, read_infos, _create_hint(args, url))
    if not any(i.name == args.name for i in infos):
        known = ", ".join(repr(i.name) for i in infos[:10]) or "none"
        raise CliError(f"no batch {args.name!r} in {safe_url(url)} (batches: {known}); create it first with "
                       f"`{_create_hint(args, url)}`.")


async def cmd_work(args: argparse.Namespace, ctrl: CtrlC) -> int:
    check_name(args.name, "NAME", "batch names")  # (any existing batch may be joined)
    _check_batch(args)
    async with _on_database(await load_agent(args.agent), args) as (agent, url):
        try:
            return await _work(agent, args, ctrl, safe_url(url), None)
        except LookupError as e:
            where = str(e).replace("this database", safe_url(url))
            raise CliError(f"{where}; create it first with `{_create_hint(args, url)}`.") from None


def _count(maximum: int) -> Any:
    """An argparse type: an integer from 1 to ``maximum``."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if not 1 <= n <= maximum:
            raise argparse.ArgumentTypeError(f"expected an integer >= 1 and at most {maximum}, got {text!r}")
        return n

    return parse


def _worker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("agent", metavar="MODULE:ATTR",
                   help="the agent: a We0Agent, or a function returning one, in a module importable from here "
                        "(e.g. myproject.agents:agent)")
    p.add_argument("--db", default=None,
                   help="the database the workers share (postgresql://… across hosts; sqlite:///file.db on one); "
                        "default $WE0NB_DB, else the agent's own")
    p.add_argument("--concurrency", type=_count(MAX_CONCURRENCY), default=8, metavar="N",
                   help=f"items at a time (default 8, at most {MAX_CONCURRENCY})")
    p.add_argument("--max-failures", type=_count(MAX_FAILURES), default=None, metavar="N",
                   help="stop this worker after N failed items")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for logs)")


def add_work_parsers(bsub: Any, common: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``batch run`` and ``batch work`` under ``we0nb batch``."""
    run = bsub.add_parser("run", parents=[common], help="create (or continue) a batch from a file and work on it",
                          description="Create batch NAME from the prompts of FILE (or continue it) and work on it "
                                      "until every item has ended. Run it on several hosts with the same "
                                      "arguments, or start more workers with `we0nb batch work`.")
    _worker_options(run)
    run.add_argument("--prompts", required=True, metavar="FILE", help="a .jsonl, .csv or .parquet file")
    run.add_argument("--column", default=None, help="the column of the prompts (default: the only one, or 'prompt')")
    run.add_argument("--name", required=True, help="the batch's name (the same on every worker)")
    run.set_defaults(run=cmd_run)
    work = bsub.add_parser("work", parents=[common], help="join an existing batch as one more worker",
                           description="Work on the existing batch NAME until every item has ended.")
    _worker_options(work)
    work.add_argument("name", metavar="NAME", help="the batch (see `we0nb batch ls`)")
    work.set_defaults(run=cmd_work)
    return {"batch run": run, "batch work": work}

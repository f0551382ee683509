"""``we0nb batch ls`` and ``we0nb batch show NAME``: the batches of a database, read-only
(the workers, ``batch run`` and ``batch work``, are :mod:`we0nb.cli.batch_work`).

The database is opened as the other reading commands open it (a SQLite file ``mode=ro``,
nothing created anywhere): a database without batches says so in one line.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
from typing import Any, Optional

from ..models.pricing import format_cost
from ..persistence.batches import BATCH_STATUSES, BatchInfo, BatchItem, ItemCost
from ._common import CliError, hint, say
from ._db import normalize_db, read_sync, safe_url
from .batch_work import add_work_parsers
from .render import printable

__all__ = ["add_parsers", "format_batches", "format_batch", "cmd_ls", "cmd_show"]


def _ts(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _table(rows: list[dict[str, str]], columns: list[str]) -> str:
    widths = {c: max([len(c)] + [len(r.get(c, "")) for r in rows]) for c in columns}
    head = "  ".join(c.ljust(widths[c]) for c in columns)
    lines = ["  ".join(r.get(c, "").ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join([head, "  ".join("-" * widths[c] for c in columns), *lines])


def format_batches(infos: list[BatchInfo]) -> str:
    """One line per batch: items by status, unfinished items, last activity."""
    shown = [s for s in BATCH_STATUSES if any(i.counts.get(s) for i in infos)]
    rows = [{"batch": i.name, "items": str(i.items), **{s: str(i.counts.get(s, 0)) for s in shown},
             "unfinished": str(i.unfinished), "updated": _ts(i.updated)} for i in infos]
    return _table(rows, ["batch", "items", *shown, "unfinished", "updated"])


def format_batch(info: BatchInfo, items: list[BatchItem], max_failures: int = 20,
                 costs: Optional[list[ItemCost]] = None, go_on: str = "") -> str:
    """Counts by status, attempts, tokens, cost and run times, and the failed items with their errors.
    ``go_on``: the command that continues an unfinished batch (default: the Python call)."""
    out = [f"batch {info.name}: {info.items} items, created {_ts(info.created)}, updated {_ts(info.updated)}"]
    out.append("  " + "  ".join(f"{s}={info.counts[s]}" for s in BATCH_STATUSES if info.counts.get(s)))
    if info.unfinished:
        go_on = go_on or f"the same agent.batch(prompts, name={info.name!r})"
        out.append(f"  {info.unfinished} item(s) unfinished: {go_on} continues it")
    runs = [it.duration for it in items if it.attempts]
    if runs:
        out.append(f"  run time per item: median {statistics.median(runs):.2f} s, max {max(runs):.2f} s; "
                   f"attempts: {sum(it.attempts for it in items)} for {len(runs)} started item(s)")
    out.append(f"  tokens: {sum(it.input_tokens for it in items)} in, {sum(it.output_tokens for it in items)} out; "
               f"tool calls: {sum(it.tool_calls for it in items)}")
    if costs:
        out.append(f"  cost: {_batch_cost(costs)}")
    failed = [it for it in items if it.status == "failed"]
    if failed:
        out.append(f"\nfailures ({len(failed)}):")
        for it in failed[:max_failures]:
            error = (it.error or "").strip().splitlines()
            out.append(f"  item {it.item} ({it.session_id}): {printable(error[0][:160]) if error else '?'}")
        if len(failed) > max_failures:
            out.append(f"  … {len(failed) - max_failures} more (batch_df(store, {info.name!r}) has them all)")
    return "\n".join(out)


def _batch_cost(costs: list[ItemCost]) -> str:
    priced = sum(c.priced for c in costs)
    unknown = [c for c in costs if c.unpriced]
    if not unknown:
        return format_cost(priced)
    calls = sum(c.unpriced for c in unknown)
    return (f"unknown: {calls} model call(s) of {len(unknown)} item(s) without a known price; "
            f"the priced calls {format_cost(priced)}")


def _writer(url: str, name: str = "NAME") -> str:
    """The command that writes a batch, suggested for a database without one."""
    return hint("we0nb", "batch", "run", "MODULE:ATTR", "--prompts", "FILE", "--name", name, "--db", url)


def cmd_ls(args: argparse.Namespace) -> int:
    from ..persistence.sql.batches import read_infos

    url = normalize_db(args.db)
    infos = read_sync(url, read_infos, _writer(url))
    if not infos:
        say(f"no batches in {safe_url(url)}")
        return 0
    say(format_batches(infos))
    say(f"\n{len(infos)} batch(es) in {safe_url(url)}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..persistence.sql.batches import read_costs, read_infos, read_items

    url, name = normalize_db(args.db), args.name
    infos, items, costs = read_sync(url, lambda conn: (read_infos(conn), read_items(conn, name),
                                                       read_costs(conn, name)), _writer(url, name))
    info = next((i for i in infos if i.name == name), None)
    if info is None:
        known = ", ".join(repr(i.name) for i in infos[:10]) or "none"
        raise CliError(f"no batch {name!r} in {safe_url(url)} (batches: {known}); list them with "
                       f"`{hint('we0nb', 'batch', 'ls', '--db', url)}`.")
    go_on = f"`{hint('we0nb', 'batch', 'work', 'MODULE:ATTR', name, '--db', url)}` (MODULE:ATTR: its agent)"
    say(format_batch(info, items, costs=costs, go_on=go_on))
    return 0


def add_parsers(sub: Any, db: argparse.ArgumentParser, common: argparse.ArgumentParser) -> dict[str, Any]:
    b = sub.add_parser("batch", parents=[common], help="run batch workers, list the batches, or show one",
                       description="The batches agent.batch(...) persisted: `we0nb batch ls` lists them, "
                                   "`we0nb batch show NAME` prints one's counts by status and its failures "
                                   "(these two only read). `we0nb batch run` and `we0nb batch work` are workers: "
                                   "as many as you like, on any hosts sharing the database.")
    bsub = b.add_subparsers(dest="batch_command", metavar="ls|show|run|work")
    ls = bsub.add_parser("ls", parents=[db, common], help="list the batches: items by status",
                         description="List every batch: items by status, unfinished items, last activity.")
    ls.set_defaults(run=cmd_ls)
    show = bsub.add_parser("show", parents=[db, common], help="counts by status and the failures of one batch",
                           description="Print batch NAME: counts by status, run times, tokens, cost, failures.")
    show.add_argument("name", metavar="NAME", help="batch name (see `we0nb batch ls`)")
    show.set_defaults(run=cmd_show)
    workers = add_work_parsers(bsub, common)
    b.set_defaults(run=lambda args: b.print_help() or 2)
    return {"batch": b, "batch ls": ls, "batch show": show, **workers}

"""One multi-call turn whose tool has a real external effect: the child that
``test_crash_exactly_once.py`` kills with SIGKILL at random instants (issue 33's proof).

The turn: step 1 calls ``pay(n=1)`` and ``pay(n=2)``, step 2 calls ``pay(n=3)``, step 3
answers "All done.". The model decides from the history it is sent (how many ``pay`` calls
it has seen), so the same model serves the first run and every resume. ``pay`` charges
``100 + n``; how depends on the variant (``--variant``):

  http    ``@tool(idempotent=True)``: POST to a payments service on 127.0.0.1 (run by the
          test) with the call's key in the ``Idempotency-Key`` header; retried on 409
  pg      ``@tool(reconcile=...)``: INSERT a row keyed by the call's key into a PostgreSQL
          table whose key is the primary key; the reconcile looks the key up
  ledger  ``@tool`` (side effects, neither keyword): append a line to a file (fsync'd)

Each tool waits a little before and after its effect, so random kill instants land before,
during and after effects. A run (``main``) opens the store, prints ``READY`` (the kill delays
count from there), then resumes the session when the store has it and starts it otherwise. Run directly, or as ``--zygote``: a process that has imported
everything and forks one worker per request (a worker then starts in milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Optional

from we0nb import Reconciled, RunResult, SqlPersistence, ToolContext, We0Agent, tool, user_message
from we0nb.models.base import AssistantTurn, ModelRequest, UserTurn
from we0nb.testing import FunctionModel, text, tool_call

VARIANTS = ("http", "pg", "ledger")
CALLS = 3
PAUSE = 0.01  # seconds each tool waits before and after its effect
EFFECTS_TABLE = "eoproof_effects"
STOP = "Stop."  # a new prompt that ends the turn where it is


@dataclass(frozen=True)
class Config:
    variant: str
    store_url: str
    store_schema: Optional[str] = None
    service: Optional[str] = None  # the payments service's base URL (http)
    pg_url: Optional[str] = None  # where the effects table is (pg)
    pg_schema: Optional[str] = None
    ledger: Optional[str] = None  # the ledger file (ledger)
    approval: bool = False  # pay requires a person's approval

    def argv(self) -> list[str]:
        out = ["--variant", self.variant, "--store-url", self.store_url]
        for flag, value in (("--store-schema", self.store_schema), ("--service", self.service),
                            ("--pg-url", self.pg_url), ("--pg-schema", self.pg_schema), ("--ledger", self.ledger)):
            if value:
                out += [flag, value]
        return out + (["--approval"] if self.approval else [])


def plan(request: ModelRequest) -> Any:
    """The model: pay 1 and 2 in one step, then 3, then say so; "Stop." stops it."""
    users = [m for m in request.messages if isinstance(m, UserTurn)]
    if users and users[-1].text == STOP:
        return [text("Stopped.")]
    seen = sum(1 for m in request.messages if isinstance(m, AssistantTurn) for c in m.tool_calls if c.name == "pay")
    if seen < 2:
        return [text("Paying the first two."), *(tool_call("pay", {"n": n}) for n in range(seen + 1, 3))]
    if seen < CALLS:
        return [text("And the third."), tool_call("pay", {"n": CALLS})]
    return [text("All done.")]


# --------------------------------------------------------------------------- the three tools


def http_pay(service: str):
    def pay(n: int, ctx: ToolContext) -> str:
        """Charge 100 + n through the payments service."""
        time.sleep(PAUSE)
        body = json.dumps({"amount": 100 + n}).encode()
        for _ in range(500):
            req = urllib.request.Request(f"{service}/v1/charges", data=body, method="POST", headers={
                "Content-Type": "application/json", "Idempotency-Key": ctx.idempotency_key,
                "X-Attempt": str(ctx.attempt)})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    charge = json.loads(r.read())
                break
            except urllib.error.HTTPError as e:
                if e.code != 409:  # 409: the same key is still running: retry, as Stripe advises
                    raise
                time.sleep(0.02)
        else:
            raise RuntimeError("the payments service kept answering 409")
        time.sleep(PAUSE)
        return f"charged {charge['amount']} as {charge['id']}"

    return pay


def pg_connect(url: str, schema: str) -> Any:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn


def create_effects_table(url: str, schema: str) -> None:
    with pg_connect(url, schema) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (key text PRIMARY KEY, n int NOT NULL, "
                     "pid int NOT NULL)")


def pg_pay(url: str, schema: str):
    def pay(n: int, ctx: ToolContext) -> str:
        """Record payment n as a row keyed by the call's idempotency key."""
        time.sleep(PAUSE)
        with pg_connect(url, schema) as conn:
            conn.execute(f"INSERT INTO {EFFECTS_TABLE} (key, n, pid) VALUES (%s, %s, %s)",
                         (ctx.idempotency_key, n, os.getpid()))
        time.sleep(PAUSE)
        return f"row {n}"

    def reconcile(ctx: ToolContext, input: dict[str, Any]) -> Reconciled:
        with pg_connect(url, schema) as conn:
            row = conn.execute(f"SELECT n FROM {EFFECTS_TABLE} WHERE key = %s", (ctx.idempotency_key,)).fetchone()
        return Reconciled.done(f"row {row[0]}") if row else Reconciled.not_done()

    return pay, reconcile


def ledger_pay(path: str):
    def pay(n: int, ctx: ToolContext) -> str:
        """Append payment n to the ledger."""
        time.sleep(PAUSE)
        with open(path, "a") as f:
            f.write(json.dumps({"key": ctx.idempotency_key, "n": n, "pid": os.getpid()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        time.sleep(PAUSE)
        return f"paid {n}"

    return pay


def make_tool(cfg: Config) -> Any:
    if cfg.variant == "http":
        assert cfg.service
        return tool(http_pay(cfg.service), name="pay", idempotent=True, requires_approval=cfg.approval)
    if cfg.variant == "pg":
        assert cfg.pg_url and cfg.pg_schema
        fn, check = pg_pay(cfg.pg_url, cfg.pg_schema)
        return tool(fn, name="pay", reconcile=check, requires_approval=cfg.approval)
    assert cfg.variant == "ledger" and cfg.ledger
    return tool(ledger_pay(cfg.ledger), name="pay", requires_approval=cfg.approval)


def make_agent(cfg: Config) -> We0Agent:
    store = (SqlPersistence(cfg.store_url, schema=cfg.store_schema) if cfg.store_schema
             else SqlPersistence(cfg.store_url))
    return We0Agent(FunctionModel(plan), tools=[make_tool(cfg)], persistence=store, flush_interval=0.0)


async def run(agent: We0Agent, session: str) -> RunResult:
    """Resume the session when the store has its first message; start it otherwise."""
    tr = await agent.persistence.load_transcript(session)
    if tr.messages:
        return await agent.invoke(mode="resume", session_id=session)
    return await agent.invoke(session_id=session, messages=[user_message("Please make the three payments.")])


async def main(args: argparse.Namespace) -> int:
    cfg = Config(args.variant, args.store_url, args.store_schema, args.service, args.pg_url, args.pg_schema,
                 args.ledger, args.approval)
    agent = make_agent(cfg)
    try:
        await agent.persistence.load_transcript(args.session)  # connected, tables checked: the turn starts now
        print("READY", flush=True)
        result = await run(agent, args.session)
        print("RESULT " + json.dumps({"result": result.result, "text": result.text}), flush=True)
    finally:
        await agent.persistence.close()
    return 0


# --------------------------------------------------------------------------- the zygote


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", choices=VARIANTS, required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--store-url", required=True)
    ap.add_argument("--store-schema", default=None)
    ap.add_argument("--service", default=None)
    ap.add_argument("--pg-url", default=None)
    ap.add_argument("--pg-schema", default=None)
    ap.add_argument("--ledger", default=None)
    ap.add_argument("--approval", action="store_true")
    return ap


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        import zygote

        sys.exit(zygote.serve(lambda argv: asyncio.run(main(parser().parse_args(argv)))))
    sys.exit(asyncio.run(main(parser().parse_args())))

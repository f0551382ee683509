"""SPEC §11's guarantee under SIGKILL at random instants, with real external effects (issue 33).

Each trial forks a child (``eo_crash_worker.py``, through its zygote) that runs a three-call
turn on a SQLite file or a PostgreSQL store, SIGKILLs it a seeded random delay into the turn
(counted from when it has opened its store: the kills land on the turn, not on start-up), often
starts a second (and third) child that resumes and kills it too, then resumes in this
process to the end. The effects are real and read back from where they happened:

  http    an ``idempotent=True`` tool against a payments service on 127.0.0.1 that
          deduplicates on ``Idempotency-Key`` (``payments_service.py``, Stripe's rules)
  pg      a ``reconcile=`` tool whose effect is a row keyed by the call's key in a
          PostgreSQL table (the key is the primary key); the reconcile looks it up
  ledger  a plain ``side_effects=True`` tool appending to a file

Invariants: http and pg — every call ends completed with exactly one effect; ledger — at
most one effect per call, none for a call that ends interrupted with ``in_doubt`` False. Each
is also run ending with a new prompt instead of the resume (a prompt executes nothing): then
every variant has at most one effect per call, none when interrupted with ``in_doubt``
False, and the pg calls are completed exactly when their row exists (the reconcile of a
``running`` call decides), never in doubt.

``WE0NB_EO_TRIALS`` (default 4) trials per variant and store; ``WE0NB_EO_SEED`` (default
33) seeds the kill instants; ``WE0NB_EO_ONLY=<n>`` runs trial n alone. Each trial prints its
seed label, its kill delays and what the store held at each kill, so a failure can be
replayed (the instant is a delay, so a replay lands near, not exactly on, the same point).
Run with ``-s`` to see the table.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from eo_crash_worker import CALLS, EFFECTS_TABLE, STOP, Config, create_effects_table, make_agent, pg_connect, run
from payments_service import PaymentsService
from sql_support import PG_SKIP_REASON, PG_URL, create_schema, drop_schema
from we0nb import ToolPart, Transcript, user_message
from we0nb._ids import new_id

pytestmark = pytest.mark.crash

WORKER = Path(__file__).with_name("eo_crash_worker.py")
TRIALS = int(os.environ.get("WE0NB_EO_TRIALS", "4"))
SEED = os.environ.get("WE0NB_EO_SEED", "33")
ONLY = os.environ.get("WE0NB_EO_ONLY")


class Zygote:
    """``eo_crash_worker.py --zygote``: imports once, forks a worker per request."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.n = tmp, 0
        self.proc = subprocess.Popen([sys.executable, str(WORKER), "--zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the zygote died (exit {self.proc.poll()})"
        return json.loads(line)

    def spawn(self, cfg: Config, session: str) -> tuple[int, Path]:
        self.n += 1
        log = self.tmp / f"worker{self.n}.log"
        return self._ask({"op": "spawn", "argv": cfg.argv() + ["--session", session], "log": str(log)})["pid"], log

    def wait(self, pid: int) -> int:
        return self._ask({"op": "wait", "pid": pid})["status"]

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zygote]:
    z = Zygote(tmp_path_factory.mktemp("eo_zygote"))
    try:
        yield z
    finally:
        z.close()


@pytest.fixture(scope="module")
def service() -> Iterator[PaymentsService]:
    s = PaymentsService()
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[Optional[str]]:
    """One PostgreSQL schema for the module: the PostgreSQL store's tables and the effects table."""
    if PG_URL is None:
        yield None
        return
    schema = create_schema()
    create_effects_table(PG_URL, schema)
    try:
        yield schema
    finally:
        drop_schema(schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def base(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pg_schema: Optional[str],
         service: PaymentsService) -> Config:
    """The store (a SQLite file or the module's PostgreSQL schema) and where the effects go."""
    if request.param == "postgres" and pg_schema is None:
        pytest.skip(PG_SKIP_REASON)
    if request.param == "sqlite":
        store_url, store_schema = f"sqlite:///{tmp_path_factory.getbasetemp() / 'eo_store.db'}", None
    else:
        store_url, store_schema = PG_URL, pg_schema  # type: ignore[assignment]
    return Config("http", store_url, store_schema, service=service.url,
                  pg_url=PG_URL, pg_schema=pg_schema)


def for_variant(base: Config, variant: str, ledger: Path) -> Config:
    if variant == "pg" and base.pg_schema is None:
        pytest.skip(f"the pg variant's effect is a PostgreSQL row: {PG_SKIP_REASON}")
    return replace(base, variant=variant, ledger=str(ledger))


# --------------------------------------------------------------------------- reading back


def load(cfg: Config, session: str) -> Transcript:
    async def go() -> Transcript:
        agent = make_agent(cfg)
        try:
            return await agent.persistence.load_transcript(session)
        finally:
            await agent.persistence.close()

    return asyncio.run(go())


def pay_parts(tr: Transcript) -> dict[int, ToolPart]:
    parts: dict[int, ToolPart] = {}
    for m in tr.messages:
        for p in m.tool_parts:
            n = p.state.input["n"]
            assert n not in parts, f"pay(n={n}) was called twice"
            parts[n] = p
    return parts


def effects(cfg: Config, service: PaymentsService) -> dict[str, int]:
    """How many effects each idempotency key has, read from where they happened."""
    if cfg.variant == "http":
        return {k: len(v) for k, v in service.charges_by_key().items()}
    if cfg.variant == "pg":
        with pg_connect(cfg.pg_url, cfg.pg_schema) as conn:
            return {k: c for k, c in conn.execute(f"SELECT key, count(*) FROM {EFFECTS_TABLE} GROUP BY key")}
    path = Path(cfg.ledger or "")
    counts: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines() if path.exists() else []:
        counts[json.loads(line)["key"]] += 1
    return dict(counts)


def key_of(p: ToolPart) -> str:
    key = p.state.metadata.get("idempotency_key")
    assert isinstance(key, str) and key, f"call {p.call_id} has no idempotency key"
    return key


def snapshot(cfg: Config, session: str, service: PaymentsService) -> str:
    """What the store and the world held: per call, its state's letter and its effects (``r1``:
    running, one effect; ``-0``: not written yet)."""
    parts, fx = pay_parts(load(cfg, session)), effects(cfg, service)
    out = []
    for n in range(1, CALLS + 1):
        p = parts.get(n)
        out.append("-0" if p is None else f"{p.state.status[0]}{fx.get(key_of(p), 0)}")
    return " ".join(out)


def outcome(p: ToolPart) -> str:
    meta = p.state.metadata
    if p.state.status == "completed":
        return "reconciled" if meta.get("reconciled") else "recall" if meta.get("recalled") else "keep"
    if p.interrupted:
        return "in_doubt" if meta.get("in_doubt") else "interrupt"
    return "error"


# --------------------------------------------------------------------------- one trial


@dataclass
class Trial:
    label: str
    kills: list[tuple[float, int, str]]  # (delay in ms, exit code, snapshot after it)
    outcomes: tuple[str, ...] = ()
    effects: tuple[int, ...] = ()

    def row(self) -> str:
        kills = "  ".join(f"{d:5.0f}ms{'' if code else ' (ended)'} [{snap}]" for d, code, snap in self.kills)
        return (f"{self.label:<29} {' '.join(f'{o:<10}' for o in self.outcomes)} fx={self.effects}  "
                f"kills: {kills}")


def ready(pid: int, log: Path) -> None:
    """Wait until the worker has opened its store (it prints READY): the turn starts now."""
    deadline = time.monotonic() + 60
    while "READY" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"worker {pid} never got ready:\n{log.read_text()}"
        time.sleep(0.001)


def kill_after(z: Zygote, cfg: Config, session: str, delay: float) -> int:
    """Start a worker, SIGKILL it ``delay`` seconds into its turn; its exit code (0: it ended first)."""
    pid, log = z.spawn(cfg, session)
    ready(pid, log)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)  # a child that already ended is a zombie until reaped: no error
    code = z.wait(pid)
    assert code in (0, -signal.SIGKILL), f"the worker failed ({code}):\n{log.read_text()}"
    return code


def finish(cfg: Config, session: str, final: str) -> None:
    """Resume to the end, or (``final="prompt"``) send a new message that stops the turn."""
    async def go() -> None:
        agent = make_agent(cfg)
        try:
            if final == "resume":
                result = await run(agent, session)
            else:
                result = await agent.invoke(session_id=session, messages=[user_message(STOP)])
        finally:
            await agent.persistence.close()
        assert (result.result, result.text) == ("stop", "All done." if final == "resume" else "Stopped."), result

    asyncio.run(go())


def check(cfg: Config, session: str, service: PaymentsService, before: dict[str, int],
          final: str = "resume") -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The invariants; the calls' outcomes and effect counts (``-`` for a call never made)."""
    tr = load(cfg, session)
    parts = pay_parts(tr)
    if final == "resume":
        assert sorted(parts) == list(range(1, CALLS + 1)), sorted(parts)
    assert set(parts) <= set(range(1, CALLS + 1)) and tr.messages[-1].text == (
        "All done." if final == "resume" else "Stopped.")
    fx = effects(cfg, service)
    new = {k: c - before.get(k, 0) for k, c in fx.items() if c != before.get(k, 0)}
    keys = {key_of(p) for p in parts.values()}
    assert set(new) <= keys, f"effects under keys no call of this session has: {set(new) - keys}"
    charges = service.charges_by_key()
    for n, p in parts.items():
        count, meta, status = new.get(key_of(p), 0), p.state.metadata, p.state.status
        assert count <= 1, f"pay(n={n}) had {count} effects"
        assert status in ("completed", "error"), f"pay(n={n}) left {status}"
        if status == "completed":  # ran once: by the tool, or found done by its reconcile
            assert count == 1, f"pay(n={n}) is completed with {count} effects"
            if cfg.variant == "http":  # the service's saved response for the call's one charge
                assert p.state.output == f"charged {100 + n} as {charges[key_of(p)][0]['id']}"
                # attempts are counted from the store: each execution its own number, the last recorded
                seen = [int(a) for k, a in service.attempts if k == key_of(p)]
                assert len(seen) == len(set(seen)) and max(seen) == meta["attempt"], (seen, meta)
            else:
                assert p.state.output == (f"row {n}" if cfg.variant == "pg" else f"paid {n}")
        else:
            assert p.interrupted and isinstance(meta.get("in_doubt"), bool), meta
            if meta["in_doubt"] is False:
                assert count == 0, f"pay(n={n}) is interrupted as never started but had an effect"
        if cfg.variant in ("http", "pg") and final == "resume":  # exactly once: completed
            assert status == "completed", f"pay(n={n}) ended {status}: {meta}"
        if cfg.variant == "pg":  # a reconcile that tells the truth leaves nothing in doubt
            assert meta.get("in_doubt") is not True and (status == "completed") == (count == 1), meta
        if cfg.variant == "ledger" and status == "completed":
            assert outcome(p) == "keep"
    return (tuple(outcome(parts[n]) if n in parts else "-" for n in range(1, CALLS + 1)),
            tuple(new.get(key_of(parts[n]), 0) if n in parts else 0 for n in range(1, CALLS + 1)))


def one_trial(z: Zygote, cfg: Config, service: PaymentsService, label: str, horizon: float,
              final: str = "resume") -> Trial:
    rng = random.Random(label)
    session = new_id("ses")
    before = effects(cfg, service)
    trial = Trial(label, [])
    for _ in range(rng.choice((1, 1, 2, 3))):  # some are killed again while they resume
        delay = rng.uniform(0, horizon)
        code = kill_after(z, cfg, session, delay)
        trial.kills.append((delay * 1000, code, snapshot(cfg, session, service)))
    try:
        finish(cfg, session, final)
        trial.outcomes, trial.effects = check(cfg, session, service, before, final)
    except BaseException:
        print(f"\nFAILED {trial.row()}\n  replay: WE0NB_EO_SEED={SEED} WE0NB_EO_ONLY={label.rsplit(':', 1)[1]}\n"
              f"  session {session}:\n{describe(load(cfg, session))}", flush=True)
        raise
    return trial


def describe(tr: Transcript) -> str:
    """The transcript, one line per message, for a failure's report."""
    lines = []
    for m in tr.messages:
        info = m.info
        extra = "" if info.role == "user" else (
            f" completed={info.time.completed is not None} finish={getattr(info, 'finish_reason', None)!r} "
            f"error={info.error.reason if info.error else None}")
        calls = " ".join(f"{p.tool}({p.state.input.get('n')})={p.state.status}" for p in m.tool_parts)
        lines.append(f"    {info.role} {info.id} {m.text[:40]!r}{extra} {calls}")
    return "\n".join(lines)


def calibrate(z: Zygote, cfg: Config, service: PaymentsService) -> float:
    """How long a whole turn takes in a child now, from READY to its end, the quicker of two (the
    kill delays are drawn up to it); each must end with every call kept and charged once."""
    times = []
    for _ in range(2):
        session = new_id("ses")
        before = effects(cfg, service)
        pid, log = z.spawn(cfg, session)
        ready(pid, log)
        start = time.perf_counter()
        assert z.wait(pid) == 0, log.read_text()
        times.append(time.perf_counter() - start)
        assert check(cfg, session, service, before) == (("keep",) * CALLS, (1,) * CALLS)
    return min(times)


HORIZONS: dict[tuple[str, str], float] = {}


@pytest.mark.parametrize("final", ["resume", "prompt"])
@pytest.mark.parametrize("variant", ["http", "pg", "ledger"])
def test_random_sigkills_then_recovery(zygote: Zygote, service: PaymentsService, base: Config, variant: str,
                                       final: str, tmp_path: Path) -> None:
    """Kill, kill again while resuming, then resume to the end (or send a new prompt instead: a
    prompt executes nothing, it only reconciles)."""
    cfg = for_variant(base, variant, tmp_path / "ledger.jsonl")
    store = "postgres" if cfg.store_schema else "sqlite"
    if (variant, store) not in HORIZONS:
        HORIZONS[variant, store] = calibrate(zygote, cfg, service)
    horizon = HORIZONS[variant, store]
    numbers = [int(ONLY)] if ONLY else range(TRIALS)
    print(f"\n{variant} on {store}, then {final}: {len(numbers)} trials, kill delays drawn from "
          f"0..{horizon * 1000:.0f} ms after READY (one uninterrupted turn); per call: outcome, effects")
    trials = []
    for i in numbers:
        label = f"{SEED}:{variant}:{store}:{i}" if final == "resume" else f"{SEED}:{variant}:{store}:prompt:{i}"
        trials.append(one_trial(zygote, cfg, service, label, horizon, final))
        print("  " + trials[-1].row(), flush=True)
    tally = collections.Counter(o for t in trials for o in t.outcomes)
    landed = collections.Counter(landing(code, snap) for t in trials for _, code, snap in t.kills)
    print(f"  => {variant}/{store}/{final}: {len(trials)} trials; kills landed {dict(sorted(landed.items()))}; "
          f"outcomes {dict(sorted(tally.items()))}", flush=True)


def landing(code: int, snap: str) -> str:
    """Where a kill landed, from the snapshot taken after it."""
    if code == 0:
        return "after the end"
    if " r" in f" {snap}":
        return "a call running"
    return "before any call" if snap == "-0 -0 -0" else "between calls"


# --------------------------------------------------------------------------- approval (SPEC §11, §10)


@pytest.mark.parametrize("phase", ["before_charge", "after_charge"])
def test_an_approved_idempotent_call_killed_while_it_runs_completes_exactly_once(
        zygote: Zygote, service: PaymentsService, base: Config, phase: str) -> None:
    cfg = replace(base, approval=True)
    session = new_id("ses")

    async def ask_then_approve() -> str:
        agent = make_agent(cfg)
        try:
            result = await run(agent, session)
            if result.result == "approval":
                for p in await agent.pending_approvals(session):
                    await agent.approve(session, p.call_id)
            return result.result
        finally:
            await agent.persistence.close()

    assert asyncio.run(ask_then_approve()) == "approval"
    hold = service.hold(phase)
    pid, log = zygote.spawn(cfg, session)  # runs the approved calls: pay(1) first
    assert hold.reached.wait(60), log.read_text()
    assert snapshot(cfg, session, service) == ("r0 p0 -0" if phase == "before_charge" else "r1 p0 -0")
    os.kill(pid, signal.SIGKILL)
    assert zygote.wait(pid) == -signal.SIGKILL
    hold.release.set()  # the server finishes the request its dead client made

    for _ in range(4):
        if asyncio.run(ask_then_approve()) == "stop":
            break
    else:
        pytest.fail("the run kept asking for approval")
    parts = pay_parts(load(cfg, session))
    charges = service.charges_by_key()
    for n, p in parts.items():
        assert p.approval == "approved" and p.state.status == "completed", (n, p.state)
        [charge] = charges[key_of(p)]
        assert p.state.output == f"charged {100 + n} as {charge['id']}"
    assert parts[1].recalled and parts[1].state.metadata["attempt"] == 2
    # the dead client's request (attempt 1) was answered to nobody; the resume's (attempt 2) got the same charge
    assert sorted(a for k, a in service.attempts if k == key_of(parts[1])) == ["1", "2"]

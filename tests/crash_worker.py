"""A process that runs one we0nb turn on a SqlPersistence and can stop dead at a durability point.

Used by ``test_crash_matrix.py``: the test starts this script, waits for the line
``POINT <name>`` (printed once the run has reached that point, after its writes are
committed), kills the process with SIGKILL, and starts it again with ``--mode resume``.

The turn: step 1 calls ``act(n=1)``, step 2 calls ``act(n=2)``, step 3 answers "All done.".
The model decides from the history it is sent (how many ``act`` calls it has seen), so
the same model works for the first run and for any resume. ``act`` appends one line per
execution of its body to an append-only log (``--log``): that file is the ground truth of
which side effects happened.

Kill points (``--kill-at``):
  mid_stream       inside step 1's text stream (the text so far is committed: flush_interval=0)
  before_body      act(n=1) is committed as running; its body has not started
  inside_tool      act(n=1)'s body has appended its log line and is still running
  after_completion act(n=1) is committed as completed
  between_steps    step 1's assistant message is committed as completed; step 2 not started
  request_written  (--approval) act(n=1) is committed pending, awaiting approval
  after_decision   (--mode approve) every awaiting call is approved: approve() has returned
  none             run to the end

With ``--approval`` the ``act`` tool requires a person's approval; ``--mode approve`` approves
every awaiting call (what a person clicking Approve does) and prints ``RESULT`` with
``"result": "decided"``.

Output lines: ``POINT <name>``, ``BUSY <owner>`` (exit code 3), ``RESULT <json>``.

Run directly (``python tests/crash_worker.py --url … --mode prompt …``), or as a zygote
(``--zygote``) that forks one worker per request — what the tests do, to save a second of
interpreter start-up per process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, AsyncIterator

from we0nb import AssistantMessage, SessionBusyError, SqlPersistence, ToolPart, We0Agent, tool, user_message
from we0nb.models.base import AssistantTurn, FinishEvent, Model, ModelRequest, TextDelta, ToolCallEvent

POINTS = ("mid_stream", "before_body", "inside_tool", "after_completion", "between_steps", "request_written",
          "after_decision", "none")


async def hang(point: str) -> None:
    """Announce the point, then wait forever (the test kills us here)."""
    print(f"POINT {point}", flush=True)
    await asyncio.Event().wait()


class Worker:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.kill_at = args.kill_at
        self.fired = False

    def arm(self, point: str) -> bool:
        if self.kill_at == point and not self.fired:
            self.fired = True
            return True
        return False


def make_model(w: Worker) -> Model:
    class PlanModel(Model):
        model_id = "crash-plan"
        context_window = None

        async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:  # type: ignore[override]
            seen = sum(1 for m in request.messages if isinstance(m, AssistantTurn)
                       for c in m.tool_calls if c.name == "act")
            if seen >= 2:
                for d in ("All ", "done."):
                    yield TextDelta(d)
                yield FinishEvent("stop")
                return
            n = seen + 1
            yield TextDelta("Working ")
            yield TextDelta("on ")
            if w.arm("mid_stream"):
                await hang("mid_stream")
            yield TextDelta(f"step {n}.")
            yield ToolCallEvent(f"call_act_{n}_{os.getpid()}", "act", {"n": n})
            yield FinishEvent("tool-calls")

    return PlanModel()


def make_persistence(w: Worker) -> SqlPersistence:
    class KillablePersistence(SqlPersistence):
        # the points are announced right after the commit that makes them durable
        async def _after_part(self, part: Any) -> None:
            if isinstance(part, ToolPart) and part.state.input.get("n") == 1:
                if part.awaiting_approval and w.arm("request_written"):
                    await hang("request_written")
                if part.state.status == "running" and w.arm("before_body"):
                    await hang("before_body")
                if part.state.status == "completed" and w.arm("after_completion"):
                    await hang("after_completion")

        async def _after_message(self, message: Any) -> None:
            if isinstance(message, AssistantMessage) and message.time.completed is not None and w.arm("between_steps"):
                await hang("between_steps")

        async def commit(self, writes: Any, **kw: Any) -> None:
            # the engine's only write path during a run: each call is one durability point
            await super().commit(writes, **kw)
            for message, parts, _view in writes:
                for part in parts:
                    await self._after_part(part)
                if message is not None:
                    await self._after_message(message)

    kw: dict[str, Any] = {"lease_ttl": w.args.lease_ttl}
    if w.args.schema:
        kw["schema"] = w.args.schema
    return KillablePersistence(w.args.url, **kw)


def make_tool(w: Worker):
    @tool(side_effects=w.args.policy == "effects", requires_approval=w.args.approval)
    async def act(n: int) -> str:
        """Do step n (appends to the side-effect log)."""
        with open(w.args.log, "a") as f:
            f.write(json.dumps({"n": n, "pid": os.getpid(), "mode": w.args.mode}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if n == 1 and w.arm("inside_tool"):
            await hang("inside_tool")
        return f"did {n}"

    return act


async def main(args: argparse.Namespace) -> int:
    w = Worker(args)
    agent = We0Agent(make_model(w), tools=[make_tool(w)], persistence=make_persistence(w), flush_interval=0.0)
    try:
        if args.mode == "prompt":
            result = await agent.invoke(mode="prompt", session_id=args.session,
                                        messages=[user_message("Please do both steps.")])
        elif args.mode == "approve":
            decided = [await agent.approve(args.session, p.call_id)
                       for p in await agent.pending_approvals(args.session)]
            if w.arm("after_decision"):
                await hang("after_decision")
            print("RESULT " + json.dumps({"result": "decided", "calls": len(decided), "pid": os.getpid()}),
                  flush=True)
            await agent.persistence.close()
            return 0
        else:
            result = await agent.invoke(mode="resume", session_id=args.session)
    except SessionBusyError as e:
        print(f"BUSY {e.owner}", flush=True)
        return 3
    print("RESULT " + json.dumps({"result": result.result, "text": result.text, "steps": result.steps,
                                  "pid": os.getpid()}), flush=True)
    await agent.persistence.close()
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--schema", default=None)
    ap.add_argument("--session", required=True)
    ap.add_argument("--mode", choices=("prompt", "resume", "approve"), required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--policy", choices=("effects", "pure"), required=True)
    ap.add_argument("--kill-at", choices=POINTS, default="none")
    ap.add_argument("--lease-ttl", type=float, default=600.0)
    ap.add_argument("--approval", action="store_true", help="act requires a person's approval")
    return ap


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        import zygote

        sys.exit(zygote.serve(lambda argv: asyncio.run(main(parser().parse_args(argv)))))
    sys.exit(asyncio.run(main(parser().parse_args())))

"""A zygote for the crash tests' workers: a process that has imported everything forks a
worker per request, so a worker starts in milliseconds instead of a second, yet each is its
own process (own PID, own database connections, killed with SIGKILL).

Requests and replies are JSON lines on stdin and stdout: ``spawn`` (``argv``; the worker's
stdout and stderr to ``log``, or to ``out`` and ``err``) replies its ``pid``; ``wait`` (``pid``)
reaps it and replies its exit ``status`` (negative for a signal)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable


def serve(run: Callable[[list[str]], int]) -> int:
    """Serve requests until stdin ends; ``run(argv)`` is a worker's whole life, its exit code."""
    for line in sys.stdin:
        req = json.loads(line)
        reply: dict[str, Any]
        if req["op"] == "spawn":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _worker(run, req)
            reply = {"pid": pid}
        elif req["op"] == "wait":
            _, status = os.waitpid(req["pid"], 0)
            reply = {"status": os.waitstatus_to_exitcode(status)}
        else:
            reply = {"error": f"unknown op {req['op']!r}"}
        print(json.dumps(reply), flush=True)
    return 0


def _worker(run: Callable[[list[str]], int], req: dict[str, Any]) -> None:
    code = 1
    try:
        _redirect(req)
        code = run(req["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _redirect(req: dict[str, Any]) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if "log" in req:
        out = os.open(req["log"], flags, 0o644)
        err = os.dup(out)
    else:
        out = os.open(req["out"], os.O_WRONLY)
        err = os.open(req["err"], flags, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    sys.stdin.close()
    os.close(0)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)

"""Sync tools on we0nb's worker threads (``we0nb._threads``): off the loop, in the caller's
context, concurrent across runs, their errors the tool's; an abort does not wait for one, a closed loop
does not break a worker, a forked child gets workers of its own, and the interpreter's exit
lets a call under way finish."""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message
from we0nb.testing import text, tool_call

REQUEST = contextvars.ContextVar("REQUEST", default="none")


def _agent(steps: list, tools: list) -> We0Agent:
    return We0Agent(ScriptedModel(steps), tools=tools, persistence=MemoryPersistence())


async def _states(agent: We0Agent, sid: str) -> list:
    """The session's tool calls' states, in order."""
    return [p.state for m in (await agent.transcript(sid)).messages for p in m.tool_parts]


async def test_a_sync_tool_runs_on_a_worker_thread_in_its_callers_context() -> None:
    seen: list = []

    @tool(side_effects=False)
    def where(n: int) -> str:
        seen.append((threading.current_thread(), REQUEST.get()))
        REQUEST.set("changed in the tool")  # (a copy of the context: the caller's stays as it was)
        return f"ran {n}"

    REQUEST.set("req-7")
    agent = _agent([[tool_call("where", {"n": 1})], [text("done")]], [where])
    result = await agent.invoke(session_id="s", messages=[user_message("go")])
    assert result.text == "done" and len(seen) == 1
    thread, request = seen[0]
    assert thread is not threading.current_thread() and thread.name.startswith("we0nb-tool-")
    assert request == "req-7" and REQUEST.get() == "req-7"
    assert [s.output for s in await _states(agent, "s")] == ["ran 1"]


async def test_sync_tools_of_concurrent_runs_run_at_once_and_their_errors_are_theirs() -> None:
    barrier = threading.Barrier(3, timeout=10)  # passes only when three calls wait at once

    @tool(side_effects=False)
    def meet(n: int) -> str:
        barrier.wait()
        return f"met {n}"

    @tool(side_effects=False)
    def fail(n: int) -> str:
        raise KeyError(f"no item {n}")

    async def one(sid: str, name: str) -> object:
        agent = _agent([[tool_call(name, {"n": 1})], [text("done")]], [meet, fail])
        await agent.invoke(session_id=sid, messages=[user_message("go")])
        return (await _states(agent, sid))[0]

    states = await asyncio.gather(one("a", "meet"), one("b", "meet"), one("c", "meet"), one("d", "fail"))
    assert [s.status for s in states] == ["completed", "completed", "completed", "error"]
    assert [s.output for s in states[:3]] == ["met 1"] * 3
    assert "no item 1" in states[3].error


def test_an_abort_does_not_wait_for_a_sync_tool_and_its_late_answer_harms_nothing() -> None:
    """``asyncio.run`` returns while the tool still runs (the tool waits for the test to say it
    has returned); the tool's answer then finds its loop closed, and the next sync call of the
    process still runs."""
    started, returned, finished = threading.Event(), threading.Event(), threading.Event()

    @tool
    def deploy(env: str) -> str:
        started.set()
        returned.wait(10)
        finished.set()
        return "deployed"

    agent = _agent([[tool_call("deploy", {"env": "prod"})], [text("after")]], [deploy])

    async def run() -> None:
        abort = asyncio.Event()
        task = asyncio.ensure_future(agent.invoke(abort=abort, session_id="s", messages=[user_message("go")]))
        assert await asyncio.to_thread(started.wait, 10)
        abort.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert not finished.is_set()  # asyncio.run came back with the tool still running
    returned.set()
    assert finished.wait(10)

    @tool(side_effects=False)
    def again() -> str:
        return "again"

    async def next_run() -> str:
        other = _agent([[tool_call("again", {})], [text("done")]], [again])
        await other.invoke(session_id="t", messages=[user_message("go")])
        return (await _states(other, "t"))[0].output

    assert asyncio.run(next_run()) == "again"
    assert [s.status for s in asyncio.run(_states(agent, "s"))] == ["running"]


def _child(out: "multiprocessing.Queue[str]") -> None:
    @tool(side_effects=False)
    def ping() -> str:
        return f"pong from {threading.current_thread().name}"

    async def run() -> str:
        agent = _agent([[tool_call("ping", {})], [text("done")]], [ping])
        await agent.invoke(session_id="s", messages=[user_message("go")])
        return (await _states(agent, "s"))[0].output

    out.put(asyncio.run(run()))


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX's")
# (Python 3.12+ warns of any fork in a process with threads: forking one that has workers is the case here)
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_gets_workers_of_its_own() -> None:
    @tool(side_effects=False)
    def warm() -> str:
        return "warm"

    asyncio.run(_agent([[tool_call("warm", {})], [text("done")]], [warm]).invoke(
        session_id="s", messages=[user_message("go")]))  # the parent has workers now
    ctx = multiprocessing.get_context("fork")
    out: "multiprocessing.Queue[str]" = ctx.Queue()
    child = ctx.Process(target=_child, args=(out,))
    child.start()
    child.join(30)
    assert child.exitcode == 0, "the child's sync tool never ran (a worker of the parent's would not exist)"
    assert out.get(timeout=5).startswith("pong from we0nb-tool-")


def test_the_interpreters_exit_lets_a_sync_call_under_way_finish(tmp_path: Path) -> None:
    done = tmp_path / "done.txt"
    script = textwrap.dedent(f"""
        import asyncio, threading, time
        from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message
        from we0nb.testing import text, tool_call
        started = threading.Event()

        @tool
        def deploy(env: str) -> str:
            started.set()
            time.sleep(0.5)
            open({str(done)!r}, "w").write("finished")
            return "deployed"

        async def main():
            agent = We0Agent(ScriptedModel([[tool_call("deploy", {{"env": "prod"}})], [text("after")]]),
                             tools=[deploy], persistence=MemoryPersistence())
            abort = asyncio.Event()
            task = asyncio.ensure_future(agent.invoke(abort=abort, session_id="s", messages=[user_message("go")]))
            await asyncio.to_thread(started.wait, 10)
            abort.set()
            try:
                await task
            except asyncio.CancelledError:
                print("aborted")

        asyncio.run(main())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "aborted" and proc.stderr == ""
    assert done.read_text() == "finished"  # the process ended only after the tool had

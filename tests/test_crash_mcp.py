"""The crash matrix with MCP calls (issue 15): kill -9 the agent's process during an MCP call
(side effects, read-only with and without trust_annotations, and right after the write-ahead),
resume in a new process; and kill the MCP *server* in the middle of a call.

Ground truth is the server's ledger (one line per execution of a tool body, with the server's
PID): a tool with side effects runs at most once; a read-only one is recalled only when its
annotations are trusted. A killed agent also leaves no server behind (its stdin closes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mcpkit import alive, entries, starts, wait_until
from sql_support import target  # noqa: F401 (a fixture)
from sql_support import Target
from test_crash_matrix import assert_all_final, assert_lease_free, load
from we0nb._ids import new_id

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("mcp_crash_worker.py")


@pytest.fixture
def sqlite_target(tmp_path: Path) -> Target:
    """The cases where the database plays no part beyond the write-ahead run on SQLite only."""
    return Target(f"sqlite:///{tmp_path / 'crash.db'}")


def worker(t: Target, session: str, mode: str, ledger: Path, tool: str, trust: bool,
           kill_at: str = "none") -> subprocess.Popen[str]:
    argv = [sys.executable, str(WORKER), "--url", t.url, "--session", session, "--mode", mode,
            "--ledger", str(ledger), "--tool", tool, "--kill-at", kill_at] + (["--trust"] if trust else [])
    if t.schema:
        argv += ["--schema", t.schema]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{out}\n{err}"
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[7:])


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def the_call(t: Target, session: str):
    tr = load(t, session)
    assert_all_final(tr)
    (p,) = [p for m in tr.messages for p in m.tool_parts]
    return tr, p


# (tool, trust_annotations) -> executions of the tool body in total, and what resume did
INSIDE = {
    ("place_order", False): (1, "interrupt"),
    ("place_order", True): (1, "interrupt"),  # no readOnlyHint: trust changes nothing
    ("lookup", False): (1, "interrupt"),  # readOnlyHint, but not trusted
    ("lookup", True): (2, "recall"),  # readOnlyHint, trusted: recalled
}


@pytest.mark.parametrize("tool,trust", list(INSIDE))
def test_kill_the_agent_during_an_mcp_call_then_resume(target: Target, tmp_path: Path, tool: str,
                                                       trust: bool) -> None:
    session, ledger = new_id("ses"), tmp_path / "ledger"
    first = worker(target, session, "prompt", ledger, tool, trust)
    wait_until(lambda: entries(ledger, tool), 60, "the MCP call to be running on the server")
    kill(first)
    (server_pid,) = starts(ledger)
    wait_until(lambda: not alive(server_pid), 20, "the killed agent's server to exit (stdin EOF)")

    result = finish(worker(target, session, "resume", ledger, tool, trust))
    assert result == {"result": "stop", "text": "All done."}
    ran, action = INSIDE[(tool, trust)]
    assert len(entries(ledger, tool)) == ran
    _, p = the_call(target, session)
    if action == "interrupt":
        assert p.state.status == "error" and p.state.metadata.items() >= {"interrupted": True, "reason": "resume"}.items()
    else:
        assert p.state.status == "completed" and p.state.metadata.items() >= {"recalled": True}.items()
        assert p.state.output == '{"result":"value of block"}'
    assert not any(alive(pid) for pid in starts(ledger))
    assert_lease_free(target, session)


@pytest.mark.parametrize("tool,trust,ran,status", [("place_order", False, 0, "error"),
                                                   ("lookup", True, 1, "completed")])
def test_kill_the_agent_after_the_write_ahead_before_the_request(sqlite_target: Target, tmp_path: Path, tool: str,
                                                                 trust: bool, ran: int, status: str) -> None:
    target = sqlite_target
    session, ledger = new_id("ses"), tmp_path / "ledger"
    first = worker(target, session, "prompt", ledger, tool, trust, kill_at="before_call")
    assert first.stdout is not None and first.stdout.readline().strip() == "POINT before_call"
    kill(first)
    assert entries(ledger, tool) == []  # committed as running, never sent
    assert finish(worker(target, session, "resume", ledger, tool, trust))["result"] == "stop"
    assert len(entries(ledger, tool)) == ran
    _, p = the_call(target, session)
    assert p.state.status == status


def test_kill_the_server_mid_call_the_run_goes_on(sqlite_target: Target, tmp_path: Path) -> None:
    target = sqlite_target
    session, ledger = new_id("ses"), tmp_path / "ledger"
    agent = worker(target, session, "prompt", ledger, "place_order", False)
    wait_until(lambda: entries(ledger, "place_order"), 60, "the MCP call to be running on the server")
    (server_pid,) = starts(ledger)
    os.kill(server_pid, signal.SIGKILL)
    assert finish(agent) == {"result": "stop", "text": "All done."}  # not a crashed run
    tr, p = the_call(target, session)
    assert p.state.status == "error" and p.state.metadata.items() >= {"mcp_error": "connection_closed"}.items()
    assert "the connection ended during the call to 'place_order'" in p.state.error
    assert len(entries(ledger, "place_order")) == 1
    # nothing is left to recover: a resume in a new process calls nothing
    assert finish(worker(target, session, "resume", ledger, "place_order", False))["result"] == "stop"
    assert len(entries(ledger, "place_order")) == 1

"""Issue 32, item 6: Ctrl-C in the first instant of any ``we0nb`` command is one plain line.

The ``we0nb`` console script runs ``_we0nb_launch:main``, which installs its SIGINT handling
before importing the command (most of a second of imports). Each test starts the console
script as pip writes it, waits until Python has imported the launcher (``-X importtime``
reports it on stderr: the instant our code starts), then sends SIGINT after a delay.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the console script pip generates for ``we0nb = "_we0nb_launch:main"``
SCRIPT = """\
import re
import sys
from _we0nb_launch import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
LINE = re.compile(r"^we0nb( [a-z]+)?:( error:)? interrupted \(Ctrl-C\)\.$")


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, threading.Event, list[str]]:
    script = tmp_path / "we0nb"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    env.pop("WE0NB_DB", None)
    p = subprocess.Popen([sys.executable, "-X", "importtime", str(script), *args], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    launched, lines = threading.Event(), []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            if line.startswith("import time:"):
                if line.rstrip().endswith("| _we0nb_launch"):
                    launched.set()
            else:
                lines.append(line.rstrip("\n"))
        launched.set()  # (ended before: the test says so)

    threading.Thread(target=read, daemon=True).start()
    return p, launched, lines


COMMANDS = [("sessions",), ("batch", "ls"), ("show", "s1"), ("approvals",), ("demo",)]
#: while the command loads: by 0.25 s a quick command (sessions, on a missing database) has ended with
#: its own error on an idle machine, and the demo is running its model (Ctrl-C then aborts the run)
DELAYS = [0.0, 0.01, 0.03, 0.06, 0.12]


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_while_the_command_loads_is_one_plain_line(tmp_path: Path, delay: float) -> None:
    command = COMMANDS[DELAYS.index(delay) % len(COMMANDS)]
    p, launched, lines = start(tmp_path, *command, "--db", str(tmp_path / "x.db"))
    assert launched.wait(60) and p.poll() is None, f"the command ended before it was loaded: {lines}"
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    assert p.wait(60) == 130, (command, delay, lines)
    # only one line (the reader thread has it once the pipe closed)
    deadline = time.monotonic() + 10
    while len(lines) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(lines) == 1 and LINE.match(lines[0]), (command, delay, lines)


def test_the_console_script_is_the_launcher() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["we0nb"] == "_we0nb_launch:main"
    assert "_we0nb_launch" in meta["tool"]["setuptools"]["py-modules"]
    # the launcher imports nothing heavy before its handler is in place
    probe = ("import sys; before = set(sys.modules); import _we0nb_launch; "
             "print(sorted(m for m in set(sys.modules) - before if not m.startswith('_we0nb')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out

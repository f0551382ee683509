"""Run JupyterLab on 127.0.0.1 for a browser test, in temporary Jupyter dirs; stop it by PID."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
import json
from typing import Any, Iterator, Optional

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, root: Path, home: Path):
        self.root = root
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.log = home / "jupyterlab.log"

    def start(self, timeout: float = 120) -> "Lab":
        env = dict(os.environ)
        for name in ("CONFIG", "DATA", "RUNTIME"):
            d = self.home / name.lower()
            d.mkdir(parents=True, exist_ok=True)
            env[f"JUPYTER_{name}_DIR"] = str(d)
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        cmd = [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--IdentityProvider.token=", "--ServerApp.password=",
               f"--ServerApp.root_dir={self.root}", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)  # polling an HTTP server that is starting: there is nothing to wait on
        raise RuntimeError(f"jupyter lab did not answer within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)  # SIGTERM stops the server and its kernels
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


# --------------------------------------------------------------------------- one browser test at a time

@contextlib.contextmanager
def browser_slot(timeout: float = 1800) -> Iterator[None]:
    """Hold the machine-wide browser slot: one JupyterLab + chromium + kernel at a time.

    Two of them at once (``pytest -n 2`` puts the browser files on both workers) share two cores
    with everything else, and a kernel starved that long is what JupyterLab answers with dialogs.
    """
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "we0nb-browser-tests.lock"
    with open(path, "w") as lock:
        end = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    raise RuntimeError(f"another browser test held {path} for {timeout:.0f} s")
                time.sleep(0.5)  # a file lock has no waiter to wake us; pytest-timeout must still see us
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- JupyterLab's dialogs

DIALOG_JS = """() => {
    const d = document.querySelector('.jp-Dialog');
    if (!d) return null;
    const text = s => { const e = d.querySelector(s); return e ? e.innerText.trim() : ''; };
    return {header: text('.jp-Dialog-header'), body: text('.jp-Dialog-body').slice(0, 400),
            buttons: [...d.querySelectorAll('.jp-Dialog-button')].map(b => b.innerText.trim())};
}"""


def dialog(page) -> Optional[dict]:
    """What the open JupyterLab dialog says (header, body, button labels), or None."""
    return page.evaluate(DIALOG_JS)


def answer_dialog(page, kernel: Optional[str] = None) -> dict:
    """Answer the open dialog the way a user who wants the notebook's kernel would.

    "Select Kernel" gets ``kernel`` (a display name) chosen when given; every dialog is then
    accepted. A dialog that does not close is escaped; one that survives both is an error that
    says what it was (a bare "locator resolved to visible <dialog>" tells nobody anything).
    """
    seen = dialog(page)
    if seen is None:
        return {}
    handle = page.query_selector(".jp-Dialog")
    if kernel and "kernel" in seen["header"].lower() and page.query_selector(".jp-Dialog select"):
        labels = page.eval_on_selector_all(".jp-Dialog select option", "os => os.map(o => o.innerText.trim())")
        if kernel in labels:
            page.select_option(".jp-Dialog select", label=kernel)
    print(f"{time.strftime('%H:%M:%S')} answering JupyterLab dialog: {seen}", flush=True)
    for action in ("accept", "accept", "Escape"):  # a click during the dialog's opening can be lost
        try:
            if action == "accept":
                page.click(".jp-Dialog .jp-Dialog-button.jp-mod-accept", timeout=20_000)
            else:
                page.keyboard.press("Escape")
            page.wait_for_function("d => !d.isConnected", arg=handle, timeout=20_000)
            return seen
        except Exception:
            continue
    raise AssertionError(f"a JupyterLab dialog would not close: {seen}")


def page_state(page, lab: Optional["Lab"] = None) -> str:
    """A failure message's evidence: the dialog, each cell's prompt and output, the server log's tail."""
    try:
        cells = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c => {
            const p = c.querySelector('.jp-InputPrompt');
            const o = c.querySelector('.jp-OutputArea');
            return (p ? p.innerText.trim() : '?') + ' ' + (o ? o.innerText.trim().slice(0, 300) : '');
        })""")
        status = page.evaluate("""() => { const s = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return s ? s.getAttribute('data-status') : null; }""")
        parts = [f"dialog: {dialog(page)}", f"kernel status: {status}", *[f"cell {c}" for c in cells]]
    except Exception as exc:  # the page itself is gone: say so rather than hide the first failure
        parts = [f"page unreadable: {exc!r}"]
    if lab is not None and lab.log.exists():
        parts.append("jupyterlab.log tail:\n" + lab.log.read_text(errors="replace")[-2500:])
    return "\n".join(parts)


def note_page_state(exc: BaseException, page, lab: Optional["Lab"] = None) -> None:
    """Attach ``page_state`` to a failing test's exception, so CI's report says what the page showed."""
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(page_state(page, lab))
    else:
        print(page_state(page, lab))


# --------------------------------------------------------------------------- driving a notebook page


#: 'idle' once the notebook is attached to a started kernel that is idle. The execution indicator
#: alone says "idle" while the toolbar still says "No Kernel" (the session is being created); a Run
#: All clicked then makes JupyterLab start a second kernel per cell and, 30 s later, ask "Select Kernel".
KERNEL_READY_JS = """kernel => {
    if (document.querySelector('.jp-Dialog')) return 'dialog';
    const name = document.querySelector('.jp-Toolbar-kernelName');
    const shown = name ? name.innerText.trim() : '';
    const idle = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']");
    const bar = [...document.querySelectorAll('.jp-StatusBar-TextItem')]
        .some(e => / \\| Idle$/.test(e.innerText.trim()) && !e.innerText.includes('No Kernel'));
    return idle && bar && shown && shown !== 'No Kernel' && (!kernel || shown === kernel) ? 'idle' : null;
}"""


def kernel_ready(page, kernel: str | None = None) -> None:
    """Wait until the notebook's kernel (display name ``kernel`` when given) is started and idle,
    answering the dialogs JupyterLab shows on the way ("Select Kernel"…)."""
    answered = []
    for _ in range(5):
        state = page.wait_for_function(KERNEL_READY_JS, arg=kernel, timeout=120_000).json_value()
        if state == "idle":
            return
        answered.append(answer_dialog(page, kernel))
    raise AssertionError(f"JupyterLab kept showing dialogs: {answered}")


def run_all(page, restart: bool) -> None:
    page.click("li.lm-MenuBar-item:has-text('Run')")
    if restart:
        page.click("li.lm-Menu-item[data-command='runmenu:restart-and-run-all']")
        page.click(".jp-Dialog .jp-Dialog-button.jp-mod-accept", timeout=60_000)
    else:
        page.click("li.lm-Menu-item[data-command='runmenu:run-all']")


def started(page) -> bool:
    """True once the first cell is queued or ran ("[*]" or "[1]" in its prompt)."""
    try:
        page.wait_for_function("""() => {
            const p = document.querySelector('.jp-Notebook .jp-CodeCell .jp-InputPrompt');
            return p && /\\[(\\*|\\d+)\\]/.test(p.innerText);
        }""", timeout=30_000)
        return True
    except Exception:
        return False


def dismiss_toasts(page) -> None:
    for button in page.locator(".jp-toast-button:has-text('No')").all():
        try:
            button.click(timeout=2_000)
        except Exception:
            pass


def write_notebook(path: Path, cells: list[str], kernel: str = "python3", display: str = "Python 3 (ipykernel)") -> None:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": display, "language": "python", "name": kernel},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


def run_all_until(page: Any, selector: str, count: int, what: str, restart: bool = False) -> None:
    """Run All until ``count`` elements match ``selector`` while the second cell still runs (it
    awaits the run). JupyterLab sometimes replaces the kernel as it starts and asks "Select
    Kernel": answer it and run all again, from a fresh kernel; ``what`` names the goal in the error."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    state = "not started"
    for attempt in range(4):
        try:
            kernel_ready(page, kernel="Python 3 (ipykernel)")
        except (PlaywrightTimeout, AssertionError) as exc:  # a dialog that does not go away: load the page again
            state = f"dialog stuck: {exc}"
            page.reload(wait_until="domcontentloaded", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            continue
        run_all(page, restart=restart or attempt > 0)
        if not started(page):  # right after the kernel dialog, Run All can be dropped
            continue
        try:
            state = page.wait_for_function("""([selector, count]) => {
                if (document.querySelector('.jp-Dialog')) return 'dialog';
                if ([...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
                        .some(e => e.innerText.includes('most recent call last'))) return 'error';
                const prompts = document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt');
                const ready = document.querySelectorAll(selector).length === count
                    && prompts.length > 1 && prompts[1].innerText.includes('*');
                return ready ? 'ready' : null;
            }""", arg=[selector, count], timeout=180_000).json_value()
        except PlaywrightTimeout:  # a kernel that never got there: say what the page shows, start again
            state = "stalled:\n" + page_state(page)
            continue
        if state == "ready":
            dismiss_toasts(page)
            return
    raise AssertionError(f"the notebook did not reach {what} in a stable kernel (last state: {state!r})")


def launch_browser(playwright: Any) -> Any:
    """Debian's chromium, headless, with the flags these machines need."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)


def playwright_or_skip() -> Any:
    """Playwright's sync API, or the test skips with the reason (no chromium, no playwright)."""
    import pytest

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    return pytest.importorskip("playwright.sync_api")


@contextlib.contextmanager
def lab_page(root: Path, jupyter: Path, artifacts: Path, failure: str, *, height: int = 1000) -> Iterator[tuple["Lab", Any]]:
    """JupyterLab serving ``root`` (Jupyter dirs under ``jupyter``) and a chromium page, ``(lab,
    page)``; on an error the page's screenshot goes to ``artifacts / failure`` and its state into
    the error. The browser and the server are stopped however the block ends."""
    playwright = playwright_or_skip()
    lab = Lab(root, jupyter)
    lab.start()
    try:
        with playwright.sync_playwright() as p:
            browser = launch_browser(p)
            page = browser.new_page(viewport={"width": 1280, "height": height})
            try:
                yield lab, page
            except Exception as exc:
                page.screenshot(path=str(artifacts / failure), full_page=True)
                note_page_state(exc, page, lab)
                raise
            finally:
                browser.close()
    finally:
        lab.stop()


def open_notebook(page: Any, lab: "Lab", name: str) -> None:
    """Open ``name`` in the lab and wait for its cells."""
    page.goto(f"{lab.url}/lab/tree/{name}", wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)

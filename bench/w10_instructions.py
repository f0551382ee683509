"""W10 on a busy machine: instructions per delta (W1) and per step (W2) under callgrind.

Wall times on a shared 2-core machine drift by 2× while other work runs; instruction counts do
not. Each figure is the difference of two runs of one workload under ``valgrind
--tool=callgrind`` (a long and a short one, so start-up cancels out), divided by the
difference in deltas or steps. Variants: ``plain`` (OpenTelemetry not imported: every run of a
process that does not trace), ``off`` (``opentelemetry.trace`` imported, no provider: one
check per run), ``noop`` (the API's no-op provider given to the agent: the run's span is not
recording, so nothing more is made — what a run sampled out pays), ``on`` (SDK provider, ``BatchSpanProcessor``, an exporter that drops
the spans); and ``out``, the ``on`` provider with a sampler that samples nothing (a run
sampled out: what the other runs pay when one in ten is traced). ``--base DIR`` measures ``plain`` on another checkout too (e.g. ``/work/base``).

``--floor`` adds the SDK's own cost per span, measured with the ``on`` provider and no we0nb: a
bare ``tracer.start_span("x").end()``, and spans with the attributes of a W2 step's ``chat`` and
``execute_tool`` spans (parent context, kind, start and end times given) — what any
instrumentation pays per span, whatever it does around it. ``--only w2`` skips W1.

Usage: python bench/w10_instructions.py [--base /work/base] [--floor] [--only w2] [--variants off,on]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve()
SIZES = {"w1": (2_000, 12_000), "w2": (40, 240), "bare": (2_000, 12_000), "chat": (2_000, 12_000),
         "tool": (2_000, 12_000)}

CHILD = r'''
import asyncio, sys
variant, workload, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
provider = None
if variant != "plain":
    from opentelemetry import trace
if variant == "noop":
    provider = trace.NoOpTracerProvider()
if variant in ("on", "out"):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider() if variant == "on" else TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536, max_export_batch_size=4096,
                                                   schedule_delay_millis=600_000))
if workload in ("bare", "chat", "tool"):  # the SDK's floor: spans made alone, no we0nb involved
    import time
    from opentelemetry.trace import SpanKind
    tracer = provider.get_tracer("we0nb", "1")
    ctx = trace.set_span_in_context(tracer.start_span("invoke_agent we0nb"))
    chat = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "we0nb", "gen_ai.request.model": "scripted",
            "gen_ai.conversation.id": "ses_0123456789abcdefghijklmn", "we0nb.step": 3, "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 5, "gen_ai.response.finish_reasons": ("tool_call",)}
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "aping", "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": "ses_0123456789abcdefghijklmn", "gen_ai.tool.call.id": "call_0123456789"}
    for _ in range(n):
        if workload == "bare":
            tracer.start_span("x").end()
        else:
            attrs, name = (chat, "chat scripted") if workload == "chat" else (tool, "execute_tool aping")
            tracer.start_span(name, context=ctx, kind=SpanKind.CLIENT, attributes=attrs,
                              start_time=time.time_ns()).end(end_time=time.time_ns())
    sys.exit(0)
from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message
from we0nb.testing import text, tool_call

@tool(side_effects=False)
async def aping(i: int) -> str:
    return "pong"

def agent(steps, **kw):
    if provider is not None:
        kw["tracer_provider"] = provider
    return We0Agent(ScriptedModel(steps), tools=[aping], persistence=MemoryPersistence(), max_steps=10_000, **kw)

async def main():
    if workload == "w1":
        a = agent([[text(["ab "] * n)]])
    else:
        a = agent([[tool_call("aping", {"i": i})] for i in range(n)] + [[text("done")]])
    async for _ in a.stream(messages=[user_message("go")]):
        pass

asyncio.run(main())
'''


def instructions(pythonpath: str, variant: str, workload: str, n: int) -> int:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c",
                          CHILD, variant, workload, str(n)], env=env, capture_output=True, text=True, timeout=3600)
    m = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise RuntimeError(out.stderr[-2000:])
    return int(m.group(1))


def per_unit(pythonpath: str, variant: str, workload: str) -> float:
    small, big = SIZES[workload]
    return (instructions(pythonpath, variant, workload, big) - instructions(pythonpath, variant, workload, small)) \
        / (big - small)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="another checkout to measure 'plain' on (its PYTHONPATH)")
    ap.add_argument("--floor", action="store_true", help="also the SDK's own instructions per span")
    ap.add_argument("--only", choices=("w1", "w2"), help="one workload only")
    ap.add_argument("--variants", default="plain,off,noop,on", help="comma-separated, of plain,off,noop,on,out")
    a = ap.parse_args()
    here = str(HERE.parent.parent)
    rows: list[tuple[str, str, Optional[float], Optional[float]]] = []
    if a.base:
        rows.append(("base", a.base, None, None))
    for v in a.variants.split(","):
        rows.append((v, here, None, None))
    print("instructions per W1 delta / per W2 step (callgrind; the difference of a long and a short run)")
    for name, path, _, _ in rows:
        variant = "plain" if name == "base" else name
        w1 = f"{per_unit(path, variant, 'w1'):10,.0f} per delta" if a.only != "w2" else ""
        w2 = f"{per_unit(path, variant, 'w2'):12,.0f} per step" if a.only != "w1" else ""
        print(f"  {name:6} {w1}   {w2}", flush=True)
    if a.floor:
        print("the SDK alone, instructions per span (on's provider: BatchSpanProcessor, a dropping exporter)")
        for workload in ("bare", "chat", "tool"):
            print(f"  {workload:6} {per_unit(here, 'on', workload):10,.0f} per span", flush=True)


if __name__ == "__main__":
    main()

"""W10 of shared/BENCH.md: W2 and W7-memory with OpenTelemetry tracing on vs off, interleaved.

Variants, run in turn in one process so they share the machine's noise:

* ``none``: no observer factory connected at all (the engine as if we0nb.telemetry did not exist);
* ``off``: OpenTelemetry imported, no provider configured (what every untraced run pays: one
  check per run);
* ``noop``: the API's ``NoOpTracerProvider`` given to the agent — the run's span is not
  recording, so the tracer makes nothing more: what a run sampled out pays (what our own code
  costs per span is measured by ``w10_share.py``);
* ``on``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` and an exporter that drops
  the spans (it counts them), given to the agent.

W2: K steps each calling one trivial async tool, then a final text, MemoryPersistence (ms per
step). W7-memory: ``agent.batch`` of N prompts, concurrency C, a fake model sleeping 50 ms per
call, a trivial tool in 3 of its 4 calls (wall time and × the ideal N / C × 4 × 50 ms).
Printed: min / median / max per variant, the ratios of the medians (on / off, off / none), and
the spans exported per second of the ``on`` runs.

Usage: python bench/w10_tracing.py [--runs 7] [--steps 200] [--items 2000] [--concurrency 100] [--w7-runs 3]
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import spread  # noqa: E402

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

import we0nb  # noqa: E402
from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message  # noqa: E402
from we0nb.engine import observe  # noqa: E402
from we0nb.testing import text, tool_call  # noqa: E402

VARIANTS = ("none", "off", "noop", "on")


class Drop(SpanExporter):
    """Drops every span (counting them): the export costs nothing, the SDK's work is all measured."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


class Tracing:
    """One variant's setting: the observer factories, and the provider given to agents."""

    def __init__(self) -> None:
        self.factories = list(observe._FACTORIES)
        self.noop = trace.NoOpTracerProvider()
        self.exporter = Drop()
        self.provider = TracerProvider()
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter, max_queue_size=65_536,
                                                            max_export_batch_size=2_048))

    def use(self, variant: str) -> Optional[Any]:
        """Set ``variant`` up; the provider its agents get (None: none)."""
        observe._FACTORIES[:] = [] if variant == "none" else self.factories
        return self.provider if variant == "on" else self.noop if variant == "noop" else None

    def exported(self) -> int:
        self.provider.force_flush()
        return self.exporter.spans


@tool(side_effects=False)
async def aping(i: int) -> str:
    """A trivial async tool."""
    return "pong"


async def w2_once(k: int, provider: Any) -> float:
    steps = [[tool_call("aping", {"i": i})] for i in range(k)] + [[text("done")]]
    agent = We0Agent(ScriptedModel(steps), tools=[aping], persistence=MemoryPersistence(), max_steps=k + 5,
                     tracer_provider=provider)
    t0, c0 = time.perf_counter(), time.process_time()
    async for _ in agent.stream(messages=[user_message("go")]):
        pass
    return (time.perf_counter() - t0) / (k + 1), (time.process_time() - c0) / (k + 1)


async def w7_once(n: int, conc: int, provider: Any) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from w7_batch import Timeline, prompts, we0_agent

    agent = we0_agent(MemoryPersistence(), Timeline())
    agent.tracer_provider = provider
    t0, c0 = time.perf_counter(), time.process_time()
    batch = await agent.batch(prompts(n), concurrency=conc, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert batch.counts == {"stop": n}, batch.counts
    return wall, cpu / n


async def interleaved(tracing: Tracing, runs: int, once: Callable[[Any], Any]
                      ) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """``runs`` rounds of every variant in turn: wall and CPU figures by variant, and the spans
    the ``on`` runs exported."""
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    spans0 = tracing.exported()
    for r in range(runs):
        order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))  # (no variant always runs first)
        for v in order:
            w, c = await once(tracing.use(v))
            wall[v].append(w)
            cpu[v].append(c)
    return wall, cpu, tracing.exported() - spans0


def report(title: str, got: dict[str, list[float]], unit: str, scale: float, digits: int) -> None:
    print(title)
    for v in VARIANTS:
        print(f"  {v:4}: {spread([x * scale for x in got[v]], digits)} {unit}")
    med = {v: statistics.median(got[v]) for v in VARIANTS}
    print(f"  on / off: {med['on'] / med['off']:.3f}x   noop / off: {med['noop'] / med['off']:.3f}x   "
          f"off / none: {med['off'] / med['none']:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--w7-runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="end with one line of JSON: every figure by variant")
    a = ap.parse_args()
    figures: dict[str, Any] = {}
    k, n, c = a.steps, a.items, a.concurrency

    async def run() -> None:
        tracing = Tracing()
        print(f"we0nb {we0nb.__version__} from {Path(we0nb.__file__).parent}")
        for v in VARIANTS:  # warm-up
            await w2_once(20, tracing.use(v))
        got, cpu, spans = await interleaved(tracing, a.runs, lambda p: w2_once(k, p))
        report(f"W2, K={k} steps (async tool), MemoryPersistence, {a.runs} runs of each — wall", got, "ms/step",
               1e3, 4)
        report("W2 — CPU of this process (the exporter's thread included)", cpu, "ms/step", 1e3, 4)
        figures.update(w2_wall=got, w2_cpu=cpu)
        on_total = sum(got["on"]) * (k + 1)
        print(f"  spans exported while on: {spans:,} ({spans / a.runs:,.0f} per run), "
              f"{spans / on_total:,.0f} spans/s of run time")
        figures["w2_spans_per_s"] = spans / on_total

        ideal = n / c * 4 * 0.05
        got, cpu, spans = await interleaved(tracing, a.w7_runs, lambda p: w7_once(n, c, p))
        report(f"W7-memory, {n} items, concurrency {c}, ideal {ideal:.1f} s, {a.w7_runs} runs of each — wall",
               got, "s", 1, 2)
        report("W7 — CPU per item", cpu, "ms/item", 1e3, 3)
        figures.update(w7_wall=got, w7_cpu=cpu, w7_spans_per_s=spans / sum(got["on"]))
        for v in VARIANTS:
            print(f"  {v:4} × ideal: {spread([x / ideal for x in got[v]], 3)}")
        print(f"  spans exported while on: {spans:,} ({spans / a.w7_runs:,.0f} per batch), "
              f"{spans / sum(got['on']):,.0f} spans/s")
        tracing.use("off")
        tracing.provider.shutdown()
        if a.json:
            print(json.dumps(figures))

    asyncio.run(run())


if __name__ == "__main__":
    main()

"""W10: what we0nb's tracing costs per span, against what the SDK alone costs for the same spans.

A run's tracing cost is the SDK's (make, fill and end each span: its ids, sampler, attribute
checks, processor queue) plus ours (the observer that turns the run's events into those
calls). This separates the two, in one process, without the engine's noise:

1. one W2 tool step and one W7-memory item are run once with a recording observer: the calls
   the engine makes to it (events, model ends, run end) are kept;
2. those calls are replayed into a real ``RunTracer`` on the SDK provider of ``w10_tracing.py``
   (``BatchSpanProcessor``, an exporter that drops), while a proxy notes each tracing API call
   it makes (``start_span`` with its arguments, ``set_attributes``, ``add_event``, ``end`` …);
3. timed, each alone, many times: **ours + SDK** (the observer replay: a W7 item includes its
   ``RunTracer`` being made), **SDK floor** (the noted API calls replayed directly on the
   tracer: the same spans, attributes and times, nothing of ours), and a **bare span**
   (``tracer.start_span("x").end()``: the least any instrumentation pays per span).
   Ours = the first minus the second; and **ours alone**: the observer replay on a tracer
   whose spans cost nothing (the same Python of ours, no SDK).

CPU time (``time.process_time``, the exporter's thread included), median of rounds; with
``--instructions`` the same figures in instructions under callgrind (the difference of a long
and a short replay), which a busy machine does not disturb.

Usage: python bench/w10_share.py [--rounds 5] [--n 3000] [--instructions]
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from opentelemetry import context, trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from we0nb import MemoryPersistence, ScriptedModel, We0Agent, tool, user_message  # noqa: E402
from we0nb.engine import observe  # noqa: E402
from we0nb.telemetry import run_observer  # noqa: E402
from we0nb.testing import text, tool_call  # noqa: E402


class Drop(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def sdk_provider() -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65_536, max_export_batch_size=2_048))
    return provider


# --------------------------------------------------------------------------- recording


class Recorder:
    """An observer that keeps the calls the engine makes to it."""

    guarded = True

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    def event(self, ev: Any) -> None:
        self.calls.append(("event", ev))

    def model_ended(self, step: int, error: Any) -> None:
        self.calls.append(("model_ended", step, error))

    def run_ended(self, error: Any) -> None:
        self.calls.append(("run_ended", error))


class NullSpan:
    """A recording span that costs nothing: what our observer costs alone, the SDK taken out."""

    def is_recording(self) -> bool:
        return True

    def get_span_context(self) -> Any:
        return trace.INVALID_SPAN_CONTEXT

    def end(self, *a: Any, **k: Any) -> None:
        pass

    set_attribute = set_attributes = set_status = add_event = end


class NullProvider:
    def get_tracer(self, *a: Any, **k: Any) -> "NullProvider":
        return self

    def start_span(self, *a: Any, **k: Any) -> NullSpan:
        return NullSpan()


class NotingSpan:
    def __init__(self, real: Any, index: int, noted: list[tuple[Any, ...]]) -> None:
        self.real, self.index, self.noted = real, index, noted

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.real, name)
        if name not in ("set_attribute", "set_attributes", "set_status", "add_event", "end"):
            return method

        def call(*a: Any, **k: Any) -> Any:
            self.noted.append((self.index, name, a, k))
            return method(*a, **k)
        return call


class NotingTracer:
    """A tracer that notes every call made to it and to its spans (and makes them for real)."""

    def __init__(self, real: Any) -> None:
        self.real, self.noted, self.spans = real, [], 0

    def start_span(self, *a: Any, **k: Any) -> Any:
        index, self.spans = self.spans, self.spans + 1
        self.noted.append((index, "start_span", a, k))
        return NotingSpan(self.real.start_span(*a, **k), index, self.noted)


class NotingProvider:
    def __init__(self, real: TracerProvider) -> None:
        self.tracer = NotingTracer(real.get_tracer("we0nb", "bench"))

    def get_tracer(self, *a: Any, **k: Any) -> NotingTracer:
        return self.tracer


@tool(side_effects=False)
async def aping(i: int) -> str:
    """A trivial async tool."""
    return "pong"


def record_w2_step() -> tuple[Any, Any, list[tuple[Any, ...]]]:
    """W2's agent and request, and the calls of one of its tool steps (its second)."""
    calls: list[tuple[Any, ...]] = []
    reqs: list[Any] = []
    agent = We0Agent(ScriptedModel([[tool_call("aping", {"i": i})] for i in range(3)] + [[text("done")]]),
                     tools=[aping], persistence=MemoryPersistence())
    with_factory(lambda a, r: (reqs.append(r), Recorder(calls))[1],
                 lambda: asyncio.run(_drain(agent.stream(messages=[user_message("go")]))))
    starts = [i for i, c in enumerate(calls) if c[0] == "event" and c[1]["type"] == "step-start"]
    return agent, reqs[0], calls[starts[1]:starts[2]]


def record_w7_item() -> tuple[Any, Any, list[tuple[Any, ...]]]:
    """W7-memory's agent, and the request and every call of one of its items."""
    from w7_batch import Timeline, prompts, we0_agent

    calls: list[tuple[Any, ...]] = []
    reqs: list[Any] = []
    agent = we0_agent(MemoryPersistence(), Timeline())
    with_factory(lambda a, r: (reqs.append(r), Recorder(calls))[1],
                 lambda: asyncio.run(agent.batch(prompts(1), concurrency=1, progress=False)))
    return agent, reqs[0], calls


async def _drain(stream: Any) -> None:
    async for _ in stream:
        pass


def with_factory(factory: Any, run: Callable[[], Any]) -> None:
    saved = list(observe._FACTORIES)
    observe._FACTORIES[:] = [factory]
    try:
        run()
    finally:
        observe._FACTORIES[:] = saved


# --------------------------------------------------------------------------- replaying


def feed(tracer: Any, calls: list[tuple[Any, ...]]) -> None:
    for c in calls:
        if c[0] == "event":
            tracer.event(c[1])
        elif c[0] == "model_ended":
            tracer.model_ended(c[1], c[2])
        else:
            tracer.run_ended(c[1])


def workloads(provider: TracerProvider) -> dict[str, tuple[Callable[[], None], int]]:
    """Each replay as a function doing one unit (a W2 step, a W7 item), and the spans per unit."""
    real = provider.get_tracer("we0nb", "bench")
    out: dict[str, tuple[Callable[[], None], int]] = {}

    # W2: one RunTracer fed the same tool step again and again (its run span stays open)
    agent, req, step = record_w2_step()
    agent.tracer_provider = provider
    w2 = run_observer(agent, req)
    assert w2 is not None
    out["w2 step: ours + SDK"] = (lambda: feed(w2, step), 2)
    alone = copy.copy(agent)
    alone.tracer_provider = NullProvider()
    w2_alone = run_observer(alone, req)
    out["w2 step: ours alone"] = (lambda: feed(w2_alone, step), 2)
    probing = copy.copy(agent)  # (the same agent, noting what is asked of its provider)
    probing.tracer_provider = noting = NotingProvider(provider)
    probe = run_observer(probing, req)
    feed(probe, step)
    out["w2 step: SDK floor"] = (replayer(real, noting.tracer.noted[1:], {0: probe.span.real}), 2)  # type: ignore[union-attr]

    # W7: a RunTracer made per item, under the batch's span, fed the item's every call
    agent, req, item = record_w7_item()
    context.attach(trace.set_span_in_context(real.start_span("invoke_workflow bench")))
    agent.tracer_provider = provider

    def w7() -> None:
        feed(run_observer(agent, req), item)
    out["w7 item: ours + SDK"] = (w7, 8)
    alone = copy.copy(agent)
    alone.tracer_provider = NullProvider()
    out["w7 item: ours alone"] = (lambda: feed(run_observer(alone, req), item), 8)
    probing = copy.copy(agent)
    probing.tracer_provider = noting = NotingProvider(provider)
    feed(run_observer(probing, req), item)
    out["w7 item: SDK floor"] = (replayer(real, noting.tracer.noted, {}), 8)
    out["bare span"] = (lambda: real.start_span("x").end(), 1)
    return out


def replayer(tracer: Any, noted: list[tuple[Any, ...]], given: dict[int, Any]) -> Callable[[], None]:
    """The noted API calls as one function: the same spans made directly on the tracer."""
    def replay() -> None:
        spans = dict(given)
        for index, name, a, k in noted:
            if name == "start_span":
                spans[index] = tracer.start_span(*a, **k)
            else:
                getattr(spans[index], name)(*a, **k)
    return replay


# --------------------------------------------------------------------------- measuring


def cpu_per_unit(fn: Callable[[], None], n: int, rounds: int) -> float:
    for _ in range(max(200, n // 10)):
        fn()
    got = []
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(n):
            fn()
        got.append((time.process_time() - c0) / n)
    return statistics.median(got)


def instructions(name: str, n: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          __file__, "--child", name, "--n", str(n)], env=env, capture_output=True, text=True,
                         timeout=3600)
    m = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise RuntimeError(out.stderr[-2000:])
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    provider = sdk_provider()
    work = workloads(provider)
    if a.child:  # (under callgrind: do one replay n times)
        fn = work[a.child][0]
        for _ in range(a.n):
            fn()
        provider.shutdown()
        return
    print("CPU per unit (median of %d rounds of %d)" % (a.rounds, a.n))
    got = {name: cpu_per_unit(fn, a.n, a.rounds) for name, (fn, _) in work.items()}
    report(got, work, "µs", 1e6, "{:8.1f}")
    if a.instructions:
        print("instructions per unit (callgrind: the difference of a replay of n and of n/5)")
        small, big = 200, 1_200
        counts = {name: (instructions(name, big) - instructions(name, small)) / (big - small) for name in work}
        report(counts, work, "", 1, "{:10,.0f}")
    provider.shutdown()


def report(got: dict[str, float], work: dict[str, tuple[Callable[[], None], int]], unit: str, scale: float,
           fmt: str) -> None:
    for name, (_, spans) in work.items():
        print(f"  {name:22} {fmt.format(got[name] * scale)} {unit}   {fmt.format(got[name] * scale / spans)} "
              f"{unit} per span")
    for w in ("w2 step", "w7 item"):
        ours = got[f"{w}: ours + SDK"] - got[f"{w}: SDK floor"]
        share = ours / got[f"{w}: ours + SDK"]
        print(f"  {w}: ours {fmt.format(ours * scale)} {unit} ({share:.0%} of the tracing cost)")


if __name__ == "__main__":
    main()

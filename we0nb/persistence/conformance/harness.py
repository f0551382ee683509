"""The harness the conformance checks run on: :class:`Harness`, :class:`Check`, and the helpers
checks state their expectations with (an AssertionError saying what differed)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

from ..base import LeaseStore, SessionStore
from ..batches import BatchQueue
from ..columns import ColumnReads
from ..copies import CopyStore
from ..scores import ScoreStore

__all__ = ["Harness", "Check", "Report", "CAPABILITIES", "REQUIRED", "MissingCapability", "ExpireLease", "check", "expect", "equal", "raises"]

#: capability name → the protocol a store has it by
CAPABILITIES: dict[str, type] = {"sessions": SessionStore, "leases": LeaseStore, "batches": BatchQueue,
                                 "columns": ColumnReads, "scores": ScoreStore, "copies": CopyStore}

#: what every store has: a run needs both (``We0Agent(persistence=...)`` takes a ``Persistence``,
#: which is these two): a check of theirs that a store lacks fails, saying what is missing
REQUIRED = frozenset({"sessions", "leases"})

ExpireLease = Callable[[str], Union[None, Awaitable[None]]]


def members(proto: type) -> list[str]:
    """The public methods and attributes a store has a capability by (its protocol's members)."""
    names: set[str] = set()
    for cls in proto.__mro__:
        if cls.__module__ in ("typing", "typing_extensions", "builtins", "abc"):
            continue
        names.update(n for n in (*vars(cls), *getattr(cls, "__annotations__", {})) if not n.startswith("_"))
    return sorted(names)


def lacking(store: Any, capability: str) -> list[str]:
    """The members of ``capability`` that ``store`` does not have."""
    return [n for n in members(CAPABILITIES[capability]) if not hasattr(store, n)]


class Harness:
    """The stores a check works on: ``make()`` gives a store on one database (see the module)."""

    def __init__(self, make: Callable[[], Any], *, expire_lease: Optional[ExpireLease] = None, name: str = ""):
        self._make = make
        self._expire = expire_lease
        self.name = name
        self.made: list[Any] = []
        self._first: Any = None

    @property
    def store(self) -> Any:
        """The store a check writes through (made once)."""
        if self._first is None:
            self._first = self.fresh()
        return self._first

    def fresh(self) -> Any:
        """Another store on the same data (what a second process sees)."""
        s = self._make()
        if all(s is not m for m in self.made):
            self.made.append(s)
        return s

    @property
    def capabilities(self) -> set[str]:
        """The capabilities the store has (by its methods), plus ``expire`` when a hook was given."""
        found = {name for name, proto in CAPABILITIES.items() if isinstance(self.store, proto)}
        return found | ({"expire"} if self._expire is not None else set())

    async def expire_lease(self, session_id: str) -> None:
        assert self._expire is not None, "this check needs expire_lease"
        got = self._expire(session_id)
        if inspect.isawaitable(got):
            await got

    async def aclose(self) -> None:
        for s in self.made:
            close = getattr(s, "close", None)  # (a store without it fails its checks, saying so)
            if close is not None:
                await close()

    async def __aenter__(self) -> "Harness":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class MissingCapability(AssertionError):
    """A store lacks a capability every store needs (the message names its missing members)."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One rule of the contract: ``run(harness)`` raises AssertionError (or the store's error) when broken."""

    name: str
    needs: frozenset[str]
    fn: Callable[[Harness], Awaitable[None]]
    doc: str = ""

    def __str__(self) -> str:
        return self.name

    def applies(self, h: Harness) -> bool:
        """Whether the check runs: the store has what it needs, or lacks a capability every store
        needs (then the check runs and fails, naming what is missing)."""
        return self.needs - h.capabilities <= REQUIRED

    def missing(self, h: Harness) -> str:
        """Why the check does not run: each capability the store lacks, with the members it lacks."""
        lacks = sorted(self.needs - h.capabilities)
        why = [f"{h.name or 'the store'} lacks {c} ({CAPABILITIES[c].__name__}: no {', '.join(lacking(h.store, c))})"
               for c in lacks if c != "expire"]
        if "expire" in lacks:
            why.append("no expire_lease= hook was given (the checks of an expired lease need it)")
        return "; ".join(why)

    async def run(self, h: Harness) -> None:
        required = sorted((self.needs - h.capabilities) & REQUIRED)
        if required:
            raise MissingCapability(
                f"{self.missing(h)}: every store needs {' and '.join(CAPABILITIES[c].__name__ for c in required)} "
                "(subclass we0nb.Persistence, which is both, and write the missing members)")
        await self.fn(h)


@dataclasses.dataclass
class Report:
    """What :func:`validate` found: per check ``"passed"``, ``"skipped: …"`` or the failure."""

    results: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r == "passed" or r.startswith("skipped") for r in self.results.values())

    @property
    def failed(self) -> dict[str, str]:
        return {k: v for k, v in self.results.items() if not (v == "passed" or v.startswith("skipped"))}

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.results.items()]
        return "\n".join(lines) + f"\n{len(self.failed)} failed of {len(self.results)}"


def check(registry: list[Check], *needs: str) -> Callable[[Callable[[Harness], Awaitable[None]]], Any]:
    """Register the decorated ``async def name(h)`` in ``registry`` as a check needing ``needs``."""
    def add(fn: Callable[[Harness], Awaitable[None]]) -> Any:
        registry.append(Check(fn.__name__, frozenset(needs), fn, (fn.__doc__ or "").strip()))
        return fn

    return add


def expect(ok: Any, what: str) -> None:
    """Raise AssertionError(``what``) unless ``ok``."""
    if not ok:
        raise AssertionError(what)


def equal(got: Any, want: Any, what: str) -> None:
    """Raise AssertionError naming ``what`` with both values unless ``got == want``."""
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, expected {want!r}")


@contextlib.asynccontextmanager
async def raises(kind: type[BaseException], what: str) -> AsyncIterator[list[BaseException]]:
    """``async with raises(E, "…") as caught``: the block must raise ``E`` (kept in ``caught``)."""
    caught: list[BaseException] = []
    try:
        yield caught
    except kind as e:
        caught.append(e)
        return
    raise AssertionError(f"{what}: expected {kind.__name__}, nothing was raised")

"""What a we0nb client offers an MCP server besides calling its tools: progress of a call,
answers to elicitations (a question the server asks while a tool runs), the roots (folders)
the user lets it see, and its log messages.

Each is opt-in on the server object, and the client declares a capability only when the
user gave a way to honour it:

- ``on_progress=fn(progress)``: every ``tools/call`` carries a ``progressToken``; each
  ``notifications/progress`` reaches ``fn`` as a :class:`Progress` (sync or async), and the
  last one is kept in the call's metadata (``metadata["progress"]``).
  ``reset_timeout_on_progress=True`` restarts ``timeout`` at each progress notification.
- ``elicitation=fn(request)``: declares the elicitation capability (form and URL modes);
  ``fn`` gets an :class:`Elicitation` and returns ``request.accept(content)``,
  ``request.decline()`` or ``request.cancel()`` (a plain dict means accept). A form answer
  is checked against the requested schema, with its defaults applied (SEP-1034); an answer
  that does not match is not sent: the server gets ``cancel`` and the reason is logged.
  ``elicitation="ask"`` (or ``fn`` returning None) leaves the question to a person: it is
  stored with the running call and answered from the notebook's panel, from code or from the
  CLI (:mod:`we0nb.engine.questions`); the run waits for it, and the wait does not count
  against ``timeout``.
  Without ``elicitation=`` the capability is not declared, and a server that asks anyway
  is answered with an error at once (nothing waits for a person who is not there).
- ``roots=[folder, ...]``: declares the roots capability; ``server.set_roots([...])``
  changes them and sends ``notifications/roots/list_changed``.
- A server's ``notifications/message`` goes to the Python logger ``we0nb.mcp.server``
  (its level mapped to Python's; the server's own logger name in ``extra``).
- Sampling is not offered (being deprecated by MCP): a request for it is refused at once.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .._forms import check_form_answer, check_form_schema, form_defaults
from typing import Any, Callable, Mapping, Optional, Sequence, Union

__all__ = ["Progress", "Elicitation", "ElicitAnswer", "ClientFeatures", "InFlight", "check_roots", "maybe_await", "LEVELS"]

log = logging.getLogger("we0nb.mcp")
server_log = logging.getLogger("we0nb.mcp.server")

#: MCP's syslog levels as Python logging levels
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL, "alert": logging.CRITICAL,
          "emergency": logging.CRITICAL}


@dataclass(frozen=True)
class Progress:
    """One ``notifications/progress`` of a running call. ``fraction`` is ``progress / total``
    when the server gave a total (else None)."""

    server: str
    tool: str
    call_id: Optional[str]
    progress: float
    total: Optional[float] = None
    message: Optional[str] = None

    @property
    def fraction(self) -> Optional[float]:
        return self.progress / self.total if self.total else None

    def as_metadata(self) -> dict[str, Any]:
        return {"progress": self.progress, "total": self.total, "message": self.message}


@dataclass(frozen=True)
class ElicitAnswer:
    """What goes back to the server: ``action`` is ``accept`` (with ``content`` in form mode),
    ``decline`` or ``cancel``."""

    action: str
    content: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Elicitation:
    """A question a server asks while one of its tools runs.

    ``mode`` is ``"form"`` (answer with ``content`` matching ``schema``, a flat JSON Schema
    object whose ``defaults`` are filled in for you) or ``"url"`` (the user should open
    ``url``; accepting means they agreed to go there).
    """

    server: str
    message: str
    mode: str = "form"
    schema: Mapping[str, Any] = field(default_factory=dict)
    url: Optional[str] = None
    elicitation_id: Optional[str] = None

    def accept(self, content: Optional[Mapping[str, Any]] = None) -> ElicitAnswer:
        return ElicitAnswer("accept", dict(content) if content is not None else None)

    def decline(self) -> ElicitAnswer:
        return ElicitAnswer("decline")

    def cancel(self) -> ElicitAnswer:
        return ElicitAnswer("cancel")

    def defaults(self) -> dict[str, Any]:
        """The schema's default values, by property (what a form shows before the user types)."""
        return form_defaults(self.schema)

    def check(self, content: Optional[Mapping[str, Any]]) -> dict[str, Any]:
        """``content`` with the defaults applied, once it matches the schema (else ValueError why)."""
        if self.mode != "form":
            return {**self.defaults(), **dict(content or {})}
        return check_form_answer(self.schema, content)

    def as_question(self) -> dict[str, Any]:
        """What is stored with the call when a person is to answer (see :mod:`we0nb.engine.questions`)."""
        q: dict[str, Any] = {"mode": self.mode, "source": self.server, "message": self.message}
        if self.mode == "form":
            q["schema"] = dict(self.schema)
        else:
            q["url"] = self.url
        if self.elicitation_id is not None:
            q["elicitation_id"] = self.elicitation_id
        return q


@dataclass
class InFlight:
    """A ``tools/call`` under way with a run watching it: a question the server asks is its."""

    tool: str
    updates: Any  # the run's CallUpdates
    #: the call's own timeout scope (an anyio CancelScope; None: no timeout), paused while a person answers
    scope: Any = None
    timeout: Optional[float] = None


ElicitationHandler = Union[str, Callable[[Elicitation], Any]]
ProgressHandler = Callable[[Progress], Any]


def check_roots(roots: Any) -> tuple[tuple[str, Optional[str]], ...]:
    """``roots=``: folders (paths) or ``file://`` URIs, as ``(uri, name)`` pairs."""
    if roots is None:
        return ()
    if isinstance(roots, (str, os.PathLike)) or not isinstance(roots, Sequence):
        raise TypeError("MCPServer(roots=...): expected a list of folders (paths or file:// URIs), e.g. ['data/'].")
    out = []
    for r in roots:
        if isinstance(r, str) and r.startswith("file://"):
            out.append((r, r.rstrip("/").rsplit("/", 1)[-1] or None))
        elif isinstance(r, (str, os.PathLike)):
            p = Path(r).expanduser().resolve()
            out.append((p.as_uri(), p.name or None))
        else:
            raise TypeError(f"MCPServer(roots=...): {r!r} is not a folder (a path or a file:// URI).")
    return tuple(out)


async def maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class ClientFeatures:
    """The callbacks a connection's ``ClientSession`` gets (built from the server's options)."""

    def __init__(self, label: str, *, elicitation: Optional[ElicitationHandler] = None,
                 roots: Sequence[tuple[str, Optional[str]]] = (), roots_enabled: bool = False) -> None:
        if elicitation is not None and not callable(elicitation) and elicitation != "ask":
            raise TypeError("MCPServer(elicitation=...): expected 'ask' (a person answers, from the notebook's "
                            "panel, code or `we0nb answer`) or a function fn(request) returning "
                            "request.accept(content), request.decline(), request.cancel() or None (ask a person).")
        self.label = label
        self.elicitation = elicitation
        #: the calls under way that a run watches (a question the server asks goes to the one there is)
        self.calls: list[InFlight] = []
        self.roots = tuple(roots)
        self.roots_enabled = roots_enabled or bool(roots)

    def session_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``mcp.ClientSession``: only the capabilities we honour."""
        kw: dict[str, Any] = {"logging_callback": self._on_log}
        if self.elicitation is not None:
            kw["elicitation_callback"] = self._on_elicit
        if self.roots_enabled:
            kw["list_roots_callback"] = self._on_list_roots
        return kw

    async def _on_log(self, params: Any) -> None:
        level = LEVELS.get(str(params.level), logging.INFO)
        data = params.data
        text = data if isinstance(data, str) else repr(data)
        server_log.log(level, "%s%s: %s", self.label, f" [{params.logger}]" if params.logger else "", text[:2000],
                       extra={"mcp_server": self.label, "mcp_logger": params.logger})

    async def _on_list_roots(self, context: Any) -> Any:
        import mcp_types

        return mcp_types.ListRootsResult(roots=[mcp_types.Root.model_validate({"uri": u, "name": n})
                                                for u, n in self.roots])

    async def _on_elicit(self, context: Any, params: Any) -> Any:
        import mcp_types

        mode = getattr(params, "mode", "form") or "form"
        schema = getattr(params, "requested_schema", None)
        request = Elicitation(server=self.label, message=params.message, mode=mode,
                              schema=schema if isinstance(schema, Mapping) else {},
                              url=getattr(params, "url", None), elicitation_id=getattr(params, "elicitation_id", None))
        handler = self.elicitation
        assert handler is not None
        try:
            answer = None if handler == "ask" else await maybe_await(handler(request))  # type: ignore[operator]
        except Exception as e:
            log.warning("%s: the elicitation handler raised %s: %s; the server is told 'cancel'",
                        self.label, type(e).__name__, e)
            return mcp_types.ElicitResult(action="cancel")
        if answer is None:
            return await self._ask_person(request)
        if isinstance(answer, Mapping):
            answer = request.accept(answer)
        if not isinstance(answer, ElicitAnswer) or answer.action not in ("accept", "decline", "cancel"):
            log.warning("%s: the elicitation handler returned %s, not request.accept(...), .decline() or .cancel(); "
                        "the server is told 'cancel'", self.label, type(answer).__name__)
            return mcp_types.ElicitResult(action="cancel")
        if answer.action in ("decline", "cancel"):
            return mcp_types.ElicitResult.model_validate({"action": answer.action})
        if mode != "form":
            return mcp_types.ElicitResult(action="accept")
        try:
            content = request.check(answer.content)
        except ValueError as e:
            log.warning("%s: elicitation answer refused, %s; the server is told 'cancel'", self.label, e)
            return mcp_types.ElicitResult(action="cancel")
        return mcp_types.ElicitResult(action="accept", content=content)

    async def _ask_person(self, request: Elicitation) -> Any:
        """The question stored with the call that asked it, and the person's answer (see
        :mod:`we0nb.engine.questions`); 'cancel' at once when there is no call to store it with."""
        import anyio
        import mcp_types

        if request.mode == "form":
            try:
                check_form_schema(request.schema)
            except ValueError as e:
                log.warning("%s: elicitation refused, %s; the server is told 'cancel'", self.label, e)
                return mcp_types.ElicitResult(action="cancel")
        if len(self.calls) != 1:
            why = "no call of a run is under way" if not self.calls else \
                f"{len(self.calls)} calls are under way and MCP does not say which one asks"
            log.warning("%s asked a question (%r) but %s, so there is nothing to keep it with; the server is "
                        "told 'cancel'", self.label, request.message, why)
            return mcp_types.ElicitResult(action="cancel")
        call = self.calls[0]
        if call.scope is not None:  # the time a person takes does not count against the call's timeout
            call.scope.deadline = float("inf")
        try:
            answer = await call.updates.ask(request.as_question())
        finally:
            if call.scope is not None and call.timeout is not None:
                call.scope.deadline = anyio.current_time() + call.timeout
        if answer["action"] != "accept":
            return mcp_types.ElicitResult.model_validate({"action": answer["action"]})
        if request.mode != "form":
            return mcp_types.ElicitResult(action="accept")
        return mcp_types.ElicitResult(action="accept", content=answer["content"])

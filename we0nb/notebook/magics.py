"""``%load_ext we0nb`` then ``%%we0``: the cell body is the user message, shown in a RunPanel.

::

    %%we0 [--session ID] [--new] [--resume] [--agent NAME] [--panel NAME]
    What is the weather in Paris?

The agent is taken from the user namespace (variable ``agent`` unless ``--agent``).
Without ``--session`` the magic continues the session of the previous ``%%we0`` cell
that used the same agent variable (a chat across cells); ``--new`` starts a new one.
``%we0 --resume`` (a line magic: IPython refuses an empty cell body) continues the
session in resume mode.
The panel is stored in the namespace (``we0_panel`` unless ``--panel``), so a later cell
can ``await we0_panel.wait()``. A ``%%we0`` cell run while the previous one still runs on
the same session waits for it (panels on one session queue), so "Run All" works.
``%we0 -h`` prints this usage. Every mistake in using it (no agent variable, an empty body,
``--resume`` without a session, a bad ``--panel`` name) is a one-line ``UsageError``, as
IPython's own option errors are: a traceback would point into we0nb, not at the cell.
"""

from __future__ import annotations

import keyword
import shlex
from typing import Any

__all__ = ["We0Magics", "load_ipython_extension"]

_USAGE = """The cell body is the user message for the agent variable. Without --session the cell
continues the session of the previous %%we0 cell; a %%we0 cell run while the previous one
still runs on that session waits for it (Run All queues them). `%we0 --resume` (one line)
resumes the session; the panel is kept in we0_panel: `await we0_panel.wait()`."""


def _make_magics_class() -> Any:
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, magics_class
    from IPython.core.magic_arguments import argument, magic_arguments

    @magics_class
    class We0Magics(Magics):
        """The ``%%we0`` cell magic."""

        def __init__(self, shell: Any):
            super().__init__(shell)
            self.sessions: dict[str, str] = {}

        @magic_arguments()
        @argument("--session", "-s", default=None, help="session id (default: continue the last %%we0 session)")
        @argument("--new", action="store_true", help="start a new session")
        @argument("--resume", "-r", action="store_true", help="resume the session (empty body)")
        @argument("--agent", "-a", default="agent", help="name of the We0Agent variable (default: agent)")
        @argument("--panel", "-p", default="we0_panel", help="variable to store the RunPanel in")
        @line_cell_magic
        def we0(self, line: str, cell: Any = None) -> None:
            """Run the cell body as a user message in a RunPanel (background task)."""
            from .panel import RunPanel

            parser = getattr(self.we0, "parser")
            if {"-h", "--help"} & set(line.split()):
                print(parser.format_help().rstrip() + "\n\n" + _USAGE)
                return
            try:  # shell quoting as a shell reads it: -s 'my session' is `my session`, -s '' is empty
                argv = shlex.split(line)
            except ValueError as exc:
                raise UsageError(f"%%we0: cannot read the options ({exc}); check the quotes.") from None
            args = parser.parse_args(argv)  # (its mistakes are UsageErrors already)
            assert self.shell is not None  # (a magic runs in a shell)
            ns = self.shell.user_ns
            panel_name = _check_options(args, cell)
            if args.agent not in ns:
                raise UsageError(f"%%we0: no variable {args.agent!r} in the notebook; create one with "
                                 f"`{args.agent} = We0Agent(...)` or pass --agent NAME.")
            agent = ns[args.agent]
            if not hasattr(agent, "stream_request"):
                raise UsageError(f"%%we0: the variable {args.agent!r} is not a We0Agent (it is "
                                 f"{type(agent).__name__}); pass --agent NAME of one.")
            session_id = args.session
            if session_id is None and not args.new:
                session_id = self.sessions.get(args.agent)
            if args.resume and session_id is None:
                raise UsageError("%we0 --resume: no session to resume; pass --session ID "
                                 "(or run a %%we0 cell first).")
            try:
                panel = RunPanel(agent, session_id, check=False)
                if args.resume:
                    panel.resume()
                else:
                    panel.start(_body(cell))
            except (TypeError, ValueError) as exc:  # the agent or the request is wrong: the user's to fix
                raise UsageError(f"%%we0: {exc}") from None
            if panel.session_id is not None:
                self.sessions[args.agent] = panel.session_id
            ns[panel_name] = panel

    def _check_options(args: Any, cell: Any) -> str:
        """The user's mistakes, each a one-line UsageError; the panel variable's name."""
        if args.session is not None and not args.session.strip():
            raise UsageError("%%we0 --session: the session id is empty; pass an id or leave --session out.")
        if args.resume and args.new:
            raise UsageError("%we0: --resume and --new together: a new session has nothing to resume.")
        if not (args.panel.isidentifier() and not keyword.iskeyword(args.panel)):
            raise UsageError(f"%%we0 --panel: {args.panel!r} is not a Python variable name; "
                             "pass one such as we0_panel.")
        if not (args.agent.isidentifier() and not keyword.iskeyword(args.agent)):
            raise UsageError(f"%%we0 --agent: {args.agent!r} is not a Python variable name.")
        body = _body(cell)
        if args.resume and body.strip():
            raise UsageError("%%we0 --resume: the cell body must be empty (resume mode sends no message).")
        if not args.resume and not body.strip():
            raise UsageError("%%we0: the cell body is the user message; it is empty "
                             "(`%we0 --resume` on one line resumes without a message).")
        return str(args.panel)

    return We0Magics


def _body(cell: Any) -> str:
    return (cell or "").strip("\n")


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%we0`` (``%load_ext we0nb``)."""
    ipython.register_magics(_make_magics_class())


def __getattr__(name: str) -> Any:
    if name == "We0Magics":
        return _make_magics_class()
    raise AttributeError(name)

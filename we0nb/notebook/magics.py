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
``%we0 -h`` prints this usage.
"""

from __future__ import annotations

from typing import Any

__all__ = ["We0Magics", "load_ipython_extension"]

_USAGE = """The cell body is the user message for the agent variable. Without --session the cell
continues the session of the previous %%we0 cell; a %%we0 cell run while the previous one
still runs on that session waits for it (Run All queues them). `%we0 --resume` (one line)
resumes the session; the panel is kept in we0_panel: `await we0_panel.wait()`."""


def _make_magics_class() -> Any:
    from IPython.core.magic import Magics, line_cell_magic, magics_class
    from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

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

            if {"-h", "--help"} & set(line.split()):
                print(getattr(self.we0, "parser").format_help().rstrip() + "\n\n" + _USAGE)
                return
            args = parse_argstring(self.we0, line)
            assert self.shell is not None  # (a magic runs in a shell)
            ns = self.shell.user_ns
            if args.agent not in ns:
                raise NameError(f"%%we0: no variable {args.agent!r} in the notebook; create one with "
                                f"`{args.agent} = We0Agent(...)` or pass --agent NAME.")
            agent = ns[args.agent]
            session_id = args.session
            if session_id is None and not args.new:
                session_id = self.sessions.get(args.agent)
            body = (cell or "").strip("\n")
            if args.resume:
                if body.strip():
                    raise ValueError("%%we0 --resume: the cell body must be empty (resume mode sends no message).")
                if session_id is None:
                    raise ValueError("%%we0 --resume: no session to resume; pass --session ID.")
            elif not body.strip():
                raise ValueError("%%we0: the cell body is the user message; it is empty "
                                 "(`%we0 --resume` on one line resumes without a message).")
            panel = RunPanel(agent, session_id, check=False)
            if args.resume:
                panel.resume()
            else:
                panel.start(body)
            if panel.session_id is not None:
                self.sessions[args.agent] = panel.session_id
            ns[args.panel] = panel

    return We0Magics


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%%we0`` (``%load_ext we0nb``)."""
    ipython.register_magics(_make_magics_class())


def __getattr__(name: str) -> Any:
    if name == "We0Magics":
        return _make_magics_class()
    raise AttributeError(name)

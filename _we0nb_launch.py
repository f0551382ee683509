"""The ``we0nb`` console script: Ctrl-C is one plain line from the first instant.

Importing the command (``we0nb.cli``, which imports ``we0nb``: pydantic, the engine) takes
most of a second; a Ctrl-C during those imports used to print Python's traceback of
whatever was loading (once a pydantic-core ``PanicException``). This module lives outside the
``we0nb`` package, so that importing it loads nothing of ours: importing it installs its
SIGINT handler, and a Ctrl-C until the command is loaded ends the process at once with the
command's own line and exit code 130. Then the command's handling takes over (it aborts a
run where it is, see ``we0nb.cli._common.CtrlC``).
"""

import _signal  # the C module: ``signal`` imports enum, tens of milliseconds before the handler is in place
import os
import sys

__all__ = ["main"]

EXIT_INTERRUPTED = 130  # as we0nb.cli._common.EXIT_INTERRUPTED (not imported: that is the heavy part)
_LINE = b"we0nb: interrupted (Ctrl-C).\n"


def _interrupted_while_loading(signum: int, frame: object) -> None:
    """Nothing has started yet: say so and leave at once (no unwinding through half-done imports)."""
    try:
        os.write(2, _LINE)
    finally:
        os._exit(EXIT_INTERRUPTED)


def _install() -> None:
    try:
        _signal.signal(_signal.SIGINT, _interrupted_while_loading)
    except ValueError:  # (imported off the main thread: not as the console script)
        pass


# at import, not in main(): the console script pip writes runs a line of its own (``re.sub``
# on argv[0], a regex compile) between importing this module and calling main()
_install()


def main() -> int:
    """Load and run the command (the early Ctrl-C handling is in place since the import)."""
    _install()
    from we0nb.cli import main as command

    # Python's own handler again: the command catches KeyboardInterrupt where it can be
    # pressed, and a running command replaces it with its own (asyncio's, then CtrlC's)
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    try:
        return command()
    except KeyboardInterrupt:  # pressed between the command's own handlers: the same line
        os.write(2, _LINE)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

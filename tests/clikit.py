"""The command line run in the test's own process (fast; capsys captures it)."""

from __future__ import annotations

__all__ = ["cli"]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``we0nb ARGS`` in this process; exit code, stdout, stderr."""
    from we0nb.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse: --help, usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err

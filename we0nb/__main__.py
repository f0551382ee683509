"""``python -m we0nb`` runs the ``we0nb`` command (see :mod:`we0nb.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

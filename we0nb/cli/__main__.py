"""``python -m we0nb.cli`` runs the ``we0nb`` command."""

import sys

from . import main

sys.exit(main())

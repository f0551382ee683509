"""Optional dependencies: imported when first used, with one clear line when missing.

``import we0nb`` and every public name import on the base install; what needs an extra
(the openai client, psycopg, …) imports it on first use through :func:`require`, which
names the install command instead of showing a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import We0Error

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(We0Error, ImportError):
    """A feature needs a package that is not installed; the message says how to install it."""


def require(module: str, feature: str, extra: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise :class:`MissingExtraError` naming ``we0nb[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = getattr(e, "name", None) or module
        raise MissingExtraError(
            f"{feature} needs the {missing!r} package, which is not installed: "
            f'pip install "we0nb[{extra}]"'
        ) from e

"""The one way a package of we0nb offers names it imports on first use.

``import we0nb`` stays light (no SQLAlchemy, pandas, Jupyter or provider client): a name whose
module is heavy is listed with that module, and the package's ``__getattr__`` imports it when
the name is first read, then keeps it as a plain attribute. A name may also be *moved*: still
importable from here, with a :class:`DeprecationWarning` naming its new home.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, namespace: dict[str, Any], lazy: Mapping[str, str],
               moved: Mapping[str, str] = {}) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``lazy`` maps a name to the module that defines
    it; ``moved`` maps a name to the module it now belongs to (read with a DeprecationWarning)."""

    def __getattr__(name: str) -> Any:
        module = lazy.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
            namespace[name] = value  # once imported, a plain attribute
            return value
        home = moved.get(name)
        if home is not None:
            warnings.warn(f"{package}.{name} moved to {home}.{name}; import it from there.", DeprecationWarning,
                          stacklevel=2)
            return getattr(importlib.import_module(home), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())) | set(lazy))

    return __getattr__, __dir__

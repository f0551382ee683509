"""A griffe extension for the API reference: the package's docstrings use Sphinx roles
(``:class:`~we0nb.MCPServer```), which Markdown would print as written; each becomes inline
code naming the object (``MCPServer``: a leading ``~`` keeps the last dotted name, as Sphinx does).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>~?[^`]+)`")


def _name(match: re.Match[str]) -> str:
    target = match.group("target")
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring to inline code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_name, obj.docstring.value)

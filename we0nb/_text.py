"""Text that can always be stored: surrogate code points repaired.

A Python ``str`` may hold lone UTF-16 surrogates (``"\\ud83d"``): JSON escapes decode to
them, and servers that split a stream by UTF-16 units send an emoji as two halves in two
deltas. Such a string cannot be encoded as UTF-8, so it could not be persisted. The
engine repairs text where it enters: a pair split across deltas is joined
(:class:`SurrogateJoiner`), a lone surrogate becomes U+FFFD, nothing before it is lost.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["clean", "clean_json", "SurrogateJoiner", "clip_words", "readable_error"]

_SURROGATE = re.compile("[\ud800-\udfff]")
#: where an error message names the records it concerns (`` in session 'ses_…'``, `` (assistant
#: message 'msg_…')``): a person reading a batch's errors already sees the item and its session
_RECORD_IDS = re.compile(r"\s*\((?:user |assistant )?message '[^']*'\)|\s+in session '[^']*'|"
                         r"\s*\(session '[^']*'\)")


def clean(text: str) -> str:
    """``text`` with surrogate pairs joined and lone surrogates replaced by U+FFFD."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_json(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings…) with every string :func:`clean`ed."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_json(v) for v in value]
    return value


class SurrogateJoiner:
    """Repairs a stream of deltas: a high surrogate at the end of one waits for the next.

    ``held`` is the half waiting (empty: none): a caller that skips :meth:`feed` for ASCII
    deltas must feed them while it is not empty, or the half would come out after them."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = ""

    def feed(self, delta: str) -> str:
        """The repaired text to emit for ``delta`` (may be empty while a half is held)."""
        if self.held:
            delta, self.held = self.held + delta, ""
        elif delta.isascii():
            return delta
        if delta and "\ud800" <= delta[-1] <= "\udbff":
            delta, self.held = delta[:-1], delta[-1]
        return clean(delta)

    def flush(self) -> str:
        """What is still held at the end of a part (a lone half: U+FFFD)."""
        held, self.held = self.held, ""
        return clean(held) if held else ""


def clip_words(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word's end with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.(") + "…"


def readable_error(message: str, limit: int = 160) -> str:
    """An error message as a person reads it in a list: the record ids it names removed (the
    reader sees the item and its session beside it), on one line, clipped at a word."""
    return clip_words(_RECORD_IDS.sub("", message), limit)

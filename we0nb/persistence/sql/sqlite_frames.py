"""The frames on the pipes between the event loop and SQLite's writer process: a 4-byte
big-endian length, then a pickle. Both sides use this file (standard library only: the writer
process loads it by path, without the we0nb package), so they cannot disagree on the format."""

from __future__ import annotations

import pickle
from typing import Any, Iterable

__all__ = ["encode", "decode"]


def encode(objs: Iterable[Any]) -> bytes:
    """``objs`` as consecutive frames."""
    data = bytearray()
    for obj in objs:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        data += len(body).to_bytes(4, "big")
        data += body
    return bytes(data)


def decode(buf: bytearray, start: int = 0) -> tuple[list[Any], int]:
    """The whole frames in ``buf`` from ``start``, and where the first incomplete one begins."""
    out = []
    while len(buf) - start >= 4:
        n = int.from_bytes(buf[start:start + 4], "big")
        if len(buf) - start - 4 < n:
            break
        out.append(pickle.loads(buf[start + 4:start + 4 + n]))
        start += 4 + n
    return out, start

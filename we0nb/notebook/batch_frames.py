"""Batches as DataFrames: ``batches_df(p)`` (one row per batch) and ``batch_df(p, name)``.

``p`` is what the other frames take: an agent, a persistence, a SQLAlchemy Engine or a
database URL (opened as :mod:`we0nb.persistence.sql.columns` opens it: nothing created). A
SQL database is read through a synchronous connection; a MemoryPersistence through its port. ``batch_df`` has the columns of
``BatchResult.df`` (see :mod:`we0nb.batch.result`); ``sessions_df(p, batch=name)`` keeps the
sessions of one batch, and the other frames join them on ``session_id``.
"""

from __future__ import annotations

from typing import Any, Callable, cast

import pandas as pd

from ..batch.result import items_frame
from ..persistence.batches import BATCH_STATUSES, BatchInfo, BatchItem
from .sync import run_sync

__all__ = ["batches_df", "batch_df", "batch_session_ids", "BATCHES_COLUMNS"]

BATCHES_COLUMNS = ("name", "items", *BATCH_STATUSES, "unfinished", "created", "updated")


def batches_df(p: Any) -> pd.DataFrame:
    """One row per batch: its name, item count, items by status, unfinished items, created/updated."""
    infos = _infos(p)

    def times(values: list[float]) -> Any:
        return pd.to_datetime(pd.Series(values, dtype="float64"), unit="s", utc=True).astype("datetime64[us, UTC]")

    data: dict[str, Any] = {
        "name": pd.Series([i.name for i in infos], dtype="string"),
        "items": pd.Series([i.items for i in infos], dtype="Int64"),
    }
    for s in BATCH_STATUSES:
        data[s] = pd.Series([i.counts.get(s, 0) for i in infos], dtype="Int64")
    data["unfinished"] = pd.Series([i.unfinished for i in infos], dtype="Int64")
    data["created"] = times([i.created for i in infos])
    data["updated"] = times([i.updated for i in infos])
    return cast(pd.DataFrame, pd.DataFrame(data)[list(BATCHES_COLUMNS)])


def batch_df(p: Any, name: str) -> pd.DataFrame:
    """One row per item of batch ``name`` (as ``BatchResult.df``); ValueError when there is none."""
    items = _items(p, name)
    return items_frame(items, _read(p, lambda store: store.batch_costs(name), lambda reader: reader.batch_costs(name)))


def batch_session_ids(p: Any, name: str) -> list[str]:
    """The session ids of batch ``name``'s items, in item order (ValueError: no such batch)."""
    return [it.session_id for it in _items(p, name)]


def _items(p: Any, name: str) -> list[BatchItem]:
    if not isinstance(name, str):
        raise TypeError(f"batch name must be a string, got {type(name).__name__}.")
    items = _read(p, lambda store: store.batch_items(name), lambda reader: reader.batch_items(name))
    if not items:
        known = [i.name for i in _infos(p)]
        hint = f" Known batches: {', '.join(map(repr, known[:10]))}." if known else " There are no batches."
        raise ValueError(f"No batch named {name!r} in this store.{hint}")
    return items


def _infos(p: Any) -> list[BatchInfo]:
    return _read(p, lambda store: store.list_batches(), lambda reader: reader.batches())


def _read(p: Any, port: Callable[[Any], Any], sql: Callable[[Any], Any]) -> Any:
    """Read from ``p`` as the other frames do: a SQL database through its
    :class:`~we0nb.persistence.sql.columns.SqlReader` (a URL read-only, nothing created; driver
    errors as PersistenceError), any other persistence through its port."""
    from ..persistence.sql.columns import open_reader, persistence_of

    reader = open_reader(p)
    if reader is None:
        store = persistence_of(p)
        return run_sync(lambda: port(store))
    with reader:
        return sql(reader)

"""Persistence: where the broker's change records go.

``MemoryStore`` and ``Store`` load on first use: the archiver process imports only
``records``, ``events`` and ``archive`` from here, and stays small without the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kapok.storage.store import MemoryStore, Store

__all__ = ["MemoryStore", "Store"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from kapok.storage import store

    return getattr(store, name)

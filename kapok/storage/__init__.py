"""Persistence: where the broker's change records go."""

from kapok.storage.store import MemoryStore, Store

__all__ = ["MemoryStore", "Store"]

"""The seam between the broker and its durable storage.

The service hands every batch of change records (``kapok.core.changes``) to
a ``Store`` right after the broker produced them, in order. ``append``
returns ``None`` when the records are already as durable as the configured
policy asks, or an awaitable that completes when they are; replies that
promise durability (producer ``ok`` / ``puback`` / HTTP answers) wait for it.
The write-ahead log implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from kapok.core.changes import Change

__all__ = ["MemoryStore", "Store"]


class Store(Protocol):
    @property
    def wants_changes(self) -> bool:
        """False when the store keeps nothing, so the broker can skip building records."""
        ...

    async def start(self) -> None: ...

    def append(self, changes: Sequence[Change]) -> Awaitable[None] | None: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """Keeps nothing: state lives in the broker's memory only and dies with the process."""

    wants_changes = False

    async def start(self) -> None:
        return None

    def append(self, changes: Sequence[Change]) -> Awaitable[None] | None:
        return None

    async def aclose(self) -> None:
        return None

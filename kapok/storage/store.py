"""The seam between the broker and its durable storage.

The service opens the store once (recovery fills the broker), then hands it
every batch of change records (``kapok.core.changes``) right after the
broker produced them, in order. ``append`` returns ``None`` when nothing
needs waiting for, or a future that completes once the records are as
durable as the configured policy promises; replies that promise durability
(producer ``ok`` / ``puback`` / HTTP answers) wait for it. Appends that are
written together may share one future. While ``full()`` gives a reason, the
service refuses new messages (``StorageFullError``) and stores only what
consumers do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from kapok.core.broker import Broker
from kapok.core.changes import Change

__all__ = ["MemoryStore", "Store"]


class Store(Protocol):
    @property
    def wants_changes(self) -> bool:
        """False when the store keeps nothing, so the broker can skip building records."""
        ...

    async def open(self, broker: Broker, now: float, *, mirror: bool = False) -> None:
        """Recover what was stored into ``broker`` and start accepting appends; a ``mirror``
        keeps the replayed state as it is (``kapok.core.replay.Mirror``)."""
        ...

    def append(self, changes: Sequence[Change]) -> asyncio.Future[None] | None: ...

    def write_now(self) -> None:
        """Write what was appended so far now, if that costs little (``WriteAheadLog.write_now``):
        a caller that has appended all it has for this turn says so. A hint only."""
        ...

    def full(self) -> str | None:
        """Why the store takes no new messages now (its disk is full: naming the directory
        and its free space), or None when it takes them."""
        ...

    def stop_waiting(self) -> None:
        """The node is stopping: writes that wait for space on a full disk give up now
        (their appends fail: none was acknowledged), so that the stop does not wait."""
        ...

    def stats(self) -> dict[str, float]:
        """Figures for /metrics, by name: a name ending in ``_total`` is a counter (it only
        grows while the node runs), any other a gauge."""
        ...

    async def aclose(self, *, snapshot: bool = True) -> None: ...


class MemoryStore:
    """Keeps nothing: state lives in the broker's memory only and dies with the process."""

    wants_changes = False

    async def open(self, broker: Broker, now: float, *, mirror: bool = False) -> None:
        return None

    def append(self, changes: Sequence[Change]) -> asyncio.Future[None] | None:
        return None

    def write_now(self) -> None:
        return None

    def full(self) -> str | None:
        return None

    def stop_waiting(self) -> None:
        return None

    def stats(self) -> dict[str, float]:
        return {}

    async def aclose(self, *, snapshot: bool = True) -> None:
        return None

"""The broker's rules, free of I/O: every function takes ``now`` and returns data.

Nothing in this package may import asyncio, socket, aiohttp, time or random
(``tests/unit/test_purity.py`` checks it), so the same rules run under the
server, under a replaying WAL and under the tests' manual clock.

The names below load on first use: a process that needs only ``kapok.core.changes``
(the archiver) does not import the broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kapok.core.broker import Broker, Draft, Stats
    from kapok.core.consumers import Consumer
    from kapok.core.model import Entry, Message, Status

__all__ = ["Broker", "Consumer", "Draft", "Entry", "Message", "Stats", "Status"]

_HOMES = {"Broker": "broker", "Draft": "broker", "Stats": "broker", "Consumer": "consumers"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"kapok.core.{_HOMES.get(name, 'model')}"), name)

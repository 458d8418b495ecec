"""The broker's rules, free of I/O: every function takes ``now`` and returns data.

Nothing in this package may import asyncio, socket, aiohttp, time or random
(``tests/unit/test_purity.py`` checks it), so the same rules run under the
server, under a replaying WAL and under the tests' manual clock.
"""

from kapok.core.broker import Broker, Draft, Stats
from kapok.core.model import Consumer, Entry, Message, Status

__all__ = ["Broker", "Consumer", "Draft", "Entry", "Message", "Stats", "Status"]

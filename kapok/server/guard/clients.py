"""The node's client connections, as the consoles list them, and what clients got wrong.

One ``Clients`` per node (``kapok.server.keys.CLIENTS``): the routes register each
connection here while it is open, count input they refused (by kind, for ``/metrics``),
and the key checks keep their failures and their back-off here. The broker service knows
nothing of connections: it serves whichever route calls it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kapok.config import ServerConfig
from kapok.server.guard.throttle import AuthThrottle

__all__ = ["ClientInfo", "Clients"]


@dataclass(slots=True)
class ClientInfo:
    """A client connection, as the consoles list it: by what it does. A KapokMQ socket
    produces to or consumes from one topic; a native one may publish to several topics
    and hold several subscriptions, or (so far) neither."""

    client_id: str
    ip: str
    since: float
    protocol: str  # "kapokmq" | "v1"
    published: set[str] = field(default_factory=set)  # topics it produces to
    subscriptions: set[int] = field(default_factory=set)  # its consumers' ids (broker.consumers)


class Clients:
    def __init__(self, server: ServerConfig) -> None:
        self.open: dict[int, ClientInfo] = {}
        self.bad_input: Counter[str] = Counter()  # by kind, exported in /metrics
        self.auth_failures = 0
        # One back-off for every way of presenting the key (kapok.server.guard.auth.judge_key).
        self.auth_throttle = AuthThrottle(
            server.auth_backoff_after, server.auth_backoff_s, server.auth_backoff_max_s
        )
        self._next = 1

    def __len__(self) -> int:
        return len(self.open)

    def add(self, info: ClientInfo) -> int:
        cid = self._next
        self._next += 1
        self.open[cid] = info
        return cid

    def remove(self, cid: int) -> None:
        self.open.pop(cid, None)

    def count_bad_input(self, kind: str) -> None:
        self.bad_input[kind] += 1

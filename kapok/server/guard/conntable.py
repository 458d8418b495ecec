"""Every TCP connection of a node, from accept to close (pure: ``now`` is an argument).

Theory of operation. A connection is counted toward ``server.max_connections`` from
the moment it is accepted, whatever it does next, and always has a deadline while it
costs something without having shown the key:

    state      what it waits for                       deadline
    IDLE       a request's headers (new, or kept alive) header_timeout_s after accept / answer
                                                       (idle_timeout_s once it is trusted)
    BODY       the rest of a request's body            body_timeout_s after the headers
    BUSY       its handler (long-polls bound themselves) none
    HANDSHAKE  a KapokMQ WebSocket's secret key        auth_timeout_s + grace (the handshake
                                                       closes it itself; this is the backstop)
    OPEN       an authenticated WebSocket              none (its heartbeat drops a dead peer)

A connection becomes *trusted* once it has presented the right key (a bearer header,
the KapokMQ handshake, ``secretKey``). When a new connection arrives at the limit, the
oldest untrusted connection is evicted to make room for it; only when every connection
is trusted is the newcomer refused. So silent sockets, slow headers and unfinished
handshakes can never lock out a client that has the key: it evicts one of them, and
then authenticates in one round trip.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

__all__ = ["Admit", "ConnState", "ConnectionTable", "Limits"]


class ConnState(enum.Enum):
    IDLE = "idle"
    BODY = "body"
    BUSY = "busy"
    HANDSHAKE = "handshake"
    OPEN = "open"


# What closing a connection for its deadline is called (metrics label, log line).
TIMEOUT_REASON = {
    ConnState.IDLE: "header_timeout",  # "idle_timeout" for a trusted connection (see reason())
    ConnState.BODY: "body_timeout",
    ConnState.HANDSHAKE: "handshake_timeout",
}
HANDSHAKE_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    idle_timeout_s: float
    handshake_timeout_s: float


class Admit(enum.Enum):
    YES = "yes"
    EVICT = "evict"  # yes, once the returned victim is closed
    NO = "no"


@dataclass(slots=True)
class _Conn:
    state: ConnState
    deadline: float  # inf: none
    trusted: bool = False


class ConnectionTable:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        # Insertion order is accept order, so the first untrusted entry is the oldest.
        self._conns: dict[Hashable, _Conn] = {}

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._conns

    def count(self, state: ConnState) -> int:
        return sum(1 for c in self._conns.values() if c.state is state)

    def admit(self, key: Hashable, now: float) -> tuple[Admit, Hashable | None]:
        """A connection was accepted: count it, and say whether it may stay. With
        ``EVICT`` the caller must close the returned victim (already forgotten here)."""
        victim: Hashable | None = None
        if len(self._conns) >= self.limits.max_connections:
            victim = next((k for k, c in self._conns.items() if not c.trusted), None)
            if victim is None:
                return Admit.NO, None
            del self._conns[victim]
        self._conns[key] = _Conn(ConnState.IDLE, now + self.limits.header_timeout_s)
        return (Admit.YES, None) if victim is None else (Admit.EVICT, victim)

    def closed(self, key: Hashable) -> None:
        self._conns.pop(key, None)

    def set_state(self, key: Hashable, state: ConnState, now: float) -> None:
        conn = self._conns.get(key)
        if conn is None:
            return  # not ours (a test server without the guard), or already gone
        conn.state = state
        limits = self.limits
        if state is ConnState.IDLE:
            conn.deadline = now + (limits.idle_timeout_s if conn.trusted else limits.header_timeout_s)
        elif state is ConnState.BODY:
            conn.deadline = now + limits.body_timeout_s
        elif state is ConnState.HANDSHAKE:
            conn.deadline = now + limits.handshake_timeout_s + HANDSHAKE_GRACE_S
        else:
            conn.deadline = float("inf")

    def trust(self, key: Hashable) -> None:
        conn = self._conns.get(key)
        if conn is not None:
            conn.trusted = True

    def reason(self, key: Hashable, state: ConnState) -> str:
        """What closing ``key`` for its deadline in ``state`` is called."""
        conn = self._conns.get(key)
        if state is ConnState.IDLE and conn is not None and conn.trusted:
            return "idle_timeout"
        return TIMEOUT_REASON.get(state, "timeout")

    def state(self, key: Hashable) -> ConnState | None:
        conn = self._conns.get(key)
        return None if conn is None else conn.state

    def expired(self, now: float) -> list[tuple[Hashable, ConnState]]:
        """Connections past their deadline, with the state they were stuck in. They stay
        counted until the caller has closed them (``closed``)."""
        return [(k, c.state) for k, c in self._conns.items() if c.deadline <= now]

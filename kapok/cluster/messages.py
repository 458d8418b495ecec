"""What SWIM nodes say to each other, and what the state machine asks its driver to do.

Everything here is a frozen, slotted value. *Messages* travel on the wire (see
``codec.py`` for their encoding; the numeric type codes are wire constants and only
ever get appended to). *Effects* are the state machine's output: the driver (asyncio
UDP/TCP, or the simulator) carries them out and makes no decisions of its own.

Node metadata travels inside ``Alive`` and push-pull entries; nothing about a node is
ever parsed out of its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

__all__ = [
    "Ack",
    "Alive",
    "Dead",
    "Effect",
    "IndirectPing",
    "MemberChanged",
    "Message",
    "Nack",
    "NodeMeta",
    "NodeState",
    "Ping",
    "PushPull",
    "Rng",
    "Send",
    "SendStream",
    "State",
    "Suspect",
]


class Rng(Protocol):
    """The slice of ``random.Random`` the protocol uses; a seeded instance is injected."""

    def random(self) -> float: ...

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int: ...


class State(StrEnum):
    """A member's state as seen by one node. ``left`` is a graceful leave, ``dead`` a failure."""

    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class NodeMeta:
    """What the broker tells the cluster about a node (and ``/cluster/nodes`` shows).

    ``role`` is the node's current role in its master/slave pair, ``pair`` names the
    other node of the pair (``None`` when unpaired), ``epoch`` is the pair's fencing
    epoch as this node knows it, ``active`` says whether it takes producers and
    consumers now, and ``lag`` is, on a slave, how far it is behind its master
    (records, bytes, seconds; ``None`` when it is not following). ``pair_id`` names the
    pair whatever its roles are now: the configured master's name (a takeover or a
    give-back does not change it; clients tie keys and retries to it). ``load`` is a
    free-form figure the node publishes (higher = busier). ``alone_since`` is set while a
    node confirms writes without its partner (its partner must not take over then).
    """

    name: str
    http_url: str = ""
    role: str = "master"
    pair: str | None = None
    version: str = ""
    load: float = 0.0
    epoch: int = 0
    active: bool = True
    lag: tuple[int, int, float] | None = None
    pair_id: str = ""  # "" = the node's own name (an older node, or no pair)
    alone_since: int | None = None  # sync replication: confirming writes alone since this LSN


@dataclass(frozen=True, slots=True)
class NodeState:
    """One member as one node sees it: a push-pull entry and a row of ``Swim.members()``."""

    name: str
    addr: str
    incarnation: int
    state: State
    meta: NodeMeta


# ---------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Ping:
    """Direct probe. ``target`` is the name the sender means to reach, so a node that
    restarted under another name at the same address does not answer for the old one.

    ``stream_reply_addr`` set: the ack goes back to that address over a stream, and by
    datagram too (the TCP fallback probe, memberlist's TCP ping). A stream is one-way and
    its receiver learns no sender address, so the ping carries it, as ``PushPull`` does."""

    seq: int
    target: str
    source: str
    stream_reply_addr: str = ""


@dataclass(frozen=True, slots=True)
class IndirectPing:
    """Ask a helper to probe ``target`` at ``target_addr`` and relay the ack (ping-req).
    With ``nack`` the helper also answers ``Nack`` when the target stays silent."""

    seq: int
    target: str
    target_addr: str
    nack: bool


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


@dataclass(frozen=True, slots=True)
class Nack:
    """Lifeguard: "I tried the target for you and heard nothing" — proof the helper is alive."""

    seq: int


@dataclass(frozen=True, slots=True)
class Suspect:
    incarnation: int
    node: str
    source: str


@dataclass(frozen=True, slots=True)
class Alive:
    """Join, refutation or metadata update; only ``node`` itself ever raises its incarnation."""

    incarnation: int
    node: str
    addr: str
    meta: NodeMeta


@dataclass(frozen=True, slots=True)
class Dead:
    """Confirmed failure; ``source == node`` is a graceful leave (the node becomes ``left``)."""

    incarnation: int
    node: str
    source: str


@dataclass(frozen=True, slots=True)
class PushPull:
    """Full state exchange (anti-entropy and join). Too large for a datagram: sent as a stream.
    ``reply`` asks the receiver to answer with its own state; ``join`` marks a joiner."""

    source: str
    source_addr: str
    join: bool
    reply: bool
    states: tuple[NodeState, ...]


Message = Ping | IndirectPing | Ack | Nack | Suspect | Alive | Dead | PushPull


# ---------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    """Send one datagram (already encoded and authenticated, at most the packet limit)."""

    addr: str
    data: bytes


@dataclass(frozen=True, slots=True)
class SendStream:
    """Deliver one authenticated blob over a stream connection (push-pull, the TCP fallback
    ping and its ack); best effort."""

    addr: str
    data: bytes


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """A member's row changed (new, state, incarnation, address or metadata); also for self."""

    name: str
    addr: str
    state: State
    incarnation: int
    meta: NodeMeta
    previous: State | None  # None: first time this node hears of the member


Effect = Send | SendStream | MemberChanged

"""Cluster membership: SWIM failure detection and gossip with Lifeguard (SPEC §6).

Pure, sans-I/O modules (no asyncio, socket, time or random imports; ``now`` and a seeded
``random.Random`` are passed in): ``messages``, ``codec``, ``suspicion``, ``broadcasts``,
``config``, ``membership``, ``swim``. Drivers: ``simnet`` (discrete-event simulator),
``scenarios`` and ``sim`` (the S1–S8 benchmark, ``python -m kapok.cluster.sim``).
"""

from __future__ import annotations

from kapok.cluster.codec import Codec, DecodeError, KeyRing
from kapok.cluster.config import SwimConfig
from kapok.cluster.messages import Effect, MemberChanged, NodeMeta, NodeState, Send, SendStream, State
from kapok.cluster.swim import Swim

__all__ = [
    "Codec",
    "DecodeError",
    "Effect",
    "KeyRing",
    "MemberChanged",
    "NodeMeta",
    "NodeState",
    "Send",
    "SendStream",
    "State",
    "Swim",
    "SwimConfig",
]

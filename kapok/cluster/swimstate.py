"""The state of one SWIM member, what it answers, and its outbox (pure).

``SwimState`` holds what ``Swim`` (``swim.py``) works on: the member table, the probe round
and the relays in flight, the timers of the periodic work, the counters. It answers the
queries (``members``, ``awareness``, ``next_deadline`` …) and assembles what goes out: a
packet topped up with queued membership updates (piggybacking), the push-pull stream of the
whole table, the effects handed back at the end of each call. The protocol's rules — what
each call, message and timer does — are ``Swim``'s.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kapok.cluster.codec import Codec, KeyRing, meta_size
from kapok.cluster.config import SwimConfig
from kapok.cluster.membership import Membership
from kapok.cluster.membertable import Member
from kapok.cluster.messages import Effect, Message, NodeMeta, NodeState, Rng, Send, SendStream
from kapok.cluster.suspicion import retransmit_limit

__all__ = ["Probe", "Relay", "SwimState"]

_INF = math.inf


# The probe round in flight: whom, under which seq, its timeout and its deadline.
@dataclass(slots=True)
class Probe:
    target: Member
    incarnation: int  # the target's incarnation when the round started
    seq: int
    start: float
    timeout_at: float
    deadline: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


# A probe run for another member (an ``IndirectPing``): whom to answer, and whether with a nack.
@dataclass(slots=True)
class Relay:
    requester: str
    seq: int
    nack: bool


class SwimState:
    """One member's protocol state and its plumbing; ``Swim`` adds the rules."""

    def __init__(
        self,
        name: str,
        addr: str,
        meta: NodeMeta,
        config: SwimConfig,
        rng: Rng,
        *,
        codec: Codec | None = None,
        keyring: KeyRing | None = None,
        incarnation: int = 0,
    ) -> None:
        if meta.name != name:
            raise ValueError(f"meta.name {meta.name!r} must be the node name {name!r}")
        if not math.isfinite(meta.load):
            raise ValueError("meta.load must be a finite number")
        if meta_size(meta) > config.meta_max_bytes:
            raise ValueError(f"node metadata is over {config.meta_max_bytes} bytes encoded")
        self.name = name
        self.addr = addr
        self.config = config
        self.rng = rng
        self.codec = codec or Codec(keyring, config.max_packet_bytes)
        self.stats: Counter[str] = Counter()
        self._out: list[Effect] = []
        me = Member(name, addr, incarnation, meta, 0.0)
        self.table = Membership(me, config, rng, self.codec, self._out, self.stats)
        self._seq = 0
        self._started = False
        self._probe: Probe | None = None
        self._next_probe = _INF
        self._relays: dict[int, Relay] = {}
        self._relay_timers: list[tuple[float, int]] = []
        self._gossip_phase = 0.0
        self._next_gossip = _INF
        self._next_push_pull = _INF
        self._next_reconnect = _INF
        self._seeds: tuple[str, ...] = ()
        self._next_join = _INF

    # ------------------------------------------------------------ queries

    @property
    def incarnation(self) -> int:
        return self.table.me.incarnation

    @property
    def awareness(self) -> int:
        """Lifeguard local health score: 0 is healthy."""
        return self.table.awareness.score

    @property
    def leave_done(self) -> bool:
        """After ``leave``: the leave notice has been sent as often as the retransmit limit asks."""
        return self.table.leaving and (self.name not in self.table.queue or not self.table.peer_count)

    @property
    def seeds(self) -> tuple[str, ...]:
        """The seeds ``join`` contacts: the ones it was given, but for our own address."""
        return self._seeds

    @property
    def auth_drops(self) -> int:
        """Packets and streams dropped because the HMAC did not verify, or was missing or not
        expected: the mark of a peer with another ``cluster.secret`` (or none)."""
        return self.stats["drop_auth"] + self.stats["drop_unauthenticated"]

    def members(self) -> tuple[NodeState, ...]:
        """Every row this node holds, its own included."""
        return self.table.snapshot()

    def member(self, name: str) -> NodeState | None:
        m = self.table.members.get(name)
        return None if m is None else m.view()

    def next_deadline(self) -> float:
        """When ``tick`` next has work (``-inf`` before the first call of anything)."""
        if not self._started:
            return -_INF
        probe = self._probe
        if probe is None:
            t = self._next_probe
        else:
            t = probe.deadline if probe.indirect_sent else probe.timeout_at
        if self._relay_timers and self._relay_timers[0][0] < t:
            t = self._relay_timers[0][0]
        if self.table.queue and self._next_gossip < t:  # gossip only matters while something is queued
            t = self._next_gossip
        t = min(t, self._next_push_pull, self._next_reconnect, self._next_join)
        expiry = self.table.next_expiry()
        if expiry is not None and expiry < t:
            t = expiry
        return t

    # ------------------------------------------------------------ plumbing

    def _start(self, now: float) -> None:
        if self._started:
            return
        self._started = True
        cfg = self.config
        rnd = self.rng.random
        self.table.me.state_change = now
        self._next_probe = now + rnd() * cfg.probe_interval_s
        self._gossip_phase = now + rnd() * cfg.gossip_interval_s
        self._next_push_pull = now + rnd() * cfg.push_pull_interval_s
        self._next_reconnect = now + rnd() * cfg.reconnect_interval_s

    def _flush(self, now: float) -> list[Effect]:
        if self.table.queue and (self._next_gossip == _INF or self._next_gossip < now):
            # Align gossip ticks to a per-node grid: the first one comes within one interval.
            step = self.config.gossip_interval_s
            self._next_gossip = self._gossip_phase + math.ceil((now - self._gossip_phase) / step) * step
            if self._next_gossip <= now:
                self._next_gossip += step
        out = self._out[:]
        self._out.clear()
        return out

    def _send(self, addr: str, msgs: Sequence[Message]) -> None:
        codec = self.codec
        parts = [codec.encode_message(m) for m in msgs]
        queue = self.table.queue
        if queue:
            budget = self.config.max_packet_bytes - codec.packet_size(parts) + (0 if parts else 1)
            parts += queue.take(budget, self._retransmit_limit())
        if not parts:
            return
        data = codec.seal(parts)
        self.stats["packets_out"] += 1
        self.stats["bytes_out"] += len(data)
        self._out.append(Send(addr, data))

    def _retransmit_limit(self) -> int:
        return retransmit_limit(self.config.retransmit_mult, self.table.live)

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _stream(self, addr: str, *, join: bool, reply: bool) -> None:
        codec = self.codec
        data = codec.seal(
            [codec.encode_push_pull(self.name, self.addr, join, reply, self.table.wire_snapshot())]
        )
        if len(data) > self.config.max_stream_bytes:
            self.stats["stream_too_large"] += 1
            return
        self.stats["streams_out"] += 1
        self._out.append(SendStream(addr, data))

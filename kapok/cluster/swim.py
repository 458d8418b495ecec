"""SWIM failure detection and dissemination with Lifeguard: the sans-I/O state machine.

Theory of operation. A node probes one member per ``probe_interval_s``, walking a shuffled
round-robin list. The probe round:

1. ``Ping`` the target (with Lifeguard, a target we already suspect also gets our
   ``Suspect`` in the same packet — the buddy system — so it can refute at once);
2. no ``Ack`` after ``probe_timeout_s``: ask ``indirect_checks`` random alive members to
   probe it for us (``IndirectPing``); they relay the ack, or answer ``Nack`` when the target
   stays silent for them too. With ``tcp_pings``, also ping the target over a stream (the
   driver's TCP), which answers both over a stream and by datagram; either ack ends the
   round like a direct one, so datagram loss alone seldom gets a live member suspected;
3. no ack, direct or relayed, by the round deadline (``probe_interval_s`` × local health):
   suspect the target. Local health (awareness) rises by the number of nacks that did *not*
   come back — silence from helpers means the problem is probably ours — and by one for
   every refutation; it falls by one after each successful probe.

Every packet we send carries as many queued membership updates as fit in
``max_packet_bytes`` (piggybacking); a gossip tick every ``gossip_interval_s`` sends the
rest to ``gossip_nodes`` random members while anything is queued. Every (scaled)
``push_pull_interval_s`` the whole table is exchanged with one random member over a stream;
joining is the same exchange with the seeds, and every ``reconnect_interval_s`` it is tried
with one random dead member (which heals partitions). The incarnation rules live in
``membership.py``; the timeouts in ``suspicion.py``.

The driver calls ``handle_packet`` / ``handle_stream`` when bytes arrive, ``tick`` when
``next_deadline()`` passes, and carries out the returned effects. Nothing here reads a clock,
touches a socket or draws from global randomness. The state these rules work on, the queries
and the outbox (piggybacking included) are ``SwimState``'s, in ``swimstate.py``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from kapok.cluster.codec import DecodeError, meta_size
from kapok.cluster.membertable import Member
from kapok.cluster.messages import (
    Ack,
    Alive,
    Dead,
    Effect,
    IndirectPing,
    Message,
    Nack,
    NodeMeta,
    Ping,
    PushPull,
    SendStream,
    State,
    Suspect,
)
from kapok.cluster.suspicion import push_pull_scale
from kapok.cluster.swimstate import Probe, Relay, SwimState

__all__ = ["Swim"]

_INF = math.inf


class Swim(SwimState):
    """One member's protocol state. See the module docstring for the protocol."""

    # ------------------------------------------------------------ public API

    def join(self, seeds: Sequence[str], now: float) -> list[Effect]:
        """Exchange state with every seed; repeated every ``join_retry_s`` until a peer is alive."""
        self._start(now)
        self._seeds = tuple(s for s in seeds if s != self.addr)
        self._send_join()
        self._next_join = now + self.config.join_retry_s if self._seeds else _INF
        return self._flush(now)

    def leave(self, now: float) -> list[Effect]:
        """Announce a graceful leave; keep ticking until ``leave_done`` to spread it."""
        self._start(now)
        self.table.leave(now)
        self._probe = None
        self._next_probe = self._next_join = _INF
        self._gossip(now)
        return self._flush(now)

    def set_meta(self, meta: NodeMeta, now: float) -> list[Effect]:
        """Publish new metadata (a new incarnation, gossiped like a refutation)."""
        if meta.name != self.name or not math.isfinite(meta.load):
            raise ValueError("meta must carry this node's name and a finite load")
        if meta_size(meta) > self.config.meta_max_bytes:
            raise ValueError(f"node metadata is over {self.config.meta_max_bytes} bytes encoded")
        self._start(now)
        self.table.set_meta(meta)
        return self._flush(now)

    def handle_packet(self, data: bytes | Sequence[Message], from_addr: str, now: float) -> list[Effect]:
        """A datagram (or already-decoded messages) from ``from_addr``; bad packets are counted
        in ``stats["drop_<reason>"]`` and otherwise ignored."""
        return self._handle(data, from_addr, now, self.config.max_packet_bytes)

    def handle_stream(self, data: bytes, now: float) -> list[Effect]:
        """A blob received over a stream connection (push-pull, a fallback ping or its ack)."""
        return self._handle(data, "", now, self.config.max_stream_bytes, stream=True)

    def tick(self, now: float) -> list[Effect]:
        """Run everything due at ``now``: suspicion timers, relays, the probe round, gossip,
        push-pull and join retries."""
        self._start(now)
        self.table.expire(now)
        self._expire_relays(now)
        self._run_probe(now)
        if now >= self._next_gossip:
            self._gossip(now)
        if now >= self._next_push_pull:
            self._push_pull(now)
        if now >= self._next_reconnect:
            self._next_reconnect = now + self.config.reconnect_interval_s
            partner = None if self.table.leaving else self.table.reconnect_partner()
            if partner is not None:
                self.stats["reconnects"] += 1
                self._stream(partner.addr, join=False, reply=True)
        if now >= self._next_join:
            if self.table.live > 1 or not self._seeds:
                self._next_join = _INF
            else:
                self._send_join()
                self._next_join = now + self.config.join_retry_s
        return self._flush(now)

    # ------------------------------------------------------------ message handlers

    def _handle(
        self, data: bytes | Sequence[Message], from_addr: str, now: float, limit: int, stream: bool = False
    ) -> list[Effect]:
        self._start(now)
        if isinstance(data, bytes | bytearray | memoryview):
            decoded = self.codec.decode(bytes(data), limit)
            if isinstance(decoded, DecodeError):
                self.stats["drop_" + decoded.reason] += 1
                return []
            msgs: Sequence[Message] = decoded
        else:
            msgs = data
        if stream and not from_addr:
            # A stream has no sender address; a fallback ping names the address to answer.
            from_addr = next((m.stream_reply_addr for m in msgs if isinstance(m, Ping)), "")
        self.stats["packets_in"] += 1
        for msg in msgs:
            if isinstance(msg, Ping):
                self._on_ping(msg, from_addr)
            elif isinstance(msg, Ack):
                self._on_ack(msg, now, stream)
            elif isinstance(msg, Alive):
                self.table.on_alive(msg, now)
            elif isinstance(msg, Suspect):
                self._on_suspect(msg, from_addr, now)
            elif isinstance(msg, Dead):
                self.table.on_dead(msg, now)
            elif isinstance(msg, IndirectPing):
                self._on_indirect(msg, from_addr, now)
            elif isinstance(msg, Nack):
                self._on_nack(msg)
            else:
                self._on_push_pull(msg, now)
        return self._flush(now)

    def _on_ping(self, msg: Ping, from_addr: str) -> None:
        if msg.target and msg.target != self.name:
            self.stats["wrong_target"] += 1
            return
        if msg.stream_reply_addr:
            # Answered both ways: the prober fell back to a stream because a ping or an ack was
            # lost, so a datagram ack probably gets through this time and is the faster one,
            # while the stream ack survives loss (late, when a segment has to be resent). The
            # stream ack carries no gossip, so that it stays small whatever is queued.
            self.stats["stream_acks_out"] += 1
            self._out.append(SendStream(msg.stream_reply_addr, self.codec.encode([Ack(msg.seq)])))
        if from_addr:
            self._send(from_addr, [Ack(msg.seq)])
        else:
            self.stats["unroutable"] += 1

    def _on_indirect(self, msg: IndirectPing, from_addr: str, now: float) -> None:
        if self.table.leaving:
            return
        if not from_addr:  # came over a stream without a ping naming its sender
            self.stats["unroutable"] += 1
            return
        seq = self._next_seq()
        self._relays[seq] = Relay(from_addr, msg.seq, msg.nack)
        wait = self.config.probe_timeout_s * (self.config.nack_timeout_ratio if msg.nack else 1.0)
        heapq.heappush(self._relay_timers, (now + wait, seq))
        self.stats["relays"] += 1
        self._send(msg.target_addr, [Ping(seq, msg.target, self.name)])

    def _on_ack(self, msg: Ack, now: float, stream: bool) -> None:
        probe = self._probe
        if probe is not None and msg.seq == probe.seq:
            if stream:
                # memberlist warns here: datagrams to this member fail while TCP gets through.
                self.stats["stream_ping_saves"] += 1
            self._probe = None
            self._next_probe = max(probe.start + self.config.probe_interval_s, now)
            if self.config.lifeguard:
                self.table.awareness.apply(-1)
            return
        relay = self._relays.pop(msg.seq, None)
        if relay is not None:
            self._send(relay.requester, [Ack(relay.seq)])
        else:
            self.stats["late_acks"] += 1

    def _on_nack(self, msg: Nack) -> None:
        probe = self._probe
        if probe is not None and msg.seq == probe.seq:
            probe.nacks += 1

    def _on_suspect(self, msg: Suspect, from_addr: str, now: float) -> None:
        if self.table.on_suspect(msg, now) and from_addr:
            me = self.table.me
            self._send(from_addr, [Alive(me.incarnation, me.name, me.addr, me.meta)])

    def _on_push_pull(self, msg: PushPull, now: float) -> None:
        self.stats["push_pulls_in"] += 1
        if self.table.merge(msg, now):
            # The membership is changing (joins, a healed partition): the long, N-scaled
            # anti-entropy period is for a quiet cluster, so sync again within the base one.
            soon = now + (0.5 + 0.5 * self.rng.random()) * self.config.push_pull_interval_s
            self._next_push_pull = min(self._next_push_pull, soon)
        if msg.reply and msg.source != self.name:
            self._stream(msg.source_addr, join=False, reply=False)

    # ------------------------------------------------------------ periodic work

    def _run_probe(self, now: float) -> None:
        cfg = self.config
        probe = self._probe
        if probe is not None:
            if not probe.indirect_sent and now >= probe.timeout_at:
                probe.indirect_sent = True
                helpers = self.table.random_members(cfg.indirect_checks, now, exclude=probe.target.name)
                nack = cfg.lifeguard
                msg = IndirectPing(probe.seq, probe.target.name, probe.target.addr, nack)
                for helper in helpers:
                    self._send(helper.addr, [msg])
                probe.expected_nacks = len(helpers) if nack else 0
                self.stats["indirect_probes"] += 1
                if cfg.tcp_pings:
                    self._stream_ping(probe)
            if now < probe.deadline:
                return
            self._probe = None
            self._next_probe = probe.deadline
            self.stats["probe_failures"] += 1
            if cfg.lifeguard:
                missed = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
                self.table.awareness.apply(max(missed, 0))
            target = probe.target
            if self.table.members.get(target.name) is target:
                self.table.on_suspect(Suspect(probe.incarnation, target.name, self.name), now)
        if self._probe is not None or now < self._next_probe or self.table.leaving:
            return
        target_or_none = self.table.next_probe_target(now)
        if target_or_none is None:
            self._next_probe = now + cfg.probe_interval_s
            return
        target = target_or_none
        seq = self._next_seq()
        interval = self.table.awareness.scale(cfg.probe_interval_s)
        self._probe = Probe(target, target.incarnation, seq, now, now + cfg.probe_timeout_s, now + interval)
        self.stats["probes"] += 1
        self._send(target.addr, self._probe_messages(Ping(seq, target.name, self.name), target))

    def _probe_messages(self, ping: Ping, target: Member) -> list[Message]:
        msgs: list[Message] = [ping]
        if self.config.lifeguard and target.state is State.SUSPECT:
            msgs.append(Suspect(target.incarnation, target.name, self.name))
        return msgs

    def _stream_ping(self, probe: Probe) -> None:
        """The TCP fallback probe, with the same seq so that its ack ends the round. The buddy
        suspect rides along: over a stream it reaches a suspect whose datagrams are lost."""
        target = probe.target
        ping = Ping(probe.seq, target.name, self.name, self.addr)
        self.stats["stream_pings"] += 1
        self._out.append(SendStream(target.addr, self.codec.encode(self._probe_messages(ping, target))))

    def _expire_relays(self, now: float) -> None:
        timers = self._relay_timers
        while timers and timers[0][0] <= now:
            _, seq = heapq.heappop(timers)
            relay = self._relays.pop(seq, None)
            if relay is not None and relay.nack:
                self.stats["nacks_sent"] += 1
                self._send(relay.requester, [Nack(relay.seq)])

    def _gossip(self, now: float) -> None:
        table = self.table
        if table.queue:
            for m in table.random_members(self.config.gossip_nodes, now, live_only=False):
                if not table.queue:
                    break
                self._send(m.addr, [])
        step = self.config.gossip_interval_s
        self._next_gossip = now + step if table.queue else _INF

    def _push_pull(self, now: float) -> None:
        cfg = self.config
        self._next_push_pull = now + push_pull_scale(cfg.push_pull_interval_s, self.table.live)
        if self.table.leaving:
            return
        partner = self.table.push_pull_partner()
        if partner is not None:
            self._stream(partner.addr, join=False, reply=True)

    def _send_join(self) -> None:
        for seed in self._seeds:
            self._stream(seed, join=True, reply=True)

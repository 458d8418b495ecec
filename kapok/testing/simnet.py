"""A discrete-event network for many ``Swim`` instances in one process (fake clock).

Every node is a real ``Swim`` state machine; every datagram between them is a real encoded,
authenticated packet that goes through the codec. Time is a number in a heap of events: a
packet arrival, a node's ``tick`` at its ``next_deadline()``, or a scripted action (crash,
partition, join). The network model:

* per-packet one-way delay drawn uniformly from ``[delay_min_s, delay_max_s]``;
* uniform packet loss ``loss`` (both directions, every link), with per-link overrides;
* partitions: nodes carry a group number and packets and streams between different
  groups are dropped while a partition is in force;
* slow ("starved") nodes read every packet ``slow_delay_s`` late (uniform in the range);
* streams (push-pull, the TCP fallback ping and its ack) are TCP: never lost unless the
  peer is down or partitioned away (checked when the stream is opened), and they take three
  one-way delays (connection set-up and transfer). By default packet loss does not touch
  them. With retransmission timeouts set (``syn_rto_s``, ``data_rto_s``; Linux's come
  from ``Network.with_linux_rto()``), loss makes them late instead: each of the SYN, the
  SYN-ACK and the blob is lost with the link's loss rate, and a loss costs a timeout,
  doubled on every further loss of the same segment. One data segment stands for the
  whole blob, since fast retransmit repairs most losses in a longer transfer within a
  round trip. A segment lost on seven tries in a row drops the stream (the connection
  times out).

Everything is seeded, so a run is a pure function of its seed: ``trace_hash`` digests every
delivered packet and state change to prove it.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kapok.cluster.codec import Codec, KeyRing
from kapok.cluster.config import SwimConfig
from kapok.cluster.messages import (
    Effect,
    MemberChanged,
    NodeMeta,
    NodeState,
    PushPull,
    Send,
    SendStream,
    State,
)
from kapok.cluster.swim import Swim

__all__ = ["Network", "SimNode", "Simulator"]

_TICK, _PACKET, _STREAM, _ACTION = 0, 1, 2, 3
_TCP_RETRIES = 6  # Linux tcp_syn_retries: a segment lost this many more times drops the stream


@dataclass(slots=True)
class Network:
    loss: float = 0.0
    delay_min_s: float = 0.001
    delay_max_s: float = 0.003
    slow_delay_s: tuple[float, float] = (0.5, 2.5)
    # Streams' retransmission timeouts, doubled per retry; 0 (the default): loss spares streams.
    syn_rto_s: float = 0.0  # a lost SYN or SYN-ACK is sent again after this
    data_rto_s: float = 0.0  # a lost data segment is sent again after this

    def with_linux_rto(self) -> Network:
        """The same network, with Linux's 1 s initial (handshake) and 200 ms minimum (data) RTO."""
        return replace(self, syn_rto_s=1.0, data_rto_s=0.2)


class SimNode:
    __slots__ = (
        "addr",
        "bytes_sent",
        "group",
        "index",
        "name",
        "packets_sent",
        "slow",
        "swim",
        "tick_at",
        "up",
    )

    def __init__(self, index: int, swim: Swim) -> None:
        self.index = index
        self.swim = swim
        self.name = swim.name
        self.addr = swim.addr
        self.up = True
        self.slow = False
        self.group = 0
        self.tick_at = math.inf
        self.packets_sent = 0
        self.bytes_sent = 0


ChangeObserver = Callable[[SimNode, MemberChanged, float], None]


class Simulator:
    def __init__(
        self,
        config: SwimConfig,
        seed: int,
        network: Network | None = None,
        *,
        secret: str = "sim-secret",
        trace: bool = False,
    ) -> None:
        self.config = config
        self.seed = seed
        self.net = network or Network()
        self.rng = random.Random(seed)
        self.codec = Codec(KeyRing.from_secret(secret), config.max_packet_bytes)
        self.nodes: list[SimNode] = []
        self.by_addr: dict[str, SimNode] = {}
        self.by_name: dict[str, SimNode] = {}
        self.now = 0.0
        self.partitioned = False
        self.link_loss: dict[tuple[int, int], float] = {}
        self.observers: list[ChangeObserver] = []
        self.events = 0
        self.packets = 0
        self.max_packet = 0
        self.streams = 0
        self.streams_retransmitted = 0
        self.stream_bytes = 0
        self._heap: list[tuple[float, int, int, int, object, str]] = []
        self._seq = 0
        self._trace = hashlib.blake2b(digest_size=16) if trace else None

    # ------------------------------------------------------------ building the cluster

    def add_node(
        self, *, secret: str | None = None, config: SwimConfig | None = None, name: str = ""
    ) -> SimNode:
        i = len(self.nodes)
        name = name or f"node-{i}"
        addr = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}:7946"
        meta = NodeMeta(name, f"http://{addr.split(':')[0]}:8011", "master", None, "sim", 0.0)
        cfg = config or self.config
        codec = self.codec if secret is None else Codec(KeyRing.from_secret(secret), cfg.max_packet_bytes)
        swim = Swim(name, addr, meta, cfg, random.Random(self.rng.getrandbits(64)), codec=codec)
        node = SimNode(i, swim)
        self.nodes.append(node)
        self.by_addr[addr] = node
        self.by_name[name] = node
        return node

    def bootstrap(self, nodes: Sequence[SimNode]) -> None:
        """Give every node of ``nodes`` a full, alive view of all of them (a formed cluster)."""
        states = tuple(NodeState(n.name, n.addr, 0, State.ALIVE, n.swim.table.me.meta) for n in nodes)
        sync = PushPull("", "", False, False, states)
        for node in nodes:
            node.swim.handle_packet([sync], "", self.now)
            self._schedule(node)

    def join(self, node: SimNode, seeds: Sequence[SimNode]) -> None:
        self._apply(node, node.swim.join([s.addr for s in seeds], self.now))

    def leave(self, node: SimNode) -> None:
        self._apply(node, node.swim.leave(self.now))

    def start(self, node: SimNode) -> None:
        self._apply(node, node.swim.tick(self.now))

    # ------------------------------------------------------------ faults

    def crash(self, node: SimNode) -> None:
        node.up = False

    def restart(self, node: SimNode, seeds: Sequence[SimNode]) -> None:
        """Bring a crashed node back as a fresh process: same name and address, incarnation 0."""
        old = node.swim
        node.swim = Swim(
            old.name,
            old.addr,
            old.table.me.meta,
            old.config,
            random.Random(self.rng.getrandbits(64)),
            codec=old.codec,
        )
        node.up = True
        node.tick_at = math.inf
        self.join(node, seeds)

    def set_partition(self, groups: dict[int, int] | None) -> None:
        """``{node index: group}``; ``None`` heals (everyone back in group 0)."""
        for node in self.nodes:
            node.group = 0 if groups is None else groups.get(node.index, 0)
        self.partitioned = groups is not None

    # ------------------------------------------------------------ running

    def at(self, when: float, action: Callable[[], None]) -> None:
        self._push(when, _ACTION, -1, action, "")

    def run_until(self, end: float, stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        nodes = self.nodes
        pop = heapq.heappop
        while heap and heap[0][0] <= end:
            when, _, kind, index, data, src = pop(heap)
            self.now = when
            self.events += 1
            if kind == _ACTION:
                data()  # type: ignore[operator]
                if stop is not None and stop():
                    return
                continue
            node = nodes[index]
            if not node.up:
                continue
            if kind == _TICK:
                if when != node.tick_at:
                    continue
                node.tick_at = math.inf
                effects = node.swim.tick(when)
            elif kind == _PACKET:
                if self._trace is not None:
                    self._trace.update(data)  # type: ignore[arg-type]
                effects = node.swim.handle_packet(data, src, when)  # type: ignore[arg-type]
            else:
                effects = node.swim.handle_stream(data, when)  # type: ignore[arg-type]
            self._apply(node, effects)
            if stop is not None and effects and stop():
                return
        self.now = max(self.now, end)

    def _apply(self, node: SimNode, effects: list[Effect]) -> None:
        for e in effects:
            if type(e) is Send:
                self._send(node, e.addr, e.data)
            elif type(e) is SendStream:
                self._stream(node, e.addr, e.data)
            elif type(e) is MemberChanged:
                if self._trace is not None:
                    self._trace.update(f"{self.now:.6f}|{node.index}|{e.name}|{e.state}".encode())
                for obs in self.observers:
                    obs(node, e, self.now)
        self._schedule(node)

    def _schedule(self, node: SimNode) -> None:
        deadline = node.swim.next_deadline()
        if deadline < node.tick_at:
            deadline = max(deadline, self.now)
            node.tick_at = deadline
            self._push(deadline, _TICK, node.index, None, "")

    def _push(self, when: float, kind: int, index: int, data: object, src: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, index, data, src))

    def _send(self, src: SimNode, addr: str, data: bytes) -> None:
        src.packets_sent += 1
        src.bytes_sent += len(data)
        self.packets += 1
        if len(data) > self.max_packet:
            self.max_packet = len(data)
        dst = self.by_addr.get(addr)
        if dst is None or not dst.up or (self.partitioned and dst.group != src.group):
            return
        net = self.net
        rnd = self.rng.random
        loss = self.link_loss.get((src.index, dst.index), net.loss) if self.link_loss else net.loss
        if loss and rnd() < loss:
            return
        delay = net.delay_min_s + rnd() * (net.delay_max_s - net.delay_min_s)
        if dst.slow:
            lo, hi = net.slow_delay_s
            delay += lo + rnd() * (hi - lo)
        self._push(self.now + delay, _PACKET, dst.index, data, src.addr)

    def _stream(self, src: SimNode, addr: str, data: bytes) -> None:
        self.streams += 1
        self.stream_bytes += len(data)
        dst = self.by_addr.get(addr)
        if dst is None or not dst.up or (self.partitioned and dst.group != src.group):
            return
        net = self.net
        rnd = self.rng.random
        delay = 3 * (net.delay_min_s + rnd() * (net.delay_max_s - net.delay_min_s))
        fwd = back = net.loss
        if self.link_loss:
            fwd = self.link_loss.get((src.index, dst.index), fwd)
            back = self.link_loss.get((dst.index, src.index), back)
        if (fwd or back) and (net.syn_rto_s or net.data_rto_s):
            late = 0.0
            for loss, rto in ((fwd, net.syn_rto_s), (back, net.syn_rto_s), (fwd, net.data_rto_s)):
                tries = 0
                while rnd() < loss:
                    tries += 1
                    if tries > _TCP_RETRIES:
                        return  # the connection times out
                    late += rto
                    rto *= 2
            if late:
                self.streams_retransmitted += 1
                delay += late
        if dst.slow:
            lo, hi = net.slow_delay_s
            delay += lo + rnd() * (hi - lo)
        self._push(self.now + delay, _STREAM, dst.index, data, src.addr)

    # ------------------------------------------------------------ reading results

    @property
    def trace_hash(self) -> str:
        return self._trace.hexdigest() if self._trace is not None else ""

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes if n.up]

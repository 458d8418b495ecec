"""The member table: SWIM's rows and what is kept beside them (pure).

A ``Member`` is one row — address, incarnation, state, metadata, the suspicion running
against it — and keeps its push-pull entry encoded until the row changes. A ``MemberTable``
holds every row with the size estimate, the gossip queue, local health (Lifeguard's
awareness) and the suspicion timers, and answers what the protocol picks from it: the next
probe target in a shuffled round-robin order (rows dead or left for ``forget_dead_s`` are
forgotten as it reshuffles), random peers to gossip to, the push-pull and reconnect
partners, the snapshots. It changes a row's state and announces the change; which changes
to make — the incarnation rules — are ``Membership``'s, in ``membership.py``.
"""

from __future__ import annotations

import heapq
from collections import Counter

from kapok.cluster.broadcasts import TransmitQueue
from kapok.cluster.codec import Codec
from kapok.cluster.config import SwimConfig
from kapok.cluster.messages import Alive, Effect, MemberChanged, Message, NodeMeta, NodeState, Rng, State
from kapok.cluster.suspicion import Awareness, Suspicion

__all__ = ["Member", "MemberTable"]

ALIVE, SUSPECT, DEAD, LEFT = State.ALIVE, State.SUSPECT, State.DEAD, State.LEFT


class Member:
    __slots__ = ("_wire", "addr", "incarnation", "meta", "name", "state", "state_change", "suspicion")

    def __init__(self, name: str, addr: str, incarnation: int, meta: NodeMeta, now: float) -> None:
        self.name = name
        self.addr = addr
        self.incarnation = incarnation
        self.meta = meta
        self.state = ALIVE
        self.state_change = now
        self.suspicion: Suspicion | None = None
        self._wire: tuple[bytes, int, State, str, NodeMeta] | None = None

    def view(self) -> NodeState:
        return NodeState(self.name, self.addr, self.incarnation, self.state, self.meta)

    def wire(self, codec: Codec) -> bytes:
        """This row as a push-pull entry, encoded; re-encoded only after the row changed."""
        w = self._wire
        if (
            w is None
            or w[1] != self.incarnation
            or w[2] is not self.state
            or w[3] is not self.addr
            or w[4] is not self.meta
        ):
            data = codec.encode_state(self.name, self.addr, self.incarnation, self.state, self.meta)
            w = self._wire = (data, self.incarnation, self.state, self.addr, self.meta)
        return w[0]


class MemberTable:
    """The rows, the suspicion timers and the picks; ``Membership`` adds the rules."""

    def __init__(
        self,
        me: Member,
        config: SwimConfig,
        rng: Rng,
        codec: Codec,
        out: list[Effect],
        stats: Counter[str],
    ) -> None:
        self.name = me.name
        self.me = me
        self.config = config
        self.rng = rng
        self.codec = codec
        self.out = out
        self.stats = stats
        self.queue = TransmitQueue()
        self.awareness = Awareness(config.awareness_max_multiplier if config.lifeguard else 1)
        self.leaving = False
        self.members: dict[str, Member] = {me.name: me}
        self.live = 1  # alive + suspect rows, ourselves included: the size estimate n
        self._peers: list[Member] = []  # every row but ours, for random picks
        self._peer_pos: dict[str, int] = {}
        self._dead: dict[str, Member] = {}  # reconnect candidates
        self._probe_order: list[Member] = []
        self._probe_index = 0
        self._timers: list[tuple[float, int, Suspicion, str]] = []
        self._timer_seq = 0
        self.gossip(me.name, Alive(me.incarnation, me.name, me.addr, me.meta))

    # ------------------------------------------------------------ helpers

    def gossip(self, key: str, msg: Message) -> None:
        self.queue.push(key, self.codec.encode_message(msg))

    def _changed(self, m: Member, previous: State | None) -> None:
        self.out.append(MemberChanged(m.name, m.addr, m.state, m.incarnation, m.meta, previous))

    def _set_state(self, m: Member, state: State, now: float) -> None:
        was_live = m.state is ALIVE or m.state is SUSPECT
        is_live = state is ALIVE or state is SUSPECT
        self.live += is_live - was_live
        m.state = state
        m.state_change = now
        if state is not SUSPECT:
            m.suspicion = None
        if state is DEAD:
            self._dead[m.name] = m
        else:
            self._dead.pop(m.name, None)

    # ------------------------------------------------------------ suspicion timers

    def _arm(self, s: Suspicion, name: str) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (s.deadline, self._timer_seq, s, name))

    def _live_timer(self, entry: tuple[float, int, Suspicion, str]) -> bool:
        deadline, _, s, name = entry
        m = self.members.get(name)
        return m is not None and m.suspicion is s and s.deadline == deadline

    def next_expiry(self) -> float | None:
        timers = self._timers
        while timers and not self._live_timer(timers[0]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    # ------------------------------------------------------------ rows, picks, probe order

    def _add(self, m: Member) -> None:
        self.members[m.name] = m
        self.live += 1
        self._peer_pos[m.name] = len(self._peers)
        self._peers.append(m)
        # A newcomer goes to a random place in the probe order (SWIM's round-robin stays fair).
        self._probe_order.insert(self.rng.randrange(len(self._probe_order) + 1), m)
        self._changed(m, None)

    def _forget(self, m: Member) -> None:
        del self.members[m.name]
        self._dead.pop(m.name, None)
        pos = self._peer_pos.pop(m.name)
        last = self._peers.pop()
        if last is not m:
            self._peers[pos] = last
            self._peer_pos[last.name] = pos

    def next_probe_target(self, now: float) -> Member | None:
        """The next alive or suspect member in the shuffled round-robin order."""
        order = self._probe_order
        for _ in range(len(order) + 1):
            if self._probe_index >= len(order):
                self._reshuffle(now)
                order = self._probe_order
                if not order:
                    return None
            m = order[self._probe_index]
            self._probe_index += 1
            if (m.state is ALIVE or m.state is SUSPECT) and self.members.get(m.name) is m:
                return m
        return None

    def _reshuffle(self, now: float) -> None:
        horizon = now - self.config.forget_dead_s
        for m in self._peers[:]:
            if (m.state is DEAD or m.state is LEFT) and m.state_change < horizon:
                self._forget(m)
        order = list(self._peers)
        rng = self.rng
        for i in range(len(order) - 1, 0, -1):
            j = rng.randrange(i + 1)
            order[i], order[j] = order[j], order[i]
        self._probe_order = order
        self._probe_index = 0

    def random_members(self, k: int, now: float, exclude: str = "", live_only: bool = True) -> list[Member]:
        """Up to ``k`` distinct random peers: alive or suspect (with ``live_only``, alive only),
        plus members dead for less than ``gossip_to_dead_s`` when not ``live_only``."""
        peers = self._peers
        if not peers or k <= 0:
            return []
        picked: list[Member] = []
        dead_horizon = now - self.config.gossip_to_dead_s
        rng = self.rng
        for _ in range(3 * len(peers)):
            m = peers[rng.randrange(len(peers))]
            if m.name == exclude or m in picked:
                continue
            st = m.state
            if live_only:
                if st is not ALIVE:
                    continue
            elif st is LEFT or (st is DEAD and m.state_change < dead_horizon):
                continue
            picked.append(m)
            if len(picked) >= k:
                break
        return picked

    def push_pull_partner(self) -> Member | None:
        """A random alive member (memberlist's choice for periodic anti-entropy)."""
        picked = self.random_members(1, 0.0)
        return picked[0] if picked else None

    def reconnect_partner(self) -> Member | None:
        """A random dead member: if it is in fact reachable again, a push-pull heals the split."""
        if not self._dead:
            return None
        names = list(self._dead)
        return self._dead[names[self.rng.randrange(len(names))]]

    @property
    def peer_count(self) -> int:
        return len(self._peers)

    def snapshot(self) -> tuple[NodeState, ...]:
        return tuple(m.view() for m in self.members.values())

    def wire_snapshot(self) -> list[bytes]:
        codec = self.codec
        return [m.wire(codec) for m in self.members.values()]

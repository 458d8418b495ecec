"""The member table and its incarnation rules: SWIM's one state table (pure).

Theory of operation. Every node keeps one row per member it has heard of: address,
incarnation, state (alive, suspect, dead, left), metadata. Rows change only through three
messages — ``Alive``, ``Suspect``, ``Dead`` — whether they arrive piggybacked on probes,
in gossip, or as entries of a push-pull. Only a node raises its own incarnation, and it does
so to *refute*: whoever hears the higher number believes it over any older accusation. A
change that is news is queued for gossip (``TransmitQueue``), which spreads it epidemically.
Suspicion is Lifeguard's: the timer starts long and shortens as independent nodes confirm it
(``suspicion.py``); when it runs out the suspect is declared dead at the suspected
incarnation.

State table — a message about member X (``inc``) against our row for X (``known``):

================  ===========  ========================  =========================  ============
message           X unknown    X alive                   X suspect                  X dead/left
================  ===========  ========================  =========================  ============
Alive             add, gossip  inc > known: update,      inc > known: alive, stop   inc > known:
                               gossip                    timer, gossip              alive, gossip
Suspect           ignore       inc ≥ known: suspect,     inc = known: confirm (re-  ignore
                               start timer, gossip       gossip if new); inc >
                                                         known: fresh timer, gossip
Dead              ignore       inc ≥ known: dead (left if the source is X), gossip  ignore
timer runs out    —            —                         dead at the suspected inc  —
================  ===========  ========================  =========================  ============

Any message with ``inc < known`` is ignored. About ourselves: ``Alive`` with a smaller inc,
or the same inc, address and metadata, is ignored, otherwise we refute; ``Suspect`` and
``Dead`` with ``inc ≥ ours`` make us refute (``max(ours + 1, inc + 1)``, local health +1),
except once we are leaving; a ``Suspect`` with an older inc gets our current ``Alive`` sent
back to its sender (the accuser missed our refutation). An ``Alive`` from a new address is
refused unless X has left, or has been dead for ``dead_reclaim_s``; then it is taken at any
incarnation. Push-pull entries go through the same rules — alive as ``Alive``, left as a
leave, dead or suspect as a ``Suspect`` from us (a remote death is never applied directly);
merged news is re-gossiped only when it is the sender's own row (first-hand), or a
suspicion.
"""

from __future__ import annotations

import heapq
from collections import Counter

from kapok.cluster.broadcasts import TransmitQueue
from kapok.cluster.codec import Codec
from kapok.cluster.config import SwimConfig
from kapok.cluster.messages import (
    Alive,
    Dead,
    Effect,
    MemberChanged,
    Message,
    NodeMeta,
    NodeState,
    PushPull,
    Rng,
    State,
    Suspect,
)
from kapok.cluster.suspicion import Awareness, Suspicion, suspicion_k, suspicion_min_s

__all__ = ["Member", "Membership"]

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


class Membership:
    """Rows, rules and suspicion timers. Effects (``MemberChanged``) go to ``out``."""

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

    def refute(self, accused: int) -> None:
        me = self.me
        me.incarnation = max(me.incarnation + 1, accused + 1)
        self.awareness.apply(1)
        self.stats["refutes"] += 1
        self.gossip(me.name, Alive(me.incarnation, me.name, me.addr, me.meta))
        self._changed(me, ALIVE)

    def set_meta(self, meta: NodeMeta) -> None:
        me = self.me
        me.meta = meta
        me.incarnation += 1
        self.gossip(me.name, Alive(me.incarnation, me.name, me.addr, me.meta))
        self._changed(me, me.state)

    def leave(self, now: float) -> None:
        me = self.me
        if self.leaving:
            return
        self.leaving = True
        self._set_state(me, LEFT, now)
        self.gossip(me.name, Dead(me.incarnation, me.name, me.name))
        self._changed(me, ALIVE)

    # ------------------------------------------------------------ the rules

    def on_alive(self, msg: Alive, now: float, gossip: bool = True) -> None:
        m = self.members.get(msg.node)
        if m is None:
            if self.leaving:
                return
            self._add(Member(msg.node, msg.addr, msg.incarnation, msg.meta, now))
            if gossip:
                self.gossip(msg.node, msg)
            return
        if m is self.me:
            if msg.incarnation < m.incarnation or self.leaving:
                return
            if msg.incarnation == m.incarnation and msg.addr == m.addr and msg.meta == m.meta:
                return
            self.refute(msg.incarnation)
            return
        if msg.addr != m.addr:
            reclaim = m.state is LEFT or (
                m.state is DEAD and now - m.state_change >= self.config.dead_reclaim_s
            )
            if not reclaim:
                self.stats["addr_conflicts"] += 1
                return
        elif msg.incarnation <= m.incarnation:
            return
        previous = m.state
        m.incarnation = msg.incarnation
        m.addr = msg.addr
        m.meta = msg.meta
        if previous is not ALIVE:
            self._set_state(m, ALIVE, now)
        if gossip:
            self.gossip(msg.node, msg)
        self._changed(m, previous)

    def on_suspect(self, msg: Suspect, now: float) -> bool:
        """Apply a suspicion; True when it is an outdated accusation of ourselves."""
        m = self.members.get(msg.node)
        if m is None:
            return False
        if msg.incarnation < m.incarnation:
            return m is self.me and not self.leaving
        if m is self.me:
            if not self.leaving:
                self.refute(msg.incarnation)
            return False
        if m.state is SUSPECT:
            s = m.suspicion
            if s is not None and msg.incarnation == m.incarnation:
                if s.confirm(msg.source):
                    self._arm(s, m.name)
                    self.gossip(m.name, msg)
                return False
        elif m.state is not ALIVE:
            return False
        previous = m.state
        m.incarnation = msg.incarnation
        self._set_state(m, SUSPECT, now)
        n = self.live
        cfg = self.config
        low = suspicion_min_s(cfg.suspicion_mult, n, cfg.probe_interval_s)
        if cfg.lifeguard:
            k, high = suspicion_k(cfg.suspicion_mult, n), low * cfg.suspicion_max_timeout_mult
        else:
            k, high = 0, low
        m.suspicion = Suspicion(msg.source, msg.incarnation, now, k, low, high)
        self._arm(m.suspicion, m.name)
        self.stats["suspicions"] += 1
        self.gossip(m.name, msg)
        self._changed(m, previous)
        return False

    def on_dead(self, msg: Dead, now: float, gossip: bool = True) -> None:
        m = self.members.get(msg.node)
        if m is None or msg.incarnation < m.incarnation:
            return
        if m is self.me:
            if not self.leaving:
                self.refute(msg.incarnation)
            return
        if m.state is DEAD or m.state is LEFT:
            return
        previous = m.state
        m.incarnation = msg.incarnation
        self._set_state(m, LEFT if msg.source == msg.node else DEAD, now)
        if gossip:
            self.gossip(m.name, msg)
        self._changed(m, previous)

    def merge(self, pp: PushPull, now: float) -> int:
        """Apply a push-pull; returns how many members it brought into the live set (news of
        joins or of recoveries, which makes the next exchange come sooner)."""
        members = self.members
        live_before = self.live
        for st in pp.states:
            # Fast path: most entries of a push-pull are old news that every rule ignores.
            m = members.get(st.name)
            if m is not None and m is not self.me:
                if st.incarnation < m.incarnation:
                    continue
                if (
                    st.incarnation == m.incarnation
                    and st.state is m.state
                    and st.state is not SUSPECT
                    and st.addr == m.addr
                ):
                    continue
            first_hand = st.name == pp.source
            if st.state is ALIVE:
                self.on_alive(Alive(st.incarnation, st.name, st.addr, st.meta), now, first_hand)
            elif st.state is LEFT:
                self.on_dead(Dead(st.incarnation, st.name, st.name), now, first_hand)
            else:
                self.on_suspect(Suspect(st.incarnation, st.name, self.name), now)
        return max(self.live - live_before, 0)

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

    def expire(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            if self._live_timer(entry):
                self.stats["deaths_declared"] += 1
                self.on_dead(Dead(entry[2].incarnation, entry[3], self.name), now)

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

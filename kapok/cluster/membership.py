"""The member table and its incarnation rules: SWIM's one state table (pure).

Theory of operation. Every node keeps one row per member it has heard of: address,
incarnation, state (alive, suspect, dead, left), metadata. Rows change only through three
messages — ``Alive``, ``Suspect``, ``Dead`` — whether they arrive piggybacked on probes,
in gossip, or as entries of a push-pull. Only a node raises its own incarnation, and it does
so to *refute*: whoever hears the higher number believes it over any older accusation. A
change that is news is queued for gossip (``TransmitQueue``), which spreads it epidemically.
Suspicion is Lifeguard's: the timer starts long and shortens as independent nodes confirm it
(``suspicion.py``); when it runs out the suspect is declared dead at the suspected
incarnation. The rows these rules change, the suspicion timers and the picks from the
table are ``MemberTable``'s, in ``membertable.py``.

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

from kapok.cluster.membertable import Member, MemberTable
from kapok.cluster.messages import Alive, Dead, NodeMeta, PushPull, State, Suspect
from kapok.cluster.suspicion import Suspicion, suspicion_k, suspicion_min_s

__all__ = ["Membership"]

ALIVE, SUSPECT, DEAD, LEFT = State.ALIVE, State.SUSPECT, State.DEAD, State.LEFT


class Membership(MemberTable):
    """Rows, rules and suspicion timers. Effects (``MemberChanged``) go to ``out``."""

    # ------------------------------------------------------------ our own row

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

    # ------------------------------------------------------------ a suspicion timer runs out

    def expire(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            entry = heapq.heappop(timers)
            if self._live_timer(entry):
                self.stats["deaths_declared"] += 1
                self.on_dead(Dead(entry[2].incarnation, entry[3], self.name), now)

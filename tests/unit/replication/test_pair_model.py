"""The pair's rules run as a pair, on a manual clock: two nodes and a witness, each asking
``assess`` what to do every tick from the facts it can see, while a nemesis crashes, cuts,
isolates and pauses them. Invariants, checked at every tick:

* never two nodes of the pair active (leading and not in doubt) at the same instant;
* a node leads at an epoch only after its partner has learned of it or is unable to act;
* after the faults heal, exactly one node leads and the other follows it.

This is the rules' timing argument made executable: a leader fences at half the failover
timeout, its follower takes over only after the whole timeout, gossip takes ``DETECT_S`` to
call a silent node gone, and a frozen node decides nothing until it has heard again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kapok.replication.protocol import Action, Event, Facts, Role, assess, transition

TICK_S = 0.05
FAILOVER_S = 1.0
DETECT_S = 0.6  # gossip: a node unheard this long is no longer alive in the others' view
PROBE_TICKS = 4  # gossip: a node hears each peer (and its metadata) every 4 ticks


@dataclass
class _Node:
    name: str
    role: Role
    epoch: int = 1
    alone: bool = False
    in_sync: bool = True
    crashed: bool = False
    frozen: bool = False
    doubt_until: float = -1.0
    heard: dict[str, float] = field(default_factory=dict)  # gossip: peer -> last time heard
    seen: tuple[Role, int, bool] = (Role.FOLLOWER, 1, False)  # the partner's role, epoch, alone, as gossiped
    link_heard: float = 0.0  # the sync link: last frame from the partner
    confirmed_since_fence: bool = True

    @property
    def running(self) -> bool:
        return not (self.crashed or self.frozen)

    def active(self, now: float) -> bool:
        return self.running and self.role is Role.LEADER and now >= self.doubt_until


class _World:
    def __init__(self) -> None:
        self.now = 0.0
        self.a = _Node("a", Role.LEADER)
        self.b = _Node("b", Role.FOLLOWER)
        self.witness_up = True
        self.cut: set[frozenset[str]] = set()  # pairs of names that cannot reach each other
        self.link_cut = False
        self.overlaps = 0
        self.ticks = 0

    def reach(self, x: str, y: str) -> bool:
        return frozenset((x, y)) not in self.cut

    def partner(self, node: _Node) -> _Node:
        return self.b if node is self.a else self.a

    def step(self) -> None:
        self.now += TICK_S
        self.ticks += 1
        probing = self.ticks % PROBE_TICKS == 0
        nodes = (self.a, self.b)
        # Gossip and the link carry what running nodes send.
        for n in nodes:
            if not n.running:
                continue
            p = self.partner(n)
            if probing and p.running and self.reach(n.name, p.name):
                n.heard[p.name] = self.now
                n.seen = (p.role, p.epoch, p.alone)
                n.doubt_until = min(n.doubt_until, self.now)  # heard again: the doubt is over
            if probing and self.witness_up and self.reach(n.name, "w"):
                n.heard["w"] = self.now
            linked = p.running and not self.link_cut and self.reach(n.name, p.name)
            if linked and {n.role, p.role} >= {Role.FOLLOWER} and n.epoch == p.epoch:
                n.link_heard = self.now
                if n.role is Role.FOLLOWER:
                    n.in_sync = True
                if n.alone and n.role is Role.LEADER:
                    n.alone = False  # the follower holds its log again
        for n in nodes:
            if n.running:
                self._decide(n)
        if self.a.active(self.now) and self.b.active(self.now):
            self.overlaps += 1

    def _decide(self, n: _Node) -> None:
        p = self.partner(n)
        alive = {k for k, t in n.heard.items() if self.now - t < DETECT_S}
        role, epoch, alone = n.seen  # what gossip carried of it when last heard
        facts = Facts(
            role=n.role,
            epoch=n.epoch,
            paired=True,
            link_up=self.now - n.link_heard < TICK_S * 2,
            link_silent_s=self.now - n.link_heard,
            failover_timeout_s=FAILOVER_S,
            gossip=True,
            partner_alive=p.name in alive,
            partner_epoch=epoch,
            partner_active=p.name in alive and role is Role.LEADER,
            members_alive=1 + len(alive),
            members_total=3,
            in_sync=n.in_sync,
            partner_alone=p.name in alive and alone,
            alone=n.alone,
            partner_confirmed=p.name in alive or self.now - n.link_heard < TICK_S * 2,
            in_doubt=self.now < n.doubt_until,
        )
        action = assess(facts)
        if action is Action.TAKE_OVER:
            n.role, n.epoch = transition(n.role, Event.TAKE_OVER), max(n.epoch, p.epoch) + 1
        elif action is Action.STEP_DOWN:
            n.role, n.epoch, n.alone, n.in_sync = transition(n.role, Event.FOLLOW), p.epoch, False, False
        elif action is Action.FENCE:
            n.role, n.alone = transition(n.role, Event.FENCE), False
        elif action is Action.UNFENCE:
            n.role = transition(n.role, Event.UNFENCE)
        elif action is Action.GO_ALONE:
            n.alone = True
        elif action is Action.BACK_IN_SYNC:
            n.alone = False

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / TICK_S)):
            self.step()

    def thaw(self, n: _Node) -> None:
        """SIGCONT: its gossip view is as it was (everyone alive, the old roles), and its
        watchdog notices it ran late: it doubts until it hears its partner again."""
        n.frozen = False
        n.heard = dict.fromkeys(n.heard, self.now)
        n.doubt_until = self.now + FAILOVER_S

    def settled(self) -> bool:
        roles = sorted(n.role.value for n in (self.a, self.b) if n.running)
        return roles == ["follower", "leader"] and self.a.epoch == self.b.epoch


def _isolate(w: _World, name: str) -> None:
    w.cut = {frozenset((name, other)) for other in ("a", "b", "w") if other != name}


@pytest.mark.parametrize("who", ["a", "b"])
def test_an_isolated_node_never_overlaps_its_partner_and_the_heal_settles(who: str) -> None:
    w = _World()
    w.run(2.0)
    _isolate(w, who)
    w.run(5.0)
    assert w.overlaps == 0
    leader = w.b if who == "a" else w.a
    assert leader.role is Role.LEADER and leader.alone  # the majority side confirms alone
    w.cut = set()
    w.run(5.0)
    assert w.overlaps == 0 and w.settled()


def test_a_crashed_leader_is_replaced_once_and_the_new_one_confirms_alone() -> None:
    w = _World()
    w.run(2.0)
    w.a.crashed = True
    w.run(3.0)
    assert w.b.role is Role.LEADER and w.b.epoch == 2 and w.b.alone
    assert w.overlaps == 0


def test_a_paused_leader_wakes_in_doubt_and_steps_down_without_overlap() -> None:
    w = _World()
    w.run(2.0)
    w.a.frozen = True
    w.run(3 * FAILOVER_S)
    assert w.b.role is Role.LEADER
    w.thaw(w.a)
    w.run(5.0)
    assert w.overlaps == 0 and w.settled() and w.b.role is Role.LEADER


def test_a_cut_link_with_gossip_fine_changes_no_role() -> None:
    w = _World()
    w.run(2.0)
    w.link_cut = True
    w.run(5 * FAILOVER_S)
    assert (w.a.role, w.b.role, w.a.epoch) == (Role.LEADER, Role.FOLLOWER, 1)
    assert not w.a.alone  # gossip sees the follower: writes wait for it (sync refuses them)


def test_a_follower_that_was_not_in_sync_never_takes_over() -> None:
    w = _World()
    w.run(2.0)
    w.b.in_sync = False
    w.link_cut = True  # it cannot catch up
    w.a.crashed = True
    w.run(5 * FAILOVER_S)
    assert w.b.role is Role.FOLLOWER


def test_a_follower_whose_leader_went_alone_never_takes_over_on_its_return() -> None:
    w = _World()
    w.run(2.0)
    w.b.crashed = True
    w.run(3.0)
    assert w.a.alone
    w.b.crashed, w.b.in_sync = False, False  # back, not yet caught up
    w.link_cut = True
    w.run(3.0)
    w.a.crashed = True  # the leader dies before the follower caught up
    w.run(5 * FAILOVER_S)
    assert w.b.role is Role.FOLLOWER  # it waits for its master or an operator

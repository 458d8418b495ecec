"""Every incarnation rule of the member table (membership.py's state table), by direct calls.

Messages are handed to ``Swim.handle_packet`` already decoded, as the driver would after the
codec, so each test reads: a row in some state, one message, the row afterwards, and what was
queued for gossip or sent.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kapok.cluster.codec import Codec
from kapok.cluster.config import LAN
from kapok.cluster.messages import (
    Alive,
    Dead,
    Effect,
    MemberChanged,
    Message,
    NodeMeta,
    NodeState,
    PushPull,
    Send,
    State,
    Suspect,
)
from kapok.cluster.suspicion import suspicion_min_s
from kapok.cluster.swim import Swim

ALIVE, SUSPECT, DEAD, LEFT = State.ALIVE, State.SUSPECT, State.DEAD, State.LEFT


def meta(name: str, **kw: object) -> NodeMeta:
    return NodeMeta(name, f"http://{name}:8011", **kw)  # type: ignore[arg-type]


def node(name: str = "me", **kw: object) -> Swim:
    swim = Swim(name, f"{name}:7946", meta(name), kw.pop("config", LAN), random.Random(1), **kw)  # type: ignore[arg-type]
    swim.tick(0.0)
    return swim


def alive(name: str, inc: int, addr: str | None = None, **kw: object) -> Alive:
    return Alive(inc, name, addr or f"{name}:7946", meta(name, **kw))


def feed(swim: Swim, *msgs: Message, now: float = 1.0, sender: str = "x:7946") -> list[Effect]:
    return swim.handle_packet(list(msgs), sender, now)


def row(swim: Swim, name: str) -> tuple[State, int] | None:
    st = swim.member(name)
    return None if st is None else (st.state, st.incarnation)


def queued(swim: Swim, name: str) -> bool:
    return name in swim.table.queue


def with_peers(*names: str, **kw: object) -> Swim:
    swim = node("me", **kw)
    feed(swim, *(alive(n, 1) for n in names), now=0.5)
    swim.table.queue.clear()
    return swim


# ---------------------------------------------------------------- Alive


def test_alive_about_a_stranger_adds_it_and_gossips() -> None:
    swim = node()
    effects = feed(swim, alive("b", 5))
    assert row(swim, "b") == (ALIVE, 5)
    assert queued(swim, "b")
    assert MemberChanged("b", "b:7946", ALIVE, 5, meta("b"), None) in effects


@pytest.mark.parametrize("inc", [0, 1])
def test_alive_at_the_same_or_older_incarnation_is_ignored(inc: int) -> None:
    swim = with_peers("b")
    assert feed(swim, alive("b", inc, role="slave")) == []
    assert swim.member("b").meta.role == "master"  # type: ignore[union-attr]
    assert not queued(swim, "b")


def test_alive_with_a_higher_incarnation_updates_metadata() -> None:
    swim = with_peers("b")
    feed(swim, alive("b", 2, role="slave", load=3.5))
    st = swim.member("b")
    assert st is not None and (st.incarnation, st.meta.role, st.meta.load) == (2, "slave", 3.5)
    assert queued(swim, "b")


def test_suspect_is_cleared_only_by_a_strictly_higher_alive() -> None:
    swim = with_peers("b", "c")
    feed(swim, Suspect(1, "b", "c"))
    feed(swim, alive("b", 1))
    assert row(swim, "b") == (SUSPECT, 1)
    feed(swim, alive("b", 2))
    assert row(swim, "b") == (ALIVE, 2)
    assert swim.table.next_expiry() is None  # the suspicion timer is gone
    swim.tick(1000.0)
    assert row(swim, "b") == (ALIVE, 2)


def test_dead_or_left_member_comes_back_only_with_a_higher_incarnation() -> None:
    swim = with_peers("b", "c")
    feed(swim, Dead(1, "b", "c"), Dead(1, "c", "c"))
    feed(swim, alive("b", 1), alive("c", 1))
    assert (row(swim, "b"), row(swim, "c")) == ((DEAD, 1), (LEFT, 1))
    feed(swim, alive("b", 2), alive("c", 2))
    assert (row(swim, "b"), row(swim, "c")) == ((ALIVE, 2), (ALIVE, 2))


# ---------------------------------------------------------------- Suspect


def test_suspect_about_a_stranger_is_ignored() -> None:
    swim = node()
    assert feed(swim, Suspect(3, "ghost", "c")) == []
    assert swim.member("ghost") is None


def test_suspect_with_an_older_incarnation_is_ignored() -> None:
    swim = with_peers("b")
    feed(swim, alive("b", 4))
    feed(swim, Suspect(3, "b", "c"))
    assert row(swim, "b") == (ALIVE, 4)


def test_suspect_starts_a_lifeguard_timer_at_the_maximum() -> None:
    swim = with_peers(*"bcdefghij")  # n = 10: min 4 s, max 24 s, k = 2
    feed(swim, Suspect(1, "b", "c"), now=10.0)
    assert row(swim, "b") == (SUSPECT, 1)
    assert queued(swim, "b")
    assert swim.table.next_expiry() == pytest.approx(34.0)


def test_independent_confirmations_shorten_the_timer_and_are_regossiped() -> None:
    swim = with_peers(*"bcdefghij")
    feed(swim, Suspect(1, "b", "c"), now=10.0)
    swim.table.queue.clear()
    feed(swim, Suspect(1, "b", "c"), now=11.0)  # the accuser again: not a confirmation
    assert not queued(swim, "b")
    feed(swim, Suspect(1, "b", "d"), now=11.0)
    assert queued(swim, "b")
    first = swim.table.next_expiry()
    assert first is not None and first < 34.0
    feed(swim, Suspect(1, "b", "e"), now=12.0)
    assert swim.table.next_expiry() == pytest.approx(14.0)  # k reached: the 4 s minimum


def test_suspect_at_a_higher_incarnation_restarts_the_timer() -> None:
    swim = with_peers(*"bcdefghij")
    feed(swim, Suspect(1, "b", "c"), now=10.0)
    feed(swim, Suspect(1, "b", "d"), Suspect(1, "b", "e"), now=10.0)  # deadline 14
    feed(swim, Suspect(2, "b", "c"), now=13.0)  # b refuted (we missed it) and was suspected again
    assert row(swim, "b") == (SUSPECT, 2)
    swim.tick(14.5)  # the old timer must not kill b
    assert row(swim, "b") == (SUSPECT, 2)
    assert swim.table.next_expiry() == pytest.approx(13.0 + 24.0)


def test_timer_expiry_declares_dead_at_the_suspected_incarnation() -> None:
    swim = with_peers("b", "c")  # n = 3: k = 0, so the 4 s minimum at once
    feed(swim, Suspect(1, "b", "c"), now=10.0)
    swim.table.queue.clear()
    assert swim.next_deadline() <= 14.0
    changes = [e for e in swim.tick(14.0) if isinstance(e, MemberChanged)]
    assert row(swim, "b") == (DEAD, 1)
    assert [(c.name, c.state, c.previous) for c in changes] == [("b", DEAD, SUSPECT)]
    assert queued(swim, "b")
    assert swim.stats["deaths_declared"] == 1


def test_suspect_about_a_dead_member_is_ignored() -> None:
    swim = with_peers("b", "c")
    feed(swim, Dead(1, "b", "c"))
    feed(swim, Suspect(1, "b", "c"), Suspect(2, "b", "c"))
    assert row(swim, "b") == (DEAD, 1)


# ---------------------------------------------------------------- Dead


def test_dead_marks_dead_and_source_equal_node_marks_left() -> None:
    swim = with_peers("b", "c")
    effects = feed(swim, Dead(1, "b", "c"), Dead(1, "c", "c"))
    assert (row(swim, "b"), row(swim, "c")) == ((DEAD, 1), (LEFT, 1))
    assert queued(swim, "b") and queued(swim, "c")
    assert {(e.name, e.state) for e in effects if isinstance(e, MemberChanged)} == {("b", DEAD), ("c", LEFT)}


def test_dead_with_an_older_incarnation_is_ignored() -> None:
    swim = with_peers("b")
    feed(swim, alive("b", 3))
    feed(swim, Dead(2, "b", "c"))
    assert row(swim, "b") == (ALIVE, 3)


def test_dead_is_final_for_its_incarnation() -> None:
    swim = with_peers("b", "c")
    feed(swim, Dead(1, "b", "c"))
    swim.table.queue.clear()
    assert feed(swim, Dead(1, "b", "b"), Dead(5, "b", "c")) == []  # already dead: ignored
    assert row(swim, "b") == (DEAD, 1)
    assert not queued(swim, "b")


def test_dead_applies_to_a_suspect_at_the_same_incarnation() -> None:
    swim = with_peers("b", "c")
    feed(swim, Suspect(1, "b", "c"), Dead(1, "b", "c"))
    assert row(swim, "b") == (DEAD, 1)
    assert swim.table.next_expiry() is None


# ---------------------------------------------------------------- about ourselves


def test_suspicion_of_ourselves_is_refuted_with_a_higher_incarnation() -> None:
    swim = with_peers("b")
    assert swim.incarnation == 0
    feed(swim, Suspect(0, "me", "b"))
    assert swim.incarnation == 1
    assert queued(swim, "me")
    assert swim.awareness == 1  # refuting costs local health
    feed(swim, Suspect(7, "me", "b"))  # accused at a higher number than ours: jump past it
    assert swim.incarnation == 8
    assert swim.stats["refutes"] == 2


def test_death_of_ourselves_is_refuted() -> None:
    swim = with_peers("b")
    feed(swim, Dead(0, "me", "b"))
    assert row(swim, "me") == (ALIVE, 1)


def test_outdated_accusation_gets_our_alive_sent_straight_back() -> None:
    swim = with_peers("b")
    feed(swim, Suspect(0, "me", "b"))  # incarnation 1 now
    swim.table.queue.clear()
    effects = feed(swim, Suspect(0, "me", "b"), sender="b:7946")
    assert swim.incarnation == 1  # no new refutation
    sends = [e for e in effects if isinstance(e, Send)]
    assert [s.addr for s in sends] == ["b:7946"]
    assert Alive(1, "me", "me:7946", meta("me")) in swim.codec.decode(sends[0].data)  # type: ignore[operator]


def test_alive_about_ourselves() -> None:
    swim = node()
    feed(swim, Suspect(2, "me", "b"))  # incarnation 3
    feed(swim, alive("me", 2))  # older: ignored
    feed(swim, alive("me", 3))  # our own alive echoed back: ignored
    assert swim.incarnation == 3
    feed(swim, alive("me", 3, role="slave"))  # same number, other metadata: someone is confused
    assert swim.incarnation == 4
    feed(swim, alive("me", 9))  # a previous life of ours: jump past it
    assert swim.incarnation == 10
    assert swim.member("me").meta == meta("me")  # type: ignore[union-attr]


def test_a_leaving_node_refutes_nothing() -> None:
    swim = with_peers("b")
    swim.leave(1.0)
    feed(swim, Suspect(0, "me", "b"), Dead(0, "me", "b"), alive("me", 5))
    assert row(swim, "me") == (LEFT, 0)


def test_rejoin_after_leave_refutes_the_left_row() -> None:
    swim = node(incarnation=0)  # restarted after a leave at incarnation 4
    feed(swim, PushPull("b", "b:7946", False, False, (NodeState("me", "me:7946", 4, LEFT, meta("me")),)))
    assert row(swim, "me") == (ALIVE, 5)


# ---------------------------------------------------------------- addresses


def test_alive_from_a_new_address_is_refused_while_the_member_lives() -> None:
    swim = with_peers("b")
    feed(swim, alive("b", 9, addr="elsewhere:1"))
    assert swim.member("b").addr == "b:7946"  # type: ignore[union-attr]
    assert swim.stats["addr_conflicts"] == 1


def test_left_member_may_come_back_from_a_new_address_at_any_incarnation() -> None:
    swim = with_peers("b")
    feed(swim, Dead(1, "b", "b"))
    feed(swim, alive("b", 0, addr="new:1"))
    st = swim.member("b")
    assert st is not None and (st.state, st.addr, st.incarnation) == (ALIVE, "new:1", 0)


def test_dead_member_reclaimable_from_a_new_address_after_dead_reclaim_s() -> None:
    swim = with_peers("b", "c")
    feed(swim, Dead(1, "b", "c"), now=10.0)
    feed(swim, alive("b", 5, addr="new:1"), now=10.0 + LAN.dead_reclaim_s - 1)
    assert row(swim, "b") == (DEAD, 1)
    feed(swim, alive("b", 0, addr="new:1"), now=10.0 + LAN.dead_reclaim_s)
    assert row(swim, "b") == (ALIVE, 0)


# ---------------------------------------------------------------- push-pull merge


def _sync(*rows: NodeState, source: str = "z") -> PushPull:
    return PushPull(source, f"{source}:7946", False, False, rows)


def test_merge_downgrades_a_remote_death_to_a_suspicion() -> None:
    swim = with_peers("b", "c")
    feed(swim, _sync(NodeState("b", "b:7946", 1, DEAD, meta("b"))))
    assert row(swim, "b") == (SUSPECT, 1)


def test_merge_applies_left_and_newer_alive() -> None:
    swim = with_peers("b", "c")
    feed(
        swim,
        _sync(NodeState("b", "b:7946", 1, LEFT, meta("b")), NodeState("c", "c:7946", 2, ALIVE, meta("c"))),
    )
    assert (row(swim, "b"), row(swim, "c")) == ((LEFT, 1), (ALIVE, 2))


def test_merge_ignores_deaths_of_strangers_and_only_regossips_first_hand_rows() -> None:
    swim = node()
    feed(
        swim,
        _sync(
            NodeState("ghost", "g:1", 3, DEAD, meta("ghost")),
            NodeState("b", "b:7946", 1, ALIVE, meta("b")),
            NodeState("z", "z:7946", 1, ALIVE, meta("z")),
            source="z",
        ),
    )
    assert swim.member("ghost") is None
    assert row(swim, "b") == (ALIVE, 1) and not queued(swim, "b")
    assert row(swim, "z") == (ALIVE, 1) and queued(swim, "z")


def test_merge_with_our_own_death_refutes() -> None:
    swim = with_peers("b")
    feed(swim, _sync(NodeState("me", "me:7946", 0, DEAD, meta("me"))))
    assert row(swim, "me") == (ALIVE, 1)


# ---------------------------------------------------------------- plain SWIM


def test_without_lifeguard_suspicion_waits_the_minimum_and_awareness_stays_zero() -> None:
    cfg = replace(LAN, lifeguard=False)
    swim = with_peers(*"bcdefghij", config=cfg)
    feed(swim, Suspect(1, "b", "c"), now=10.0)
    assert swim.table.next_expiry() == pytest.approx(10.0 + suspicion_min_s(4, 10, 1.0))
    feed(swim, Suspect(0, "me", "c"))
    assert swim.awareness == 0


def test_metadata_update_is_a_new_incarnation() -> None:
    swim = with_peers("b")
    effects = swim.set_meta(meta("me", load=0.7), 2.0)
    assert swim.incarnation == 1 and queued(swim, "me")
    assert any(isinstance(e, MemberChanged) and e.meta.load == 0.7 for e in effects)
    with pytest.raises(ValueError):
        swim.set_meta(meta("someone-else"), 2.0)


def test_codec_is_shared_not_required() -> None:
    swim = node(codec=Codec())
    assert not swim.codec.keyring

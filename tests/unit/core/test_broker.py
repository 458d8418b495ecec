"""Scenario tests of the pure broker core: topics, groups, deliveries, acks and their timers.

Time is always an argument; every test drives the broker with explicit
``now`` values and reads what it decided through ``take_pushes()`` and
friends. Auto-ack consumers have no ack deadline (the network driver acks
them after the socket write), so the tests ack them too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from kapok.config import Config, FrozenMap, MqConfig, TopicOverride
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.codes import CodeMaker, code_prefix, code_seq, make_code
from kapok.core.consumers import Consumer
from kapok.core.model import Entry, Message, Status
from kapok.core.topics import DEFAULT_GROUP, Group
from kapok.errors import (
    BadRequestError,
    KapokError,
    MessageTooLargeError,
    NotFoundError,
    QueueFullError,
    RateLimitedError,
    SubscriptionError,
)

T0 = 1_700_000_000.0  # a realistic unix time
PUBSUB = "news"  # configured as a pub/sub topic in ``make``


def mq(**kw: Any) -> MqConfig:
    topics = kw.pop("topics", {})
    topics = {PUBSUB: TopicOverride(push_type=2), **topics}
    return replace(Config.default().mq, topics=FrozenMap(topics), **kw)


def make(*, journal: bool = False, **kw: Any) -> Broker:
    return Broker(mq(**kw).settings(), journal=journal)


def pub(b: Broker, topic: str, data: bytes = b"x", now: float = T0, **kw: Any) -> str:
    [code] = b.publish([Draft(topic, data, **kw)], now)
    return code


def pub_many(b: Broker, topic: str, n: int, now: float = T0, **kw: Any) -> list[str]:
    return b.publish([Draft(topic, b"m%d" % i, **kw) for i in range(n)], now)


def pushed(b: Broker) -> dict[int, list[str]]:
    return {cid: [e.msg.code for e in entries] for cid, entries in b.take_pushes().items()}


def pushed_to(b: Broker, consumer: Consumer) -> list[str]:
    return pushed(b).get(consumer.id, [])


def entry(b: Broker, code: str, group: str = DEFAULT_GROUP) -> Entry:
    return b.messages[code].entries[group]


def live(msg: Message) -> bool:
    """``msg.live``, read through a call: after ``assert msg.live`` mypy would hold it true
    across the broker calls that end the message."""
    return msg.live


def group_of(b: Broker, topic: str, name: str = DEFAULT_GROUP) -> Group:
    return b.topics[topic].groups[name]


def dlq_messages(b: Broker, topic: str) -> list[Message]:
    return [m for m in b.messages.values() if m.topic == topic + ".dlq"]


# ====================================================================== point-to-point


def test_p2p_competing_consumers_each_message_exactly_once() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    c = b.subscribe("jobs", now=T0)
    codes = pub_many(b, "jobs", 10)
    out = pushed(b)
    assert out[a.id] == codes[0::2]  # plain round-robin
    assert out[c.id] == codes[1::2]
    for code in codes:
        assert entry(b, code).status is Status.INFLIGHT
        assert list(b.messages[code].entries) == [DEFAULT_GROUP]
    assert b.ack(a.id, out[a.id], T0 + 1) == []
    assert b.ack(c.id, out[c.id], T0 + 1) == []
    assert all(not b.messages[code].live for code in codes)
    assert all(entry(b, code).status is Status.CONSUMED for code in codes)
    assert b.topics["jobs"].live_count == 0
    assert b.stats.acked == 10
    assert pushed(b) == {}


def test_p2p_messages_wait_for_a_consumer() -> None:
    b = make()
    codes = pub_many(b, "jobs", 3)
    assert pushed(b) == {}
    assert group_of(b, "jobs").ready_count == 3
    assert b.messages[codes[0]].wire_status(T0) == -1
    a = b.subscribe("jobs", now=T0 + 5)
    assert pushed_to(b, a) == codes
    b.ack(a.id, codes, T0 + 6)
    assert b.messages[codes[0]].wire_status(T0 + 6) == 1


def test_round_robin_skips_consumers_without_credit() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, prefetch=1)
    c = b.subscribe("jobs", now=T0, prefetch=5)
    codes = pub_many(b, "jobs", 4)
    out = pushed(b)
    assert out[a.id] == [codes[0]]
    assert out[c.id] == codes[1:]


# ====================================================================== pub/sub


def test_pubsub_each_subscriber_gets_its_own_copy() -> None:
    b = make()
    subs = [b.subscribe(PUBSUB, now=T0, auto_ack=True) for _ in range(3)]
    codes = pub_many(b, PUBSUB, 4)
    out = pushed(b)
    for s in subs:
        assert out[s.id] == codes
    msg = b.messages[codes[0]]
    assert sorted(msg.entries) == sorted(f"~{s.id}" for s in subs)
    assert msg.open_entries == 3


def test_pubsub_one_ack_does_not_complete_for_another() -> None:
    b = make()
    s1 = b.subscribe(PUBSUB, now=T0, auto_ack=True)
    s2 = b.subscribe(PUBSUB, now=T0, auto_ack=True)
    code = pub(b, PUBSUB)
    pushed(b)
    assert b.ack(s1.id, [code], T0 + 1) == []
    msg = b.messages[code]
    assert live(msg)
    assert msg.entries[f"~{s1.id}"].status is Status.CONSUMED
    assert msg.entries[f"~{s2.id}"].status is Status.INFLIGHT
    assert code in s2.held
    assert b.topics[PUBSUB].live_count == 1
    # s1 cannot settle s2's copy
    assert b.ack(s1.id, [code], T0 + 1) == [code]
    assert live(msg)
    assert b.ack(s2.id, [code], T0 + 2) == []
    assert not msg.live
    assert msg.wire_status(T0 + 2) == 1
    assert b.topics[PUBSUB].live_count == 0


def test_pubsub_late_subscriber_gets_only_later_messages() -> None:
    b = make()
    early = b.subscribe(PUBSUB, now=T0, auto_ack=True)
    m1 = pub(b, PUBSUB, now=T0)
    late = b.subscribe(PUBSUB, now=T0 + 1, auto_ack=True)
    m2 = pub(b, PUBSUB, now=T0 + 2)
    out = pushed(b)
    assert out[early.id] == [m1, m2]
    assert out[late.id] == [m2]
    assert list(b.messages[m1].entries) == [f"~{early.id}"]


def test_pubsub_without_subscribers_completes_unrouted() -> None:
    b = make()
    code = pub(b, PUBSUB)
    msg = b.messages[code]
    assert not msg.live
    assert msg.entries == {}
    assert msg.wire_status(T0) == 1
    assert b.stats.unrouted == 1
    assert b.topics[PUBSUB].live_count == 0
    # a subscriber joining afterwards does not get it
    s = b.subscribe(PUBSUB, now=T0 + 1)
    assert pushed_to(b, s) == []


def test_pubsub_settled_entry_outlives_its_subscriber() -> None:
    """The message is its first group's entry; when that group goes, a final entry stays listed."""
    b = make()
    s1 = b.subscribe(PUBSUB, now=T0)
    s2 = b.subscribe(PUBSUB, now=T0)
    code = pub(b, PUBSUB)
    pushed(b)
    b.nack(s1.id, [code], False, T0 + 1)  # s1's copy is dead-lettered
    b.unsubscribe(s1.id, T0 + 2)
    msg = b.messages[code]
    assert {g: e.status for g, e in msg.entries.items()} == {
        f"~{s1.id}": Status.DEAD,
        f"~{s2.id}": Status.INFLIGHT,
    }
    b.unsubscribe(s2.id, T0 + 3)  # s2's open copy goes with it
    assert list(msg.entries) == [f"~{s1.id}"]
    assert not msg.live


def test_pubsub_subscriber_leaving_drops_only_its_copies() -> None:
    b = make()
    s1 = b.subscribe(PUBSUB, now=T0, auto_ack=True)
    s2 = b.subscribe(PUBSUB, now=T0, auto_ack=True, prefetch=1)
    m1, m2 = pub_many(b, PUBSUB, 2)  # s2 holds m1, m2 waits in its group
    pushed(b)
    b.unsubscribe(s2.id, T0 + 1)
    assert f"~{s2.id}" not in b.topics[PUBSUB].groups
    for code in (m1, m2):
        assert list(b.messages[code].entries) == [f"~{s1.id}"]
        assert b.messages[code].live
    b.ack(s1.id, [m1, m2], T0 + 2)
    assert not b.messages[m1].live
    assert not b.messages[m2].live
    assert b.topics[PUBSUB].live_count == 0


def test_fanout_to_manual_ack_subscribers() -> None:
    """Two manual-ack subscribers get the same message at the same instant.

    Regression: deadline-heap items of two groups' entries of one message
    used to tie on ``(deadline, seq)`` and make heapq compare ``Entry``
    objects (TypeError).
    """
    b = make()
    s1 = b.subscribe(PUBSUB, now=T0)
    s2 = b.subscribe(PUBSUB, now=T0)
    code = pub(b, PUBSUB, now=T0 + 1)
    out = pushed(b)
    assert out == {s1.id: [code], s2.id: [code]}
    b.ack(s1.id, [code], T0 + 2)
    assert b.messages[code].live
    b.ack(s2.id, [code], T0 + 2)
    assert not b.messages[code].live


# ====================================================================== named groups


def test_named_group_is_durable_while_it_has_no_consumer() -> None:
    b = make()
    first = b.subscribe(PUBSUB, now=T0, group="billing")
    b.unsubscribe(first.id, T0)
    codes = pub_many(b, PUBSUB, 3, now=T0 + 1)
    assert pushed(b) == {}
    assert all(b.messages[c].live for c in codes)
    assert group_of(b, PUBSUB, "billing").ready_count == 3
    back = b.subscribe(PUBSUB, now=T0 + 100, group="billing")
    assert pushed_to(b, back) == codes


def test_named_groups_broadcast_across_and_compete_inside() -> None:
    b = make()
    # group g1: two auto-ack consumers; group g2: one manual-ack consumer
    x = b.subscribe(PUBSUB, now=T0, group="g1", auto_ack=True)
    y = b.subscribe(PUBSUB, now=T0, group="g1", auto_ack=True)
    z = b.subscribe(PUBSUB, now=T0, group="g2")
    codes = pub_many(b, PUBSUB, 6)
    out = pushed(b)
    assert out[x.id] == codes[0::2]
    assert out[y.id] == codes[1::2]
    assert out[z.id] == codes
    for code in codes:
        assert sorted(b.messages[code].entries) == ["g1", "g2"]
    b.ack(x.id, out[x.id], T0 + 1)
    b.ack(y.id, out[y.id], T0 + 1)
    assert all(b.messages[c].live for c in codes)  # g2 has not acked yet
    b.ack(z.id, codes, T0 + 2)
    assert not any(b.messages[c].live for c in codes)


def test_named_group_on_p2p_topic_gets_its_own_copy() -> None:
    b = make()
    worker = b.subscribe("jobs", now=T0)
    audit = b.subscribe("jobs", now=T0, group="audit", auto_ack=True)
    code = pub(b, "jobs")
    out = pushed(b)
    assert out == {worker.id: [code], audit.id: [code]}
    assert sorted(b.messages[code].entries) == ["audit", DEFAULT_GROUP]


# ====================================================================== routing keys


def test_message_matching_no_consumer_waits_until_one_joins() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, key="a")
    code = pub(b, "jobs", key="b")
    assert pushed(b) == {}
    assert entry(b, code).status is Status.READY
    assert group_of(b, "jobs").ready_count == 1
    assert b.messages[code].live
    b.tick(T0 + 3600)  # never silently dropped
    assert entry(b, code).status is Status.READY
    other = b.subscribe("jobs", now=T0 + 3600, key="b")
    assert pushed(b) == {other.id: [code]}
    assert a.held == {}


def test_unmatched_messages_keep_their_order_when_delivered() -> None:
    b = make()
    b.subscribe("jobs", now=T0, key="a")
    codes = b.publish([Draft("jobs", b"%d" % i, key="b") for i in range(5)], T0)
    pushed(b)
    late = b.subscribe("jobs", now=T0 + 1, key="b")
    assert pushed_to(b, late) == codes


def test_busy_matching_consumer_does_not_block_another() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, key="a", prefetch=1)
    c = b.subscribe("jobs", now=T0, key="b", prefetch=10)
    a1 = pub(b, "jobs", key="a")
    assert pushed(b) == {a.id: [a1]}
    a2, b1, b2 = b.publish([Draft("jobs", b"", key=k) for k in ("a", "b", "b")], T0 + 1)
    assert pushed(b) == {c.id: [b1, b2]}  # a2 waits for a, without blocking b1 and b2
    assert entry(b, a2).status is Status.READY
    b.ack(a.id, [a1], T0 + 2)
    assert pushed(b) == {a.id: [a2]}


def test_wildcard_subscriptions_route_by_key() -> None:
    b = make()
    eu = b.subscribe("orders", now=T0, key="orders.eu.*", auto_ack=True)
    everything = b.subscribe("orders", now=T0, group="all", key="orders.#", auto_ack=True)
    k1, k2, k3 = (
        pub(b, "orders", key="orders.eu.fr"),
        pub(b, "orders", key="orders.us.ny"),
        pub(b, "orders", key="orders"),
    )
    out = pushed(b)
    assert out[eu.id] == [k1]
    assert out[everything.id] == [k1, k2, k3]
    # k2 and k3 wait in the default group for a consumer that accepts them
    assert entry(b, k2).status is Status.READY
    assert entry(b, k3).status is Status.READY


# ====================================================================== priority


def test_priority_higher_first_fifo_within() -> None:
    b = make()
    prios = [0, 5, 9, 5, 0, 9, 1]
    codes = b.publish([Draft("jobs", b"%d" % i, priority=p) for i, p in enumerate(prios)], T0)
    c = b.subscribe("jobs", now=T0 + 1)
    expected = [codes[i] for i in sorted(range(len(prios)), key=lambda i: (-prios[i], i))]
    assert pushed_to(b, c) == expected


def test_priority_with_limited_credit() -> None:
    b = make()
    c = b.subscribe("jobs", now=T0, prefetch=1)
    low = pub(b, "jobs", priority=0)
    assert pushed_to(b, c) == [low]
    low2, high = b.publish([Draft("jobs", b"", priority=0), Draft("jobs", b"", priority=7)], T0 + 1)
    assert pushed(b) == {}
    b.ack(c.id, [low], T0 + 2)
    assert pushed_to(b, c) == [high]
    b.ack(c.id, [high], T0 + 3)
    assert pushed_to(b, c) == [low2]


# ====================================================================== delayed messages


def test_delayed_message_released_exactly_at_deliver_at() -> None:
    b = make()
    c = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", now=T0, delay_s=5.0)
    msg = b.messages[code]
    assert msg.deliver_at == T0 + 5.0
    assert entry(b, code).status is Status.DELAYED
    assert msg.wire_status(T0) == 0
    assert b.topics["jobs"].delayed_count == 1
    assert pushed(b) == {}
    assert b.next_deadline() == T0 + 5.0
    b.tick(T0 + 4.95)
    assert pushed(b) == {}
    assert entry(b, code).status is Status.DELAYED
    # other events before deliver_at never release it early
    other = pub(b, "jobs", now=T0 + 4.99)
    assert pushed(b) == {c.id: [other]}
    b.tick(T0 + 5.0)
    assert pushed(b) == {c.id: [code]}
    assert entry(b, code).last_delivered_at == T0 + 5.0
    assert b.topics["jobs"].delayed_count == 0


def test_absolute_deliver_at_wins_over_delay() -> None:
    b = make()
    c = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", now=T0, delay_s=100.0, deliver_at=T0 + 2.5)
    assert b.next_deadline() == T0 + 2.5
    b.tick(T0 + 2.5)
    assert pushed_to(b, c) == [code]


def test_deliver_at_in_the_past_is_immediate() -> None:
    b = make()
    c = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", now=T0, deliver_at=T0 - 10)
    assert pushed_to(b, c) == [code]


def test_delayed_messages_release_in_time_order() -> None:
    b = make()
    c = b.subscribe("jobs", now=T0)
    late = pub(b, "jobs", now=T0, delay_s=3.0)
    early = pub(b, "jobs", now=T0, delay_s=1.0)
    assert b.next_deadline() == T0 + 1.0
    b.tick(T0 + 1.0)
    assert pushed_to(b, c) == [early]
    assert b.next_deadline() == T0 + 3.0  # before the ack deadline T0 + 61
    b.tick(T0 + 10)
    assert pushed_to(b, c) == [late]


def test_next_deadline_is_none_when_idle() -> None:
    b = make(retain_consumed_s=0)
    assert b.next_deadline() is None
    c = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    assert b.next_deadline() == T0 + 60.0  # the ack deadline
    b.ack(c.id, [code], T0 + 1)
    b.tick(T0 + 61)
    assert b.next_deadline() is None


# ====================================================================== ack timeout


def test_ack_timeout_redelivers_to_a_different_consumer() -> None:
    b = make(ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    c = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    assert pushed(b) == {a.id: [code]}
    assert b.next_deadline() == T0 + 10.0
    b.tick(T0 + 9.99)
    assert pushed(b) == {}
    b.tick(T0 + 10.0)
    assert pushed(b) == {c.id: [code]}
    assert a.held == {}
    e = entry(b, code)
    assert e.consumer is c
    assert e.attempts == 2
    assert e.deadline == T0 + 20.0
    assert b.stats.timeouts == 1
    assert b.stats.redelivered == 1
    # the late ack from the first consumer is refused
    assert b.ack(a.id, [code], T0 + 11) == [code]
    assert b.ack(c.id, [code], T0 + 11) == []
    assert not b.messages[code].live


def test_ack_timeout_redelivers_to_same_consumer_when_alone() -> None:
    b = make(ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    b.tick(T0 + 10)
    assert pushed(b) == {a.id: [code]}
    assert entry(b, code).attempts == 2


def test_ack_timeout_is_per_topic() -> None:
    b = make(ack_timeout_s=10.0, topics={"slow": TopicOverride(ack_timeout_s=100.0)})
    a = b.subscribe("slow", now=T0)
    code = pub(b, "slow")
    pushed(b)
    b.tick(T0 + 50)
    assert pushed(b) == {}
    b.tick(T0 + 100)
    assert pushed(b) == {a.id: [code]}


def test_auto_ack_consumer_has_no_deadline() -> None:
    b = make(ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0, auto_ack=True)
    code = pub(b, "jobs")
    assert pushed(b) == {a.id: [code]}
    assert b.next_deadline() is None
    b.tick(T0 + 1000)
    assert pushed(b) == {}
    assert entry(b, code).status is Status.INFLIGHT
    b.ack(a.id, [code], T0 + 1000)
    assert entry(b, code).status is Status.CONSUMED


def test_touch_extends_the_deadline() -> None:
    b = make(ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    assert b.touch(a.id, [code, "f" * 32], T0 + 8) == ["f" * 32]
    assert entry(b, code).deadline == T0 + 18
    b.tick(T0 + 10)
    assert pushed(b) == {}
    assert entry(b, code).status is Status.INFLIGHT
    assert b.next_deadline() == T0 + 18
    b.tick(T0 + 17.9)
    assert pushed(b) == {}
    b.tick(T0 + 18)
    assert pushed(b) == {a.id: [code]}
    assert entry(b, code).attempts == 2
    assert b.stats.timeouts == 1


@pytest.mark.parametrize("how", ["touch", "nack"])
def test_same_instant_deadline_times_out_once(how: str) -> None:
    """Regression: a second heap item with the same deadline timed the entry out twice."""
    b = make(ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", now=T0)
    pushed(b)
    if how == "touch":
        b.touch(a.id, [code], T0)  # same deadline T0 + 10 pushed again
    else:
        b.nack(a.id, [code], True, T0)  # redelivered at once, same deadline
        assert pushed(b) == {a.id: [code]}
    attempts = entry(b, code).attempts
    b.tick(T0 + 10)
    assert pushed(b) == {a.id: [code]}
    assert b.stats.timeouts == 1
    assert entry(b, code).attempts == attempts + 1
    group = group_of(b, "jobs")
    assert group.ready_count == 0  # got 1: a phantom READY entry
    assert sum(len(q) for q in group.queues()) == 0


def test_same_instant_deadline_dead_letters_once() -> None:
    b = make(ack_timeout_s=10.0, max_deliveries=1)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", now=T0)
    pushed(b)
    b.touch(a.id, [code], T0)
    b.tick(T0 + 10)
    assert b.messages[code].open_entries == 0
    assert len(dlq_messages(b, "jobs")) == 1
    assert b.stats.dead_lettered == 1


def test_acked_deliveries_leave_the_deadline_queues() -> None:
    """Acks drop the settled heads of the deadline FIFOs: they do not pin messages for a whole ack timeout."""
    b = make(retain_consumed_s=0)
    a = b.subscribe("jobs", now=T0, prefetch=10)
    codes = pub_many(b, "jobs", 10)
    pushed(b)
    assert len(b.timers.deadlines) == 10
    b.ack(a.id, codes[:4], T0 + 1)
    assert len(b.timers.deadlines) == 6
    b.ack(a.id, codes[6:], T0 + 1)  # out of order: behind a live head, pruned later
    assert len(b.timers.deadlines) == 6
    b.ack(a.id, codes[4:6], T0 + 1)
    assert len(b.timers.deadlines) == 0
    assert b.next_deadline() is None


# ====================================================================== disconnect


def test_unsubscribe_requeues_held_messages_at_front_in_order() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, prefetch=3)
    codes = pub_many(b, "jobs", 5)
    assert pushed_to(b, a) == codes[:3]
    b.unsubscribe(a.id, T0 + 1)
    assert a.id not in b.consumers
    assert all(entry(b, c).status is Status.READY for c in codes)
    assert group_of(b, "jobs").ready_count == 5
    c = b.subscribe("jobs", now=T0 + 2)
    assert pushed_to(b, c) == codes
    assert [entry(b, x).attempts for x in codes] == [2, 2, 2, 1, 1]


def test_unsubscribe_hands_held_messages_to_remaining_consumer() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, prefetch=2)
    c = b.subscribe("jobs", now=T0, prefetch=2)
    codes = pub_many(b, "jobs", 4)
    out = pushed(b)
    assert out == {a.id: [codes[0], codes[2]], c.id: [codes[1], codes[3]]}
    b.ack(c.id, out[c.id], T0 + 1)
    b.unsubscribe(a.id, T0 + 2)
    assert pushed(b) == {c.id: [codes[0], codes[2]]}


def test_unsubscribe_unknown_consumer_is_a_no_op() -> None:
    b = make()
    b.unsubscribe(12345, T0)
    assert b.consumers == {}


# ====================================================================== nack and dead letters


def test_nack_requeue_redelivers() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    first, second = pub_many(b, "jobs", 2)
    pushed(b)
    assert b.nack(a.id, [first, "0" * 32], True, T0 + 1) == ["0" * 32]
    assert pushed(b) == {a.id: [first]}
    e = entry(b, first)
    assert e.attempts == 2
    assert e.last_delivered_at == T0 + 1
    assert b.stats.nacked == 1
    assert list(a.held) == [second, first]


def test_nack_requeue_goes_to_the_front() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, prefetch=1)
    m1, m2 = pub_many(b, "jobs", 2)
    assert pushed_to(b, a) == [m1]
    b.nack(a.id, [m1], True, T0 + 1)
    assert pushed_to(b, a) == [m1]  # before m2
    b.ack(a.id, [m1], T0 + 2)
    assert pushed_to(b, a) == [m2]


def test_nack_reject_dead_letters_with_headers() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", b"payload", key="k.1", priority=4, producer_id="p1")
    pushed(b)
    assert b.nack(a.id, [code], False, T0 + 1) == []
    e = entry(b, code)
    assert e.status is Status.DEAD
    assert e.settled_at == T0 + 1
    assert not b.messages[code].live
    assert b.topics["jobs"].live_count == 0
    [dead] = dlq_messages(b, "jobs")
    assert dead.headers == {
        "original_code": code,
        "original_topic": "jobs",
        "group": DEFAULT_GROUP,
        "reason": "rejected",
        "attempts": "1",
    }
    assert (dead.data, dead.key, dead.priority, dead.producer_id) == (b"payload", "k.1", 4, "p1")
    assert dead.code != code
    assert dead.live
    assert b.topics["jobs.dlq"].live_count == 1
    assert b.stats.dead_lettered == 1
    assert pushed(b) == {}


def test_max_deliveries_dead_letters_after_nacks() -> None:
    b = make(max_deliveries=3)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    for i in range(1, 3):
        b.nack(a.id, [code], True, T0 + i)
        assert pushed(b) == {a.id: [code]}
    assert entry(b, code).attempts == 3
    b.nack(a.id, [code], True, T0 + 3)
    assert pushed(b) == {}
    assert entry(b, code).status is Status.DEAD
    [dead] = dlq_messages(b, "jobs")
    assert dead.headers is not None
    assert dead.headers["reason"] == "max_deliveries"
    assert dead.headers["attempts"] == "3"


def test_max_deliveries_dead_letters_after_timeouts() -> None:
    b = make(max_deliveries=3, ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    deliveries = len(pushed_to(b, a))
    for i in range(1, 4):
        b.tick(T0 + 10 * i)
        deliveries += len(pushed_to(b, a))
    assert deliveries == 3
    assert entry(b, code).status is Status.DEAD
    assert entry(b, code).attempts == 3
    assert len(dlq_messages(b, "jobs")) == 1
    assert b.stats.timeouts == 3


def test_max_deliveries_is_per_topic_and_zero_is_unlimited() -> None:
    b = make(max_deliveries=2, topics={"forever": TopicOverride(max_deliveries=0)})
    a = b.subscribe("forever", now=T0)
    code = pub(b, "forever")
    pushed(b)
    for i in range(1, 20):
        b.nack(a.id, [code], True, T0 + i)
        assert pushed(b) == {a.id: [code]}
    assert entry(b, code).attempts == 20
    assert "forever.dlq" not in b.topics


def test_dlq_is_consumable() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    b.nack(a.id, [code], False, T0 + 1)
    reader = b.subscribe("jobs.dlq", now=T0 + 2)
    [dead] = dlq_messages(b, "jobs")
    assert pushed(b) == {reader.id: [dead.code]}
    b.ack(reader.id, [dead.code], T0 + 3)
    assert not dead.live
    assert b.topics["jobs.dlq"].live_count == 0


def test_dlq_of_pubsub_topic_is_durable() -> None:
    b = make()
    g = b.subscribe(PUBSUB, now=T0, group="g")
    code = pub(b, PUBSUB)
    pushed(b)
    b.nack(g.id, [code], False, T0 + 1)
    assert DEFAULT_GROUP in b.topics[PUBSUB + ".dlq"].groups
    [dead] = dlq_messages(b, PUBSUB)
    assert dead.headers is not None
    assert dead.headers["group"] == "g"
    reader = b.subscribe(PUBSUB + ".dlq", now=T0 + 100)  # group=None: the dlq's default group
    assert pushed_to(b, reader) == [dead.code]


def test_dlq_messages_are_never_dead_lettered_again() -> None:
    b = make(max_deliveries=2)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    b.nack(a.id, [code], False, T0 + 1)
    reader = b.subscribe("jobs.dlq", now=T0 + 2)
    [dead_code] = pushed_to(b, reader)
    for i in range(5):
        b.nack(reader.id, [dead_code], True, T0 + 3 + i)
        assert pushed_to(b, reader) == [dead_code]
    b.nack(reader.id, [dead_code], False, T0 + 10)
    assert entry(b, dead_code).status is Status.DEAD
    assert "jobs.dlq.dlq" not in b.topics


def test_dead_letter_of_longest_topic_name() -> None:
    """Regression: ``<topic>.dlq`` of a 252–255 character topic is longer than a topic name may be."""
    b = make()
    name = "t" * 255
    a = b.subscribe(name, now=T0)
    code = pub(b, name)
    pushed(b)
    b.nack(a.id, [code], False, T0 + 1)
    assert entry(b, code).status is Status.DEAD
    [dead] = [m for m in b.messages.values() if m.headers and m.headers["original_code"] == code]
    assert dead.live
    reader = b.subscribe(dead.topic, now=T0 + 2)  # and the dead letter can be read
    assert pushed_to(b, reader) == [dead.code]


# ====================================================================== flow control


def test_prefetch_is_never_exceeded() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, prefetch=3)
    codes = pub_many(b, "jobs", 10)
    assert pushed_to(b, a) == codes[:3]
    assert a.credit == 0
    b.ack(a.id, [codes[0]], T0 + 1)
    assert pushed_to(b, a) == [codes[3]]
    assert len(a.held) == 3
    b.set_prefetch(a.id, 5, T0 + 2)
    assert pushed_to(b, a) == codes[4:6]
    assert len(a.held) == 5
    b.set_prefetch(a.id, 2, T0 + 3)
    assert pushed(b) == {}
    b.ack(a.id, codes[1:4], T0 + 4)  # held 2: still no credit
    assert pushed(b) == {}
    b.ack(a.id, [codes[4]], T0 + 5)  # held 1
    assert pushed_to(b, a) == [codes[6]]
    assert len(a.held) == 2


def test_default_prefetch_comes_from_config() -> None:
    b = make(prefetch=4)
    a = b.subscribe("jobs", now=T0)
    assert a.prefetch == 4
    pub_many(b, "jobs", 10)
    assert len(pushed_to(b, a)) == 4


def test_smooth_weighted_round_robin_ratio() -> None:
    b = make()
    heavy = b.subscribe("jobs", now=T0, weight=3, prefetch=1000)
    light = b.subscribe("jobs", now=T0, weight=1, prefetch=1000)
    pub_many(b, "jobs", 400)
    out = pushed(b)
    assert len(out[heavy.id]) == 300
    assert len(out[light.id]) == 100
    # smooth: every window of 4 consecutive deliveries is 3:1
    order = sorted((b.messages[c].seq, cid) for cid, cs in out.items() for c in cs)
    who = [cid for _, cid in order]
    for i in range(0, 400, 4):
        assert who[i : i + 4].count(light.id) == 1


def test_weighted_round_robin_with_acks_in_between() -> None:
    b = make()
    heavy = b.subscribe("jobs", now=T0, weight=2, prefetch=10)
    light = b.subscribe("jobs", now=T0, weight=1, prefetch=10)
    counts = {heavy.id: 0, light.id: 0}
    for i in range(30):
        pub_many(b, "jobs", 3, now=T0 + i)
        for cid, codes in pushed(b).items():
            counts[cid] += len(codes)
            b.ack(cid, codes, T0 + i)
    assert counts == {heavy.id: 60, light.id: 30}


# ====================================================================== duplicates


def test_dedup_returns_the_original_code() -> None:
    b = make()
    first = pub(b, "jobs", b"a", dedup_id="order-1")
    again = pub(b, "jobs", b"b", now=T0 + 1, dedup_id="order-1")
    assert again == first
    assert b.stats.duplicates == 1
    assert b.stats.published == 1
    assert len(b.messages) == 1
    assert b.messages[first].data == b"a"
    assert pub(b, "jobs", dedup_id="order-2") != first
    assert pub(b, "other", dedup_id="order-1") != first  # per topic


def test_dedup_within_one_batch() -> None:
    b = make()
    codes = b.publish(
        [
            Draft("jobs", b"1", dedup_id="x"),
            Draft("jobs", b"2", dedup_id="x"),
            Draft("jobs", b"3", dedup_id="y"),
            Draft("jobs", b"4"),
            Draft("jobs", b"5", dedup_id="y"),
        ],
        T0,
    )
    assert codes[0] == codes[1]
    assert codes[2] == codes[4]
    assert len(set(codes)) == 3
    assert b.stats.duplicates == 2
    assert b.topics["jobs"].live_count == 3


def test_dedup_survives_consumption_until_the_window_passes() -> None:
    b = make(dedup_window_s=100.0, retain_consumed_s=0)
    a = b.subscribe("jobs", now=T0)
    first = pub(b, "jobs", dedup_id="d")
    b.ack(a.id, pushed_to(b, a), T0 + 1)
    assert first not in b.messages  # consumed and not retained
    b.tick(T0 + 99)
    assert pub(b, "jobs", now=T0 + 99.9, dedup_id="d") == first
    assert pushed(b) == {}
    fresh = pub(b, "jobs", now=T0 + 100, dedup_id="d")
    assert fresh != first
    assert pushed(b) == {a.id: [fresh]}


# ====================================================================== limits


def test_max_length_reject_is_atomic() -> None:
    b = make(max_length=3)
    kept = pub_many(b, "jobs", 2)
    with pytest.raises(QueueFullError):
        b.publish([Draft("jobs", b"3"), Draft("jobs", b"4")], T0 + 1)
    with pytest.raises(QueueFullError):  # one full topic rejects the whole batch
        b.publish(
            [Draft("other", b"o", dedup_id="z"), Draft("jobs", b"3"), Draft("jobs", b"4")],
            T0 + 1,
        )
    assert set(b.messages) == set(kept)
    assert b.topics["jobs"].live_count == 2
    assert b.topics.get("other") is None or b.topics["other"].live_count == 0
    assert b.stats.published == 2
    assert group_of(b, "jobs").ready_count == 2
    # the failed batch left no dedup id behind
    z = pub(b, "other", now=T0 + 2, dedup_id="z")
    assert z in b.messages
    assert b.topics["other"].live_count == 1
    pub(b, "jobs", now=T0 + 3)  # one more still fits
    with pytest.raises(QueueFullError) as info:
        pub(b, "jobs", now=T0 + 4)
    assert info.value.code == "queue_full"


def test_max_length_counts_live_messages_only() -> None:
    b = make(max_length=2)
    a = b.subscribe("jobs", now=T0)
    codes = pub_many(b, "jobs", 2)
    pushed(b)
    with pytest.raises(QueueFullError):
        pub(b, "jobs", now=T0 + 1)
    b.ack(a.id, codes, T0 + 2)
    pub_many(b, "jobs", 2, now=T0 + 3)
    assert b.topics["jobs"].live_count == 2


def test_max_length_drop_oldest() -> None:
    b = make(max_length=3, overflow="drop_oldest")
    a = b.subscribe("jobs", now=T0, prefetch=1)
    first = pub(b, "jobs", now=T0)
    assert pushed_to(b, a) == [first]
    rest = pub_many(b, "jobs", 4, now=T0 + 1)
    topic = b.topics["jobs"]
    assert topic.live_count == 3
    assert entry(b, first).status is Status.DROPPED
    assert entry(b, rest[0]).status is Status.DROPPED
    assert not b.messages[first].live
    assert first not in a.held  # a dropped in-flight message leaves the consumer
    assert pushed_to(b, a) == [rest[1]]
    assert b.stats.dropped == 2
    assert b.ack(a.id, [first], T0 + 2) == [first]


def test_max_bytes_reject() -> None:
    b = make(max_bytes=10)
    a = b.subscribe("jobs", now=T0, prefetch=1)
    big = pub(b, "jobs", b"x" * 6)
    with pytest.raises(QueueFullError):
        pub(b, "jobs", b"y" * 5, now=T0 + 1)
    assert b.topics["jobs"].live_bytes == 6
    pub(b, "jobs", b"z" * 4, now=T0 + 1)
    assert b.topics["jobs"].live_bytes == 10
    b.ack(a.id, pushed_to(b, a), T0 + 2)
    assert big not in a.held
    assert b.topics["jobs"].live_bytes == 4
    pub(b, "jobs", b"w" * 6, now=T0 + 3)


def test_max_bytes_drop_oldest_per_topic() -> None:
    b = make(topics={"small": TopicOverride(max_bytes=10, overflow="drop_oldest")})
    codes = [pub(b, "small", b"x" * 4, now=T0 + i) for i in range(4)]
    topic = b.topics["small"]
    assert topic.live_bytes == 8
    assert [b.messages[c].live for c in codes] == [False, False, True, True]
    pub_many(b, "big", 50)  # other topics are unlimited
    assert b.topics["big"].live_count == 50


def test_producer_rate_limit() -> None:
    b = make(producer_rate=1.0, producer_burst=2)
    b.publish([Draft("jobs", b"1", producer_id="p"), Draft("jobs", b"2", producer_id="p")], T0)
    with pytest.raises(RateLimitedError) as info:
        pub(b, "jobs", now=T0, producer_id="p")
    assert info.value.code == "rate_limited"
    assert b.stats.published == 2
    assert b.topics["jobs"].live_count == 2
    pub(b, "jobs", now=T0, producer_id="q")  # per producer
    pub(b, "jobs", now=T0 + 1, producer_id="p")  # refilled
    with pytest.raises(RateLimitedError):
        b.publish([Draft("jobs", b"", producer_id="r")] * 3, T0 + 2)  # batch over burst
    assert b.stats.published == 4


# ====================================================================== expiry and retention


def test_ttl_expiry_drops_by_default() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0, key="never")
    code = pub(b, "jobs", ttl_s=5.0)
    msg = b.messages[code]
    assert msg.expire_at == T0 + 5.0
    assert b.next_deadline() == T0 + 5.0
    b.tick(T0 + 4.99)
    assert live(msg)
    b.tick(T0 + 5.0)
    assert not msg.live
    assert entry(b, code).status is Status.EXPIRED
    assert b.stats.expired == 1
    assert "jobs.dlq" not in b.topics
    assert b.topics["jobs"].live_count == 0
    assert group_of(b, "jobs").ready_count == 0
    assert a.held == {}


def test_ttl_expiry_dead_letters_when_configured() -> None:
    b = make(expired="dead_letter")
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", ttl_s=5.0)
    assert pushed_to(b, a) == [code]
    b.tick(T0 + 5.0)
    assert a.held == {}  # an expired in-flight message leaves its consumer
    assert entry(b, code).status is Status.DEAD
    [dead] = dlq_messages(b, "jobs")
    assert dead.headers is not None
    assert dead.headers["reason"] == "expired"
    assert b.stats.expired == 1
    assert b.ack(a.id, [code], T0 + 6) == [code]


def test_topic_default_ttl() -> None:
    b = make(topics={"short": TopicOverride(ttl_s=2.0)})
    code = pub(b, "short")
    long = pub(b, "jobs")
    b.tick(T0 + 2)
    assert entry(b, code, DEFAULT_GROUP).status is Status.EXPIRED
    assert b.messages[long].live  # no TTL elsewhere: never expires
    b.tick(T0 + 10**6)
    assert b.messages[long].live


def test_ttl_of_a_delayed_message() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", delay_s=10.0, ttl_s=5.0)
    b.tick(T0 + 5)
    assert entry(b, code).status is Status.EXPIRED
    assert b.topics["jobs"].delayed_count == 0
    b.tick(T0 + 10)
    assert pushed_to(b, a) == []


def test_consumed_messages_retained_then_removed() -> None:
    b = make(retain_consumed_s=30.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    b.ack(a.id, [code], T0 + 1)
    assert code in b.messages
    assert b.next_deadline() == T0 + 31
    b.tick(T0 + 30.9)
    assert code in b.messages
    b.tick(T0 + 31)
    assert code not in b.messages
    assert b.next_deadline() in (None, T0 + 60)  # at most the stale ack deadline (lazy heap)


def test_zero_retention_removes_at_once() -> None:
    b = make(retain_consumed_s=0.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    b.ack(a.id, [code], T0 + 1)
    assert code not in b.messages


def test_retention_count_cap() -> None:
    b = make(retain_consumed_max=3)
    a = b.subscribe("jobs", now=T0)
    codes = pub_many(b, "jobs", 5)
    b.ack(a.id, pushed_to(b, a), T0 + 1)
    b.tick(T0 + 2)
    assert [c in b.messages for c in codes] == [False, False, True, True, True]


# ====================================================================== delete


def test_delete_live_message() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code, other = pub_many(b, "jobs", 2)
    pushed(b)
    assert b.delete(code, T0 + 1) is True
    assert code not in b.messages
    assert code not in a.held
    assert b.topics["jobs"].live_count == 1
    assert b.delete(code, T0 + 1) is False
    assert b.ack(a.id, [code], T0 + 2) == [code]
    assert b.stats.deleted == 1
    # a consumed, retained message can be deleted too
    b.ack(a.id, [other], T0 + 2)
    assert other in b.messages
    assert b.delete(other, T0 + 3) is True
    assert other not in b.messages
    b.tick(T0 + 60)  # prunes the stale ack deadlines
    # Retention slots of deleted messages are dropped lazily, when they fall due.
    assert b.next_deadline() == T0 + 1 + b.settings.topic_defaults.retain_consumed_s
    b.tick(T0 + 2 + b.settings.topic_defaults.retain_consumed_s)
    assert b.next_deadline() is None


def test_delete_ready_message_is_not_delivered() -> None:
    b = make()
    code, other = pub_many(b, "jobs", 2)
    assert b.delete(code, T0)
    assert group_of(b, "jobs").ready_count == 1
    a = b.subscribe("jobs", now=T0 + 1)
    assert pushed_to(b, a) == [other]


def test_delete_delayed_message() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs", delay_s=5)
    assert b.delete(code, T0 + 1)
    assert b.topics["jobs"].delayed_count == 0
    b.tick(T0 + 10)
    assert pushed_to(b, a) == []


# ====================================================================== pull mode


def test_pull_leases_and_settles() -> None:
    b = make()
    codes = pub_many(b, "jobs", 5)
    leased = b.pull("jobs", None, 2, 30.0, T0 + 1)
    assert [e.msg.code for e in leased] == codes[:2]
    assert all(e.status is Status.INFLIGHT for e in leased)
    assert [e.msg.code for e in b.pull("jobs", None, 2, 30.0, T0 + 1)] == codes[2:4]
    assert pushed(b) == {}  # leases are not pushes
    assert b.settle_in_group("jobs", DEFAULT_GROUP, [codes[0], "f" * 32], Settle.ACK, T0 + 2) == ["f" * 32]
    assert entry(b, codes[0]).status is Status.CONSUMED
    assert not b.messages[codes[0]].live
    assert b.settle_in_group("jobs", DEFAULT_GROUP, [codes[1]], Settle.REQUEUE, T0 + 2) == []
    again = b.pull("jobs", None, 1, 30.0, T0 + 3)
    assert [e.msg.code for e in again] == [codes[1]]  # requeued to the front
    assert again[0].attempts == 2
    assert b.settle_in_group("jobs", DEFAULT_GROUP, [codes[2]], Settle.REJECT, T0 + 4) == []
    assert entry(b, codes[2]).status is Status.DEAD
    assert len(dlq_messages(b, "jobs")) == 1
    # a group or topic that does not exist is an error, and settling creates neither
    with pytest.raises(NotFoundError, match="no group 'nope'"):
        b.settle_in_group("jobs", "nope", [codes[3]], Settle.ACK, T0 + 4)
    with pytest.raises(NotFoundError, match="no topic 'other'"):
        b.settle_in_group("other", None, [codes[3]], Settle.ACK, T0 + 4)
    assert "nope" not in b.topics["jobs"].groups and "other" not in b.topics
    # settling twice: unknown
    assert b.settle_in_group("jobs", DEFAULT_GROUP, [codes[0]], Settle.ACK, T0 + 4) == [codes[0]]


def test_pull_lease_expiry_redelivers() -> None:
    b = make()
    codes = pub_many(b, "jobs", 3)
    [first] = b.pull("jobs", None, 1, 10.0, T0)
    assert first.msg.code == codes[0]
    b.tick(T0 + 9.9)
    assert entry(b, codes[0]).status is Status.INFLIGHT
    b.tick(T0 + 10)
    assert entry(b, codes[0]).status is Status.READY
    assert pushed(b) == {}  # the idle lessee takes nothing by itself
    again = b.pull("jobs", None, 5, 10.0, T0 + 11)
    assert [e.msg.code for e in again] == codes
    assert again[0].attempts == 2


def test_pull_returns_nothing_when_empty() -> None:
    b = make()
    assert b.pull("jobs", None, 10, 30.0, T0) == []


def test_pull_named_group_on_pubsub_topic() -> None:
    b = make()
    with pytest.raises(SubscriptionError):
        b.pull(PUBSUB, None, 1, 30.0, T0)
    assert b.pull(PUBSUB, "reader", 1, 30.0, T0) == []  # creates the durable group
    code = pub(b, PUBSUB, now=T0 + 1)
    [leased] = b.pull(PUBSUB, "reader", 1, 30.0, T0 + 2)
    assert leased.msg.code == code
    with pytest.raises(SubscriptionError):
        b.pull(PUBSUB, "~1", 1, 30.0, T0)


def test_pull_sees_messages_no_push_consumer_accepts() -> None:
    b = make()
    b.subscribe("jobs", now=T0, key="a")
    code = pub(b, "jobs", key="b")  # parked: no push consumer accepts "b"
    assert pushed(b) == {}
    [leased] = b.pull("jobs", None, 5, 30.0, T0 + 1)
    assert leased.msg.code == code


def test_long_poll_waiters_are_woken() -> None:
    b = make()
    group = b.pull_group("jobs", None, T0)
    pub(b, "jobs")
    assert b.take_woken() == set()  # nobody waiting
    group.waiters += 1
    pub(b, "jobs", now=T0 + 1)
    assert b.take_woken() == {group}
    assert b.take_woken() == set()
    other = b.pull_group("other", None, T0)
    other.waiters += 1
    b.publish([Draft("jobs", b"")], T0 + 2)
    assert b.take_woken() == {group}  # only groups that got ready entries


def test_delayed_release_wakes_waiters() -> None:
    b = make()
    group = b.pull_group("jobs", None, T0)
    group.waiters = 1
    pub(b, "jobs", delay_s=5)
    assert b.take_woken() == set()
    b.tick(T0 + 5)
    assert b.take_woken() == {group}


# ====================================================================== codes


def test_codes_are_hex_unique_and_sorted_by_creation() -> None:
    b = make()
    codes: list[str] = []
    for i in range(50):
        codes += b.publish([Draft("jobs", b""), Draft("other", b"")], T0 + i * 0.0005)
    assert all(re.fullmatch(r"[0-9a-f]{32}", c) for c in codes)
    assert len(set(codes)) == len(codes)
    assert sorted(codes) == codes


def test_codes_differ_across_nodes() -> None:
    one = Broker(mq().settings(), node_id=1)
    two = Broker(mq().settings(), node_id=2)
    assert pub(one, "t") != pub(two, "t")


def test_make_code_layout() -> None:
    assert make_code(1, 2, 3) == "000000000001" + "00000002" + "000000000003"
    assert make_code(2**48 - 1, 2**32 - 1, 2**48 - 1) == "f" * 32
    assert make_code(5, 0, 0) > make_code(4, 9, 9)


def test_first_seq_is_used() -> None:
    b = Broker(mq().settings(), first_seq=1000)
    code = pub(b, "t")
    assert b.messages[code].seq == 1000
    assert code.endswith(f"{1000:012x}")


@pytest.mark.parametrize("first", [1, 250, 2**48 - 3])
def test_code_maker_matches_make_code(first: int) -> None:
    """The broker's incremental codes are ``make_code``'s, across 256-message and batch boundaries."""
    maker = CodeMaker()
    for create_ms, node_id in [(1, 2), (1, 2), (2**48 + 7, 2**32 + 5), (1_700_000_000_123, 9)]:
        prefix = code_prefix(create_ms, node_id)
        for seq in range(first, first + 600):
            assert maker.block(prefix, seq).code(seq & 0xFF) == make_code(create_ms, node_id, seq)


def test_seq_is_read_back_from_the_code_or_stored() -> None:
    b = Broker(mq().settings(), first_seq=2**40)
    msg = b.messages[pub(b, "t")]
    assert msg.seq == 2**40
    assert code_seq(msg.code) == 2**40
    group = b.topics["t"].groups[DEFAULT_GROUP]
    foreign = Message(7, "not-a-kapok-code", b"", group=group, status=Status.READY)
    assert foreign.seq == 7  # an imported KapokMQ code does not carry it
    assert code_seq(foreign.code) is None


# ====================================================================== journal


def test_journal_records_in_order() -> None:
    b = make(journal=True)
    a = b.subscribe("jobs", now=T0)
    assert [type(c) for c in b.take_changes()] == [ch.GroupCreated]
    code = pub(b, "jobs", b"d", key="k", priority=2, producer_id="p")
    b.nack(a.id, [code], True, T0 + 1)
    b.ack(a.id, [code], T0 + 2)
    changes = b.take_changes()
    assert changes == [
        ch.Published(1, code, "jobs", b"d", "k", 2, T0, T0, 0.0, "p", "", None, (DEFAULT_GROUP,)),
        ch.Delivered(code, "jobs", DEFAULT_GROUP, 1, T0),
        ch.Requeued(code, "jobs", DEFAULT_GROUP, "nack", T0 + 1, attempts=1),
        ch.Delivered(code, "jobs", DEFAULT_GROUP, 2, T0 + 1),
        ch.Settled(code, "jobs", DEFAULT_GROUP, "consumed", "ack", T0 + 2),
    ]


def test_journal_timeout_disconnect_and_dead_letter() -> None:
    b = make(journal=True, ack_timeout_s=10.0)
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    b.tick(T0 + 10)
    b.unsubscribe(a.id, T0 + 11)
    c = b.subscribe("jobs", now=T0 + 12)
    b.nack(c.id, [code], False, T0 + 13)
    kinds = [(type(x).__name__, getattr(x, "reason", None)) for x in b.take_changes()]
    assert kinds == [
        ("GroupCreated", None),
        ("Published", None),
        ("Delivered", None),
        ("Requeued", "timeout"),
        ("Delivered", None),
        ("Requeued", "disconnect"),
        ("Delivered", None),
        ("Settled", "rejected"),
        ("GroupCreated", None),  # jobs.dlq default group
        ("Published", None),  # the dead letter
    ]


def test_journal_durable_groups_only() -> None:
    b = make(journal=True)
    b.subscribe(PUBSUB, now=T0, group="g", auto_ack=True)
    b.subscribe(PUBSUB, now=T0, auto_ack=True)  # anonymous: not journaled
    pub(b, PUBSUB)
    [published] = [c for c in b.take_changes() if isinstance(c, ch.Published)]
    assert published.groups == ("g",)
    assert not any(isinstance(c, ch.GroupCreated) and c.group.startswith("~") for c in b.take_changes())


def test_no_journal_by_default() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    b.ack(a.id, [code], T0 + 1)


# ====================================================================== bad input


@pytest.mark.parametrize(
    "draft",
    [
        Draft("jobs", b"", priority=10),
        Draft("jobs", b"", priority=-1),
        Draft("jobs", b"", ttl_s=-1.0),
        Draft("two words", b""),
        Draft("a/b", b""),
        Draft("tab\there", b""),
        Draft("bell\x07", b""),
        Draft("", b""),
        Draft("x" * 256, b""),
    ],
    ids=["priority10", "priority-1", "ttl", "space", "slash", "tab", "control", "empty", "long"],
)
def test_bad_drafts_are_rejected_atomically(draft: Draft) -> None:
    b = make()
    with pytest.raises(BadRequestError) as info:
        b.publish([Draft("jobs", b"fine"), draft], T0)
    assert isinstance(info.value, KapokError)
    assert info.value.http_status == 400
    assert len(b.messages) == 0
    assert b.stats.published == 0


def test_oversize_payload_is_rejected() -> None:
    b = make(max_message_bytes=100)
    pub(b, "jobs", b"x" * 100)
    with pytest.raises(MessageTooLargeError) as info:
        b.publish([Draft("jobs", b"ok"), Draft("jobs", b"x" * 101)], T0)
    assert isinstance(info.value, BadRequestError)
    assert info.value.http_status == 413
    assert len(b.messages) == 1


@pytest.mark.parametrize("topic", ["two words", "a/b", "", "x" * 256])
def test_subscribe_to_bad_topic_name(topic: str) -> None:
    b = make()
    with pytest.raises(BadRequestError):
        b.subscribe(topic, now=T0)
    assert b.consumers == {}


@pytest.mark.parametrize("prefetch", [0, -1, 1_000_001])
def test_bad_prefetch(prefetch: int) -> None:
    b = make()
    with pytest.raises(SubscriptionError):
        b.subscribe("jobs", now=T0, prefetch=prefetch)
    a = b.subscribe("jobs", now=T0)
    with pytest.raises(SubscriptionError):
        b.set_prefetch(a.id, prefetch, T0)
    assert a.prefetch == 100


@pytest.mark.parametrize("weight", [0, 1001])
def test_bad_weight(weight: int) -> None:
    with pytest.raises(SubscriptionError):
        make().subscribe("jobs", now=T0, weight=weight)


@pytest.mark.parametrize("group", ["~mine", "~1", "~"])
def test_reserved_group_names(group: str) -> None:
    b = make()
    with pytest.raises(SubscriptionError):
        b.subscribe("jobs", now=T0, group=group)
    with pytest.raises(SubscriptionError):
        b.pull_group("jobs", group, T0)
    assert b.consumers == {}


@pytest.mark.parametrize("group", ["two words", "a/b", ""])
def test_bad_group_names(group: str) -> None:
    with pytest.raises(BadRequestError):
        make().subscribe("jobs", now=T0, group=group)


def test_bad_key_pattern() -> None:
    with pytest.raises(BadRequestError):
        make().subscribe("jobs", now=T0, key="k" * 300)


@pytest.mark.parametrize("op", ["ack", "nack", "touch", "set_prefetch"])
def test_unknown_consumer_id(op: str) -> None:
    b = make()
    calls: dict[str, Callable[[], object]] = {
        "ack": lambda: b.ack(999, ["x"], T0),
        "nack": lambda: b.nack(999, ["x"], True, T0),
        "touch": lambda: b.touch(999, ["x"], T0),
        "set_prefetch": lambda: b.set_prefetch(999, 5, T0),
    }
    with pytest.raises(SubscriptionError) as info:
        calls[op]()
    assert info.value.code == "bad_subscription"


def test_unknown_codes_are_returned_not_raised() -> None:
    b = make()
    a = b.subscribe("jobs", now=T0)
    code = pub(b, "jobs")
    pushed(b)
    bogus = ["nope", "0" * 32]
    assert b.ack(a.id, [*bogus, code], T0 + 1) == bogus
    assert b.ack(a.id, [code], T0 + 1) == [code]  # the second ack is unknown
    assert b.nack(a.id, bogus, True, T0 + 1) == bogus
    assert b.touch(a.id, bogus, T0 + 1) == bogus

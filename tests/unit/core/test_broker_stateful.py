"""Stateful property test of the broker core.

A hypothesis state machine publishes, subscribes, disconnects, acks, nacks,
touches and moves the clock at random, keeps its own model of what every
group must eventually get, and checks the broker's invariants after every
step. The teardown drains everything and checks that every message of a
durable group ends consumed or dead-lettered, never silently gone.

The clock moves only in ``advance`` (by 0 or more), so many operations happen
at the same instant: deliveries, touches and redeliveries with equal deadlines
are part of what is tested.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kapok.config import Config, FrozenMap, TopicOverride
from kapok.core.broker import Broker, Draft
from kapok.core.consumers import Consumer
from kapok.core.model import Entry, Status
from kapok.core.topics import DEFAULT_GROUP, Queued
from kapok.core.waiting import Waiting

P2P, PUBSUB = "t0", "t1"
TOPICS = (P2P, PUBSUB)
KEYS = ("a", "b", "a.x")
PATTERNS = (None, "a", "b", "a.*", "a.#", "#")
NAMED = ("g1", "g2")
MAX_DELIVERIES = 3
ACK_TIMEOUT = 3.0
DEDUP_WINDOW = 20.0
MAX_CONSUMERS = 8
UNKNOWN = "f" * 32

CONFIG = replace(
    Config.default().mq,
    push_type=1,
    ack_timeout_s=ACK_TIMEOUT,
    max_deliveries=MAX_DELIVERIES,
    dedup_window_s=DEDUP_WINDOW,
    retain_consumed_s=1e9,  # keep finished messages inspectable for the whole run
    topics=FrozenMap({PUBSUB: TopicOverride(push_type=2)}),
)

draft_st = st.tuples(
    st.sampled_from(TOPICS),
    st.sampled_from(("", *KEYS)),
    st.sampled_from([0, 0, 0, 1, 5, 9]),
    st.sampled_from([0.0, 0.0, 0.0, 0.5, 2.0, 7.0]),
    st.sampled_from(["", "", "", "", "d0", "d1"]),
)


# (topic, group, key pattern, prefetch, weight, auto_ack)
sub_st = st.tuples(
    st.sampled_from(TOPICS),
    st.sampled_from([None, None, *NAMED]),
    st.sampled_from(PATTERNS),
    st.integers(1, 5),
    st.integers(1, 3),
    st.sampled_from([False, False, True]),
)


@dataclass
class Sub:
    consumer: Consumer
    topic: str
    group: str
    durable: bool
    auto_ack: bool


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.b = Broker(CONFIG.settings())
        self.now = 1000.0
        self.last_tick = self.now
        self.subs: dict[int, Sub] = {}
        # durable groups of each topic: new messages are routed to these
        self.durable: dict[str, set[str]] = {P2P: {DEFAULT_GROUP}, PUBSUB: set()}
        # code -> {group name: durable?}: the groups the message was routed to
        self.expected: dict[str, dict[str, bool]] = {}
        self.acked: set[tuple[str, str]] = set()
        self.rejected: set[tuple[str, str]] = set()
        self.deliveries: Counter[tuple[str, str]] = Counter()
        self.dedup: dict[tuple[str, str], tuple[str, float]] = {}
        self.prev_held: dict[int, int] = {}  # len(held) after the previous step

    # ------------------------------------------------------------ helpers

    def _anon_groups(self, topic: str) -> set[str]:
        return {s.group for s in self.subs.values() if s.topic == topic and not s.durable}

    def _collect(self) -> None:
        """Check every push; ack auto-ack deliveries as the network driver would."""
        b = self.b
        for _ in range(100):
            pushes = b.take_pushes()
            if not pushes:
                return
            for cid, entries in pushes.items():
                assert cid in self.subs, f"push to unknown consumer {cid}"
                sub = self.subs[cid]
                codes = [e.msg.code for e in entries]
                assert len(set(codes)) == len(codes), "one entry pushed twice in one batch"
                for e in entries:
                    assert e.msg.deliver_at <= self.now, "delayed message pushed early"
                    assert e.status is Status.INFLIGHT
                    assert e.consumer is sub.consumer
                    assert e.group is sub.consumer.group
                    assert sub.consumer.held.get(e.msg.code) is e
                    assert e.attempts <= MAX_DELIVERIES
                    assert e.last_delivered_at == self.now
                    if sub.consumer.pattern is not None:
                        assert sub.consumer.pattern.matches(e.msg.key)
                    self.deliveries[(e.msg.code, sub.group)] += 1
                assert len(sub.consumer.held) <= sub.consumer.prefetch, "prefetch exceeded"
                if sub.auto_ack:
                    assert b.ack(cid, codes, self.now) == []
                    self.acked.update((c, sub.group) for c in codes)
        raise AssertionError("pushes never settle")

    def _holders(self) -> list[int]:
        return sorted(cid for cid, s in self.subs.items() if s.consumer.held)

    def _pick(self, data: st.DataObject) -> tuple[Sub, list[str]]:
        """A consumer that holds something, and some of the codes it holds."""
        sub = self.subs[data.draw(st.sampled_from(self._holders()))]
        held = sorted(sub.consumer.held)
        return sub, data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True))

    def _subscribe(
        self, topic: str, group: str | None, pattern: str | None, prefetch: int, weight: int, auto_ack: bool
    ) -> None:
        c = self.b.subscribe(
            topic, now=self.now, group=group, key=pattern, prefetch=prefetch, weight=weight, auto_ack=auto_ack
        )
        if group is not None:
            name, durable = group, True
            self.durable[topic].add(group)
        elif topic == P2P:
            name, durable = DEFAULT_GROUP, True
        else:
            name, durable = f"~{c.id}", False
        assert c.group.name == name
        assert c.group.durable is durable
        assert c.prefetch == prefetch
        assert c.weight == weight
        self.subs[c.id] = Sub(c, topic, name, durable, auto_ack)

    # ------------------------------------------------------------ rules

    @rule(drafts=st.lists(draft_st, min_size=1, max_size=4))
    def publish(self, drafts: list[tuple[str, str, int, float, str]]) -> None:
        now = self.now
        horizon = now - DEDUP_WINDOW
        predicted: list[str | int | None] = []  # known code, index of an earlier draft, or fresh
        first_in_batch: dict[tuple[str, str], int] = {}
        for i, (topic, _, _, _, dedup) in enumerate(drafts):
            if not dedup:
                predicted.append(None)
                continue
            known = self.dedup.get((topic, dedup))
            if known is not None and known[1] > horizon:
                predicted.append(known[0])
            elif (topic, dedup) in first_in_batch:
                predicted.append(first_in_batch[(topic, dedup)])
            else:
                first_in_batch[(topic, dedup)] = i
                predicted.append(None)
        codes = self.b.publish(
            [
                Draft(t, f"{t}/{k}/{p}".encode(), key=k, priority=p, delay_s=d, dedup_id=dd)
                for t, k, p, d, dd in drafts
            ],
            now,
        )
        assert len(codes) == len(drafts)
        for (topic, key, prio, delay, dedup), code, pred in zip(drafts, codes, predicted, strict=True):
            if isinstance(pred, str):
                assert code == pred, "a duplicate must get the original code"
                continue
            if isinstance(pred, int):
                assert code == codes[pred], "a duplicate in one batch must get the first code"
                continue
            assert code not in self.expected, "codes are unique"
            assert len(code) == 32
            msg = self.b.messages[code]
            assert (msg.topic, msg.key, msg.priority) == (topic, key, prio)
            assert msg.deliver_at == (now + delay if delay else now)
            groups = {g: True for g in self.durable[topic]}
            groups.update({g: False for g in self._anon_groups(topic)})
            self.expected[code] = groups
            assert set(msg.entries) == set(groups), "routed to exactly the existing groups"
            if dedup:
                self.dedup[(topic, dedup)] = (code, now)
        self._collect()

    @initialize(subs=st.lists(sub_st, max_size=3))
    def start(self, subs: list[tuple[str, str | None, str | None, int, int, bool]]) -> None:
        for args in subs:
            self._subscribe(*args)

    @precondition(lambda self: len(self.subs) < MAX_CONSUMERS)
    @rule(args=sub_st)
    def subscribe(self, args: tuple[str, str | None, str | None, int, int, bool]) -> None:
        self._subscribe(*args)
        self._collect()

    @precondition(lambda self: self.subs)
    @rule(data=st.data())
    def unsubscribe(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.subs)))
        sub = self.subs.pop(cid)
        self.b.unsubscribe(cid, self.now)
        assert cid not in self.b.consumers
        assert sub.consumer.held == {}
        self._collect()

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), with_unknown=st.booleans())
    def ack(self, data: st.DataObject, with_unknown: bool) -> None:
        sub, codes = self._pick(data)
        extra = [UNKNOWN] if with_unknown else []
        assert self.b.ack(sub.consumer.id, codes + extra, self.now) == extra
        self.acked.update((c, sub.group) for c in codes)
        self._collect()

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), requeue=st.booleans(), with_unknown=st.booleans())
    def nack(self, data: st.DataObject, requeue: bool, with_unknown: bool) -> None:
        sub, codes = self._pick(data)
        extra = [UNKNOWN] if with_unknown else []
        assert self.b.nack(sub.consumer.id, extra + codes, requeue, self.now) == extra
        if not requeue:
            self.rejected.update((c, sub.group) for c in codes)
        self._collect()

    @precondition(lambda self: self._holders())
    @rule(data=st.data(), with_unknown=st.booleans())
    def touch(self, data: st.DataObject, with_unknown: bool) -> None:
        sub, codes = self._pick(data)
        extra = [UNKNOWN] if with_unknown else []
        assert self.b.touch(sub.consumer.id, codes + extra, self.now) == extra
        if not sub.auto_ack:
            for code in codes:
                assert sub.consumer.held[code].deadline == self.now + sub.consumer.ack_timeout_s
        self._collect()

    @precondition(lambda self: self.subs)
    @rule(data=st.data(), prefetch=st.integers(1, 5))
    def set_prefetch(self, data: st.DataObject, prefetch: int) -> None:
        sub = self.subs[data.draw(st.sampled_from(sorted(self.subs)))]
        self.b.set_prefetch(sub.consumer.id, prefetch, self.now)
        self._collect()

    @rule(dt=st.sampled_from([0.0, 0.25, 1.0, ACK_TIMEOUT, ACK_TIMEOUT + 0.5, 8.0, DEDUP_WINDOW]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.b.tick(self.now)
        self.last_tick = self.now
        self._collect()

    # ------------------------------------------------------------ invariants

    @invariant()
    def consumers_are_consistent(self) -> None:
        b = self.b
        assert set(b.consumers) == set(self.subs)
        holders: dict[int, int] = {}
        for cid, sub in self.subs.items():
            c = b.consumers[cid]
            assert c is sub.consumer
            # held never grows past prefetch (set_prefetch may lower it below what is held)
            assert len(c.held) <= max(c.prefetch, self.prev_held.get(cid, 0)), "prefetch exceeded"
            for code, e in c.held.items():
                assert e.msg.code == code
                assert e.status is Status.INFLIGHT
                assert e.consumer is c
                assert e.group is c.group
                assert id(e) not in holders, "entry in flight to two consumers"
                holders[id(e)] = cid
        self.prev_held = {cid: len(s.consumer.held) for cid, s in self.subs.items()}

    @invariant()
    def messages_are_consistent(self) -> None:
        b = self.b
        dead_copies: Counter[tuple[str, str]] = Counter()
        for msg in b.messages.values():
            if msg.topic.endswith(".dlq"):
                assert msg.headers is not None
                dead_copies[(msg.headers["original_code"], msg.headers["group"])] += 1
        dead: set[tuple[str, str]] = set()
        for code, msg in b.messages.items():
            is_dlq = msg.topic.endswith(".dlq")
            open_entries = 0
            for g, e in msg.entries.items():
                assert e.msg is msg
                assert e.group.name == g
                st_ = e.status
                assert st_ not in (Status.EXPIRED, Status.DROPPED), f"{code}/{g} is {st_}"
                if not st_.final:
                    open_entries += 1
                if st_ is Status.INFLIGHT:
                    assert e.consumer is not None
                    assert e.consumer.id in self.subs
                    assert e.consumer.held.get(code) is e
                else:
                    assert e.consumer is None
                    assert all(e is not s.consumer.held.get(code) for s in self.subs.values())
                if st_ is Status.DELAYED:
                    assert msg.deliver_at > self.last_tick, "a due delayed message was not released"
                    assert e.attempts == 0
                if e.attempts:
                    assert e.last_delivered_at >= msg.deliver_at, "delivered before deliver_at"
                assert e.attempts == self.deliveries[(code, g)], "attempts != deliveries seen"
                if not is_dlq:
                    assert e.attempts <= MAX_DELIVERIES
                if st_ is Status.CONSUMED:
                    assert (code, g) in self.acked, "consumed without an ack"
                    assert e.attempts >= 1
                if (code, g) in self.acked:
                    assert st_ is Status.CONSUMED
                if st_ is Status.DEAD:
                    assert not is_dlq
                    assert (code, g) in self.rejected or e.attempts == MAX_DELIVERIES, (
                        "dead-lettered before max_deliveries"
                    )
                    dead.add((code, g))
            assert msg.open_entries == open_entries
            assert msg.live == (open_entries > 0)
        assert set(dead_copies) == dead, "every dead entry has exactly one copy in <topic>.dlq"
        assert all(n == 1 for n in dead_copies.values())

    @invariant()
    def nothing_is_lost(self) -> None:
        b = self.b
        connected = {s.group for s in self.subs.values()}
        for code, groups in self.expected.items():
            msg = b.messages.get(code)
            assert msg is not None, f"message {code} vanished"
            assert set(msg.entries) <= set(groups)
            for g, durable in groups.items():
                e = msg.entries.get(g)
                if durable or g in connected:
                    assert e is not None, f"{code} lost its entry in group {g}"
                elif e is not None:
                    # a disconnected anonymous subscriber keeps only settled copies
                    assert e.status in (Status.CONSUMED, Status.DEAD)

    @invariant()
    def counters_match(self) -> None:
        b = self.b
        for name, topic in b.topics.items():
            msgs = [m for m in b.messages.values() if m.topic == name]
            live = [m for m in msgs if m.live]
            assert topic.live_count == len(live)
            assert topic.live_bytes == sum(m.size for m in live)
            assert topic.delayed_count == sum(
                e.status is Status.DELAYED for m in msgs for e in m.entries.values()
            )
            for gname, group in topic.groups.items():
                assert group.topic is topic
                ready = [
                    m.entries[gname]
                    for m in msgs
                    if gname in m.entries and m.entries[gname].status is Status.READY
                ]
                assert group.ready_count == len(ready)
                queued: Counter[int] = Counter()
                held: list[Iterable[Queued]] = [*group.queues(), group.parked]
                for q in held:
                    for e in q:
                        assert e.status is Status.READY or e.status.final, f"queued while {e.status}"
                        queued[id(e.current() if type(e) is Waiting else e)] += 1  # (``msgs`` made it)
                for e in ready:
                    assert queued[id(e)] == 1, "a READY entry must be queued exactly once"
                assert all(c.group is group for c in group.consumers)

    # ------------------------------------------------------------ drain

    def teardown(self) -> None:
        b = self.b
        stats = b.stats
        for name in ("timeouts", "dead_lettered", "redelivered", "duplicates", "unrouted", "nacked"):
            event(f"{name} > 0", str(getattr(stats, name) > 0))
        event("published", str(min(stats.published // 10 * 10, 50)))
        for cid in list(self.subs):
            del self.subs[cid]
            b.unsubscribe(cid, self.now)
        b.take_pushes()
        drainers: dict[int, Consumer] = {}
        for topic in list(b.topics.values()):
            for gname, group in list(topic.groups.items()):
                assert group.durable, "anonymous groups leave with their subscriber"
                c = b.subscribe(topic.name, now=self.now, group=gname, prefetch=100_000, auto_ack=True)
                drainers[c.id] = c
        for _ in range(10):
            while pushes := b.take_pushes():
                for cid, entries in pushes.items():
                    assert cid in drainers
                    for e in entries:
                        assert e.msg.deliver_at <= self.now
                    assert b.ack(cid, [e.msg.code for e in entries], self.now) == []
            if not any(m.live for m in b.messages.values()):
                break
            self.now += 10.0  # releases every delayed message
            b.tick(self.now)
        assert not any(m.live for m in b.messages.values()), "drain left live messages"
        for topic in b.topics.values():
            assert topic.live_count == 0
            assert topic.delayed_count == 0
            assert all(g.ready_count == 0 for g in topic.groups.values())
        assert all(not c.held for c in drainers.values())
        for code, groups in self.expected.items():
            msg = b.messages[code]
            for g, durable in groups.items():
                if durable:
                    entry: Entry = msg.entries[g]
                    assert entry.status in (Status.CONSUMED, Status.DEAD), f"{code}/{g} ended {entry.status}"


BrokerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestBrokerStateMachine = BrokerMachine.TestCase


class WaitingBrokerMachine(BrokerMachine):
    """The same, with every plain message past the first ready one in its group held as a
    ``Waiting`` (``kapok.core.waiting``)."""

    def __init__(self) -> None:
        super().__init__()
        self.b.keep_codes_queued = 1

    @rule(topic=st.sampled_from(TOPICS), n=st.integers(1, 6), dedup=st.sampled_from(["", "", "d0"]))
    def publish_plain(self, topic: str, n: int, dedup: str) -> None:
        self.publish([(topic, "", 0, 0.0, dedup)] * n)


WaitingBrokerMachine.TestCase.settings = settings(BrokerMachine.TestCase.settings, max_examples=150)
TestWaitingBrokerStateMachine = WaitingBrokerMachine.TestCase

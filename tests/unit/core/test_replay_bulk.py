"""Recovery's bulk paths give exactly the state of the record-by-record ones.

Pure: a journaling ``Broker`` runs a mixed workload (two durable groups, a topic routed
to none, priorities, delays, a TTL, dedup ids, headers, deliveries, acks, nacks, a
delete), and its records are replayed twice into fresh brokers: one record at a time
with ``apply`` and each message ``resume``d or ``retire``d alone (as recovery did), and
with ``apply_all`` and ``finish_recovery`` (``Broker.resume_all``). Every message, entry,
queue and counter must match, including a stream replayed twice over (a fuzzy snapshot).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kapok.config import Config
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft
from kapok.core.model import Message
from kapok.core.replay import apply, apply_all, finish_recovery

T0 = 1_700_000_000.0


def make() -> Broker:
    return Broker(Config.default().mq.settings(), journal=True)


def workload() -> list[ch.Change]:
    b = make()
    b.pull_group("orders", "billing", T0)
    b.pull_group("orders", "audit", T0)
    b.publish([Draft("orders", b"o%d" % i, key="k", priority=i % 3) for i in range(30)], T0)
    b.publish([Draft("orders", b"late", delay_s=3600.0), Draft("orders", b"short", ttl_s=5.0)], T0 + 1)
    b.publish([Draft("orders", b"once", dedup_id="d1", headers={"h": "v"}, producer_id="p")], T0 + 2)
    b.publish([Draft("nowhere.dlq", b"x") for _ in range(3)], T0 + 2)  # no group: dropped
    jobs = b.subscribe("jobs", now=T0 + 3, prefetch=5)
    codes = b.publish([Draft("jobs", b"j%d" % i) for i in range(12)], T0 + 3)
    b.ack(jobs.id, codes[:2], T0 + 4)
    b.nack(jobs.id, codes[2:3], True, T0 + 4)
    b.nack(jobs.id, codes[3:4], False, T0 + 4)
    b.delete(codes[11], T0 + 5)
    b.publish([Draft("jobs", b"after", priority=2)], T0 + 6)
    return b.take_changes()


def census(b: Broker) -> dict[str, Any]:
    def message(msg: Message) -> tuple[Any, ...]:
        entries = tuple(
            (e.group.name, e.status.value, e.attempts, e.last_delivered_at, e.settled_at)
            for e in msg.all_entries()
        )
        return (
            msg.seq, msg.topic, msg.data, msg.key, msg.priority, msg.create_time, msg.deliver_at,
            msg.expire_at, msg.producer_id, msg.dedup_id, msg.headers, msg.finished_at, entries,
        )  # fmt: skip

    queues = {
        (topic.name, group.name): [[e.msg.code for e in q] for q in group.queues()]
        for topic in b.topics.values()
        for group in topic.groups.values()
    }
    counters = {
        name: (t.live_count, t.live_bytes, t.delayed_count, [g.ready_count for g in t.groups.values()])
        for name, t in b.topics.items()
    }
    return {
        "messages": {code: message(msg) for code, msg in b.messages.items()},
        "order": list(b.messages),
        "queues": queues,
        "counters": counters,
        "backlog_bytes": b.backlog_bytes,
        "next_seq": b.next_seq,
        "changes": b.take_changes(),
    }


def one_by_one(records: list[ch.Change], now: float) -> Broker:
    b = make()
    b.journal = False
    for record in records:
        apply(b, record)
    b.journal = True
    b.admission.dedup.expire(now)
    for msg in sorted(b.messages.values(), key=lambda m: m.seq):
        if msg.live:
            b.resume(msg, now)
        else:
            b.retire(msg, now)
    b.resume_claims(now)
    b.dispatch(now)
    return b


def in_bulk(records: list[ch.Change], now: float) -> Broker:
    b = make()
    b.journal = False
    assert apply_all(b, records) == len(records)
    b.journal = True
    finish_recovery(b, now)
    return b


def test_bulk_replay_and_resume_give_the_state_of_one_record_at_a_time() -> None:
    records = workload()
    assert sum(isinstance(r, ch.Published) for r in records) == 50
    for now in (T0 + 7, T0 + 7200):  # before the delayed message is due and the TTL is over; after
        expected = census(one_by_one(records, now))
        assert census(in_bulk(records, now)) == expected
        assert census(in_bulk(records + records, now)) == expected  # replayed over itself
        assert len(expected["messages"]) > 30 and any(q for q in expected["queues"].values())


def test_messages_replayed_out_of_sequence_order_are_resumed_in_it() -> None:
    """The broker's index is in sequence order however replay filled it, so recovery
    resumes the messages in publish order without sorting a million of them, even from a
    log whose publishes came out of order."""
    records = workload()
    ordered = in_bulk(records, T0 + 7)
    published = [r for r in records if isinstance(r, ch.Published) and r.topic == "jobs"]
    rest = [r for r in records if not (isinstance(r, ch.Published) and r.topic == "jobs")]
    shuffled = in_bulk([*reversed(published), *rest], T0 + 7)  # the same messages, reversed
    assert [m.seq for m in shuffled.messages.values()] == sorted(m.seq for m in ordered.messages.values())
    assert census(shuffled)["queues"] == census(ordered)["queues"]  # queued by sequence all the same
    assert census(one_by_one([*reversed(published), *rest], T0 + 7))["queues"] == census(ordered)["queues"]


def test_replayed_messages_share_their_batchs_time_and_code_blocks() -> None:
    """A decoded record holds fresh objects (a float per time, a string per code); the
    messages replayed from a batch share one time, one zero and the blocks of their codes
    with each other, as the messages of a publish batch do: 64 B and more a message."""
    b = make()
    codes = b.publish([Draft("t", b"x") for _ in range(300)], T0)
    records = [r for r in b.take_changes() if isinstance(r, ch.Published)]
    fresh = [
        dataclasses.replace(
            r,
            code="".join(r.code),
            create_time=float(repr(r.create_time)),
            deliver_at=float(repr(r.deliver_at)),
            expire_at=float(repr(r.expire_at)),
        )
        for r in records
    ]
    assert len({id(r.create_time) for r in fresh}) == 300  # as decoding made them
    replayed = make()
    apply_all(replayed, fresh)
    messages = [replayed.messages[c] for c in codes]
    assert [m.code for m in messages] == codes
    assert len({id(m.create_time) for m in messages} | {id(m.deliver_at) for m in messages}) == 1
    assert len({id(m.expire_at) for m in messages}) == 1
    assert len({id(m._code) for m in messages}) == 2  # numbers 1 to 300: two blocks of 256

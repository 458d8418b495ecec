"""What each archive event kind means (docs/analytics.md, "Event schema"), end to end in
the pure parts: a journaled ``Broker`` (or a replay) makes change records, the WAL's rows
of them become events (``archive_events``). Every kind means one thing:

* a redelivery after a crash or a takeover is ``retried`` (reason ``recovery`` or
  ``takeover``, with the attempt that ended unacked), once per delivery in flight;
* an expiry with ``mq.expired: dead_letter`` is ``expired`` and ``dead_lettered``;
* a dead letter published again is ``requeued``, never ``acked``;
* a delete is one ``deleted`` (with its topic), never ``dropped``; ``dropped`` is overflow.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from kapok.config import Config, FrozenMap, MqConfig, TopicOverride
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.replay import Mirror, apply, finish_recovery, state_records
from kapok.storage.events import Event, archive_events
from kapok.storage.records import BATCH_TYPE, batch_rows, decode_payload, encode_payload

T0 = 1_700_000_000.0


def mq(**kw: Any) -> MqConfig:
    return replace(Config.default().mq, **kw)


def broker(**kw: Any) -> Broker:
    return Broker(mq(**kw).settings(), journal=True)


def events_of(changes: list[ch.Change]) -> list[Event]:
    """The archive's events of ``changes``, through the WAL's rows as the archiver reads them."""
    return archive_events(batch_rows(encode_payload(changes)))


def kinds(events: list[Event], *wanted: str) -> list[tuple[str, str]]:
    return [(e["ev"], e["code"]) for e in events if not wanted or e["ev"] in wanted]


def leased_before_a_crash(b: Broker) -> tuple[list[str], list[ch.Change]]:
    """Four messages: two leased and in flight, one leased and nacked back, one never
    delivered; returns the codes and everything journaled."""
    codes = b.publish([Draft("jobs", b"m%d" % i) for i in range(4)], T0)
    leased = b.pull("jobs", None, 3, 30.0, T0 + 1)
    assert [e.msg.code for e in leased] == codes[:3]
    b.settle_in_group("jobs", None, [codes[2]], Settle.REQUEUE, T0 + 2)
    return codes, b.take_changes()


# ---------------------------------------------------------------- retried


def test_recovery_journals_one_retried_per_delivery_in_flight_with_its_attempt() -> None:
    codes, log = leased_before_a_crash(broker())
    before = events_of(log)
    assert kinds(before, "retried") == [("retried", codes[2])]
    assert before[-1]["attempt"] == 1 and before[-1]["reason"] == "nack"

    recovered = broker()
    for record in log:
        apply(recovered, record)
    assert finish_recovery(recovered, T0 + 10) == 2  # the nacked one was ready already
    after = events_of(recovered.take_changes())
    assert after == [
        {"ev": "retried", "code": code, "topic": "jobs", "group": "default", "t": T0 + 10,
         "reason": "recovery", "attempt": 1}
        for code in codes[:2]
    ]  # fmt: skip


def test_a_second_recovery_retries_nothing_again() -> None:
    _, log = leased_before_a_crash(broker())
    first = broker()
    for record in log:
        apply(first, record)
    finish_recovery(first, T0 + 10)
    log += first.take_changes()  # the first recovery's requeues are in the WAL too
    second = broker()
    for record in log:
        apply(second, record)
    assert finish_recovery(second, T0 + 20) == 0
    assert kinds(events_of(second.take_changes()), "retried") == []


def test_a_snapshot_keeps_in_flight_and_requeued_entries_apart() -> None:
    b = broker()
    codes, _ = leased_before_a_crash(b)
    snapshot = list(state_records(b, T0 + 3))
    recovered = broker()
    for record in snapshot:
        apply(recovered, record)
    assert finish_recovery(recovered, T0 + 10) == 2
    assert kinds(events_of(recovered.take_changes()), "retried") == [("retried", c) for c in codes[:2]]


def test_a_takeover_journals_retried_for_what_was_in_flight_on_the_master() -> None:
    master = broker()
    codes, log = leased_before_a_crash(master)
    mirror = Mirror(broker())
    for record in log:
        mirror.apply(record)
    assert mirror.broker.take_changes() == []  # a mirror writes nothing of its own
    assert mirror.promote(T0 + 10) == 2
    after = events_of(mirror.broker.take_changes())
    assert [(e["ev"], e["code"], e["reason"], e["attempt"]) for e in after] == [
        ("retried", code, "takeover", 1) for code in codes[:2]
    ]


def test_a_delivery_in_flight_past_max_deliveries_is_dead_lettered_at_recovery_not_retried() -> None:
    b = broker(max_deliveries=1)
    codes, log = leased_before_a_crash(b)  # the nacked one was dead-lettered already
    recovered = broker(max_deliveries=1)
    for record in log:
        apply(recovered, record)
    assert finish_recovery(recovered, T0 + 10) == 0
    after = events_of(recovered.take_changes())
    assert kinds(after, "retried", "dead_lettered") == [("dead_lettered", c) for c in codes[:2]]
    assert {e["reason"] for e in after if e["ev"] == "dead_lettered"} == {"max_deliveries"}


def test_every_requeue_carries_the_attempt_that_ended() -> None:
    b = broker(ack_timeout_s=5.0)
    consumer = b.subscribe("jobs", now=T0)
    code = b.publish([Draft("jobs", b"x")], T0)[0]
    b.nack(consumer.id, [code], True, T0 + 1)  # attempt 1
    b.tick(T0 + 7)  # attempt 2 times out
    b.unsubscribe(consumer.id, T0 + 8)  # attempt 3 held at disconnect
    retried = [e for e in events_of(b.take_changes()) if e["ev"] == "retried"]
    assert [(e["reason"], e["attempt"]) for e in retried] == [("nack", 1), ("timeout", 2), ("disconnect", 3)]


# ---------------------------------------------------------------- expired, requeued, deleted, dropped


def test_an_expiry_is_expired_and_if_sent_to_the_dlq_dead_lettered_too() -> None:
    dropped = broker(expired="drop")
    dropped.publish([Draft("jobs", b"x", ttl_s=5.0)], T0)
    dropped.take_changes()
    dropped.tick(T0 + 6)
    assert [e["ev"] for e in events_of(dropped.take_changes())] == ["expired"]

    b = broker(expired="dead_letter")
    code = b.publish([Draft("jobs", b"x", ttl_s=5.0)], T0)[0]
    b.take_changes()
    b.tick(T0 + 6)
    events = events_of(b.take_changes())
    assert [(e["ev"], e["topic"]) for e in events] == [
        ("expired", "jobs"),
        ("dead_lettered", "jobs"),
        ("published", "jobs.dlq"),
    ]
    assert events[0] == {"ev": "expired", "code": code, "topic": "jobs", "group": "default", "t": T0 + 6}
    assert events[1]["reason"] == "expired" and events[1]["code"] == code


def test_a_dead_letter_published_again_is_requeued_not_acked() -> None:
    b = broker()
    consumer = b.subscribe("jobs", now=T0)
    code = b.publish([Draft("jobs", b"x")], T0)[0]
    b.nack(consumer.id, [code], False, T0 + 1)
    (letter,) = [m for m in b.messages.values() if m.topic == "jobs.dlq"]
    b.take_changes()
    # What ``BrokerService.requeue_dead_letter`` does: publish to the origin, settle the letter.
    (again,) = b.publish([Draft("jobs", letter.data)], T0 + 2)
    assert b.finish(letter.code, "requeued", T0 + 2)
    events = events_of(b.take_changes())
    assert kinds(events, "published", "requeued", "acked") == [
        ("published", again),
        ("requeued", letter.code),
    ]
    assert events[-1] == {"ev": "requeued", "code": letter.code, "topic": "jobs.dlq", "group": "default",
                          "t": T0 + 2}  # fmt: skip


def test_a_delete_is_one_deleted_event_with_its_topic_never_dropped_which_is_overflow() -> None:
    full = broker(max_length=1, overflow="drop_oldest")
    first = full.publish([Draft("jobs", b"1")], T0)[0]
    full.publish([Draft("jobs", b"2")], T0 + 1)
    assert kinds(events_of(full.take_changes()), "dropped", "deleted") == [("dropped", first)]

    topics = FrozenMap({"news": TopicOverride(push_type=2)})
    b = broker(topics=topics)
    for group in ("a", "b"):
        b.subscribe("news", now=T0, group=group)
    code = b.publish([Draft("news", b"x")], T0)[0]  # in flight to two groups
    b.take_changes()
    assert b.delete(code, T0 + 1)
    assert events_of(b.take_changes()) == [{"ev": "deleted", "code": code, "topic": "news", "t": T0 + 1}]


def test_a_retained_message_deleted_is_deleted_too() -> None:
    b = broker()
    consumer = b.subscribe("jobs", now=T0)
    code = b.publish([Draft("jobs", b"x")], T0)[0]
    b.ack(consumer.id, [code], T0 + 1)
    b.take_changes()
    assert b.delete(code, T0 + 2)
    assert events_of(b.take_changes()) == [{"ev": "deleted", "code": code, "topic": "jobs", "t": T0 + 2}]


# ---------------------------------------------------------------- old records


def test_rows_written_before_the_new_fields_still_make_their_events() -> None:
    """A Requeued row without ``attempts`` and a MessageDeleted row without ``topic`` (as the
    WAL held them before) decode, and archive without those fields; new rows carry them."""
    rows = [
        [4, "c1", "jobs", "default", "nack", T0],
        [6, "c1", T0 + 1],
        [4, "c2", "jobs", "default", "timeout", T0 + 2, 3],
        [6, "c2", T0 + 3, "jobs"],
    ]
    meta = orjson.dumps(rows)
    payload = bytes((BATCH_TYPE,)) + len(meta).to_bytes(4, "little") + meta
    assert decode_payload(payload) == [
        ch.Requeued("c1", "jobs", "default", "nack", T0),
        ch.MessageDeleted("c1", T0 + 1),
        ch.Requeued("c2", "jobs", "default", "timeout", T0 + 2, 3),
        ch.MessageDeleted("c2", T0 + 3, "jobs"),
    ]
    assert archive_events(batch_rows(payload)) == [
        {"ev": "retried", "code": "c1", "topic": "jobs", "group": "default", "t": T0, "reason": "nack"},
        {"ev": "deleted", "code": "c1", "t": T0 + 1},
        {"ev": "retried", "code": "c2", "topic": "jobs", "group": "default", "t": T0 + 2, "reason": "timeout",
         "attempt": 3},
        {"ev": "deleted", "code": "c2", "topic": "jobs", "t": T0 + 3},
    ]  # fmt: skip

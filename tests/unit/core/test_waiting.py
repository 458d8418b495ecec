"""A plain message far back in its queue is held as a ``Waiting`` (``kapok.core.waiting``)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from tests.unit.core.test_broker import PUBSUB, T0, make, pub, pub_many, pushed_to

from kapok.config.schema import TopicOverride
from kapok.core import replay
from kapok.core import state as state_module
from kapok.core.broker import Broker
from kapok.core.model import Draft, Message, Status
from kapok.core.waiting import Waiting
from kapok.server.routes.search import MessageQuery, search_messages

KEEP = 3  # ready messages in a group before the next plain one is held as a ``Waiting``


@pytest.fixture(autouse=True)
def _keep_few(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_module, "KEEP_CODES_QUEUED", KEEP)


def kinds(b: Broker) -> list[str]:
    """The type of what the index holds for each message, in sequence order."""
    return [type(m).__name__ for m in b.messages.held()]


def test_plain_messages_past_the_first_ready_ones_are_held_small_and_delivered_in_order() -> None:
    b = make(journal=True)
    codes = b.publish([Draft("t", b"m%d" % i, producer_id="p1", dedup_id=f"d{i}") for i in range(10)], T0)
    assert kinds(b) == ["Message"] * KEEP + ["Waiting"] * (10 - KEEP)
    held = list(b.messages.held())
    assert all(sys.getsizeof(m) <= 96 for m in held[KEEP:])  # a Message is 192
    assert sys.getsizeof(held[0]) >= 176
    assert [m.code for m in held] == codes and [m.data for m in held] == [b"m%d" % i for i in range(10)]
    assert b.topics["t"].live_count == 10 and group_ready(b) == 10
    consumer = b.subscribe("t", now=T0 + 1, prefetch=4)
    assert pushed_to(b, consumer) == codes[:4]
    assert kinds(b)[:4] == ["Message"] * 4 and kinds(b)[4:] == ["Waiting"] * 6
    got = []
    for _ in range(4):
        batch = [e.msg for e in consumer.held.values()]
        got += [m.code for m in batch]
        assert all(type(m) is Message and m.producer_id == "p1" for m in batch)
        b.ack(consumer.id, [m.code for m in batch], T0 + 2)
        b.take_pushes()
    assert got == codes and b.topics["t"].live_count == 0 and group_ready(b) == 0
    assert all(not b.messages[c].live for c in codes)  # retained, consumed: messages now


def group_ready(b: Broker) -> int:
    return b.topics["t"].groups["default"].ready_count


def test_a_lookup_makes_the_message_in_place_and_the_queue_delivers_that_one_once() -> None:
    b = make()
    codes = pub_many(b, "t", 6)
    waiting = list(b.messages.held())[4]
    assert type(waiting) is Waiting
    msg = b.messages[codes[4]]
    assert type(msg) is Message and waiting.moved is msg and kinds(b)[4] == "Message"
    assert b.messages[codes[4]] is msg and msg.code == codes[4] and msg.seq == waiting.seq
    consumer = b.subscribe("t", now=T0 + 1, prefetch=100)
    assert pushed_to(b, consumer) == codes
    assert consumer.held[codes[4]] is msg  # not a second message made from the queue's copy
    assert consumer.held[codes[5]] is b.messages[codes[5]]  # made at the queue's head, found by code


def test_a_waiting_message_deleted_or_finished_by_code_is_never_delivered() -> None:
    b = make()
    codes = pub_many(b, "t", 8)
    assert b.delete(codes[5], T0 + 1) and codes[5] not in b.messages
    assert b.finish(codes[6], "requeued", T0 + 1) and not b.messages[codes[6]].live
    assert group_ready(b) == 6 and b.topics["t"].live_count == 6
    consumer = b.subscribe("t", now=T0 + 2, prefetch=100)
    assert pushed_to(b, consumer) == [c for i, c in enumerate(codes) if i not in (5, 6)]


@pytest.mark.parametrize(
    "draft",
    [
        Draft("t", b"x", key="k"),
        Draft("t", b"x", priority=1),
        Draft("t", b"x", headers={"h": "v"}),
        Draft("t", b"x", delay_s=5),
        Draft("t", b"x", delay_s=-5),  # KapokMQ keeps a negative delay, and shows it
        Draft("t", b"x", ttl_s=60),
        Draft("dropping", b"x"),  # drop_oldest keeps the publish order: references to messages
        Draft(PUBSUB, b"x"),  # two subscribers: two groups
    ],
    ids=["key", "priority", "headers", "delay", "negative-delay", "ttl", "drop-oldest", "two-groups"],
)
def test_only_plain_messages_are_held_small(draft: Draft) -> None:
    b = make(topics={"dropping": TopicOverride(overflow="drop_oldest", max_length=100)})
    b.subscribe(PUBSUB, now=T0, prefetch=1)
    b.subscribe(PUBSUB, now=T0, prefetch=1)
    b.publish([Draft(draft.topic, b"first") for _ in range(KEEP + 1)], T0)  # one is delivered
    assert b.topics[draft.topic].group_list[0].ready_count >= KEEP
    b.publish([draft], T0)
    assert kinds(b)[-1] == "Message"
    b.publish([Draft("t", b"plain")], T0)
    assert kinds(b)[-1] == ("Waiting" if draft.topic == "t" else "Message")


def test_a_snapshot_of_waiting_messages_replays_into_the_same_messages_in_the_same_order() -> None:
    b = make()
    codes = b.publish([Draft("t", b"m%d" % i, producer_id="p", dedup_id=f"d{i}") for i in range(9)], T0)
    b.delete(codes[7], T0 + 1)
    assert kinds(b).count("Waiting") == 5
    records = list(replay.state_records(b, T0 + 2))
    assert kinds(b).count("Waiting") == 5  # a snapshot reads them as they are
    fresh = make()
    for record in records:
        replay.apply(fresh, record)
    replay.finish_recovery(fresh, T0 + 3)
    kept = [c for c in codes if c != codes[7]]
    assert [m.code for m in fresh.messages.values()] == kept
    for code in kept:
        old, new = b.messages[code], fresh.messages[code]
        assert (new.data, new.create_time, new.deliver_at, new.producer_id, new.dedup_id) == (
            old.data, old.create_time, old.deliver_at, old.producer_id, old.dedup_id,
        )  # fmt: skip
        assert new.entries["default"].status is Status.READY and new.entries["default"].attempts == 0
    consumer = fresh.subscribe("t", now=T0 + 4, prefetch=100)
    assert pushed_to(fresh, consumer) == kept


def test_searches_and_counts_read_waiting_messages_without_making_them() -> None:
    b = make()
    codes = pub_many(b, "t", 10)
    page = search_messages(b.messages, MessageQuery(topic="t", status="ready"), T0, page=1, size=2)
    assert page.total == 10 and [m.code for m in page.messages] == codes[:-3:-1]
    assert all(type(m) is Message for m in page.messages)  # the page's: made
    assert kinds(b) == ["Message"] * KEEP + ["Waiting"] * 5 + ["Message"] * 2
    assert [m.wire_status(T0) for m in b.messages.held()] == [-1] * 10
    assert [m.code for m in b.messages.newest_first()] == codes[::-1]
    assert kinds(b).count("Waiting") == 5


def test_an_anonymous_subscribers_group_going_away_drops_its_waiting_messages() -> None:
    b = make()
    s = b.subscribe(PUBSUB, now=T0, prefetch=1)
    codes = pub_many(b, PUBSUB, 6)
    assert kinds(b).count("Waiting") == 3
    b.unsubscribe(s.id, T0 + 1)
    assert all(not b.messages[c].live for c in codes if c in b.messages)
    assert b.topics[PUBSUB].live_count == 0


def test_a_new_group_from_the_earliest_message_gets_the_waiting_ones_too() -> None:
    b = make()
    codes = pub_many(b, "t", 6)
    group = b.pull_group("t", "late", T0 + 1, start="earliest")
    assert group.ready_count == 6
    consumer = b.subscribe("t", now=T0 + 2, group="late", prefetch=100)
    assert pushed_to(b, consumer) == codes
    default = b.subscribe("t", now=T0 + 2, prefetch=100)
    assert pushed_to(b, default) == codes and pub(b, "t") not in codes


@pytest.mark.parametrize("lookahead", [replay.LOOKAHEAD, 1])
def test_replay_holds_plain_messages_small_unless_a_record_at_hand_delivers_them(
    monkeypatch: pytest.MonkeyPatch, lookahead: int
) -> None:
    """Records looked at one at a time: every plain message is a ``Waiting`` first, and the
    same state comes out."""
    b = make(journal=True)
    codes = b.publish([Draft("t", b"m%d" % i, producer_id="p") for i in range(6)], T0)
    consumer = b.subscribe("t", now=T0, prefetch=2)
    b.ack(consumer.id, [codes[0]], T0 + 1)  # and the third is delivered
    made: list[int] = []

    def counted(seq: int, *rest: Any) -> Waiting:
        made.append(seq)
        return Waiting(seq, *rest)

    monkeypatch.setattr(replay, "Waiting", counted)
    monkeypatch.setattr(replay, "LOOKAHEAD", lookahead)
    fresh = make()
    replay.apply_all(fresh, b.take_changes())
    assert kinds(fresh) == ["Message"] * 3 + ["Waiting"] * 3
    assert made == ([4, 5, 6] if lookahead > 1 else [1, 2, 3, 4, 5, 6])  # the delivered: messages at once
    assert not fresh.messages[codes[0]].live and fresh.messages[codes[1]].entries["default"].attempts == 1
    assert replay.finish_recovery(fresh, T0 + 2) == 2  # the two in flight, delivered again
    assert kinds(fresh) == ["Message"] * 3 + ["Waiting"] * 3 and group_ready(fresh) == 5
    again = fresh.subscribe("t", now=T0 + 3, prefetch=100)
    assert pushed_to(fresh, again) == codes[1:]
    assert all(fresh.messages[c].producer_id == "p" for c in codes)

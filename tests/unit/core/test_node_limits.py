"""Node-wide limits of the core: the backlog limit in bytes, the prefetch cap,
and the send room that stops deliveries to a consumer whose connection is not reading."""

from __future__ import annotations

import dataclasses

import pytest

from kapok.config import Config
from kapok.core.admission import MESSAGE_OVERHEAD_BYTES
from kapok.core.broker import Broker
from kapok.core.consumers import PUSH_OVERHEAD_BYTES
from kapok.core.model import Draft
from kapok.errors import QueueFullError

T0 = 1_700_000_000.0


def broker(**settings: object) -> Broker:
    return Broker(dataclasses.replace(Config.default().mq.settings(), **settings))  # type: ignore[arg-type]


def test_backlog_limit_refuses_a_batch_whole_and_frees_room_as_messages_finish() -> None:
    cost = 100 + MESSAGE_OVERHEAD_BYTES
    b = broker(max_backlog_bytes=10 * cost)
    b.publish([Draft("t", b"x" * 100) for _ in range(8)], T0)
    assert b.backlog_bytes == 8 * cost
    with pytest.raises(QueueFullError, match="backlog"):
        b.publish([Draft("other", b"x" * 100) for _ in range(3)], T0)  # 11 > 10: none stored
    assert (b.backlog_bytes == 8 * cost and "other" not in b.topics) or not b.topics["other"].live_count
    b.publish([Draft("t", b"x" * 100) for _ in range(2)], T0)  # exactly full is fine
    consumer = b.subscribe("t", now=T0, prefetch=100)
    codes = [e.msg.code for e in b.take_pushes()[consumer.id]]
    b.ack(consumer.id, codes[:5], T0)
    assert b.backlog_bytes == 5 * cost
    b.publish([Draft("t", b"x" * 100) for _ in range(5)], T0)
    b.ack(consumer.id, codes[5:], T0)
    b.ack(consumer.id, [e.msg.code for e in b.take_pushes()[consumer.id]], T0)
    assert b.backlog_bytes == 0


def test_duplicates_do_not_count_toward_the_backlog() -> None:
    cost = 10 + MESSAGE_OVERHEAD_BYTES
    b = broker(max_backlog_bytes=cost)
    (code,) = b.publish([Draft("t", b"y" * 10, dedup_id="a")], T0)
    assert b.publish([Draft("t", b"y" * 10, dedup_id="a")], T0) == [code]  # answered from the filter
    with pytest.raises(QueueFullError):
        b.publish([Draft("t", b"z" * 10, dedup_id="b")], T0)


def test_zero_means_no_backlog_limit_in_the_core() -> None:
    b = broker(max_backlog_bytes=0)
    b.publish([Draft("t", b"x" * 1000) for _ in range(1000)], T0)
    assert b.backlog_bytes == 1000 * (1000 + MESSAGE_OVERHEAD_BYTES)


def test_prefetch_is_capped() -> None:
    b = broker(max_prefetch=20)
    consumer = b.subscribe("t", now=T0, prefetch=1_000_000)
    assert consumer.prefetch == 20
    assert b.set_prefetch(consumer.id, 500, T0) == 20
    assert b.set_prefetch(consumer.id, 7, T0) == 7


def test_deliveries_stop_when_the_send_room_is_used_up_and_resume_when_it_is_given() -> None:
    b = broker()
    per = 100 + PUSH_OVERHEAD_BYTES
    b.publish([Draft("t", b"m" * 100) for _ in range(50)], T0)
    consumer = b.subscribe("t", now=T0, prefetch=1000, room=3 * per)
    assert len(b.take_pushes()[consumer.id]) == 3  # prefetch would allow all 50
    assert consumer.room == 0 and consumer.credit == 0
    b.publish([Draft("t", b"late")], T0)
    assert b.take_pushes() == {}  # nothing while there is no room
    b.set_room(consumer.id, 10 * per + 1, T0)
    assert len(b.take_pushes()[consumer.id]) == 11  # the last one may overshoot by one message
    b.set_room(consumer.id, 1 << 40, T0)
    assert len(b.take_pushes()[consumer.id]) == 37
    b.set_room(999, 5, T0)  # an unknown consumer: nothing happens


def test_a_consumer_without_room_is_skipped_for_one_that_has_some() -> None:
    b = broker()
    stalled = b.subscribe("t", now=T0, prefetch=100, room=0)
    other = b.subscribe("t", now=T0, prefetch=100)
    b.publish([Draft("t", b"x") for _ in range(10)], T0)
    pushes = b.take_pushes()
    assert stalled.id not in pushes and len(pushes[other.id]) == 10

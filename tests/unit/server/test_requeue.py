"""Requeue of a dead letter: ``Broker.finish`` (core) and ``BrokerService.requeue_dead_letter``."""

from __future__ import annotations

import pytest

from kapok.config import Config
from kapok.core.broker import Broker, Settle
from kapok.core.changes import Settled
from kapok.core.model import Draft, Status
from kapok.errors import BadRequestError, BrokerError, NotFoundError
from kapok.service import BrokerService
from kapok.testing.clock import ManualClock

T0 = 1_700_000_000.0


def test_finish_settles_every_open_entry_wherever_it_is() -> None:
    broker = Broker(Config.default().mq.settings(), journal=True)
    (queued,) = broker.publish([Draft("t", b"q")], T0)
    (delayed,) = broker.publish([Draft("t", b"d", delay_s=60)], T0)
    consumer = broker.subscribe("t", now=T0, prefetch=1)
    (held,) = [e.msg.code for e in broker.take_pushes()[consumer.id]]
    (waiting,) = broker.publish([Draft("t", b"w")], T0)
    broker.take_changes()
    assert broker.finish(held, "requeued", T0 + 1)
    # The consumer's credit is free again, so the waiting message goes out in its place.
    assert [e.msg.code for e in broker.take_pushes()[consumer.id]] == [waiting]
    for code in (delayed, waiting):
        assert broker.finish(code, "requeued", T0 + 1)
    for code in (held, delayed, waiting):
        msg = broker.messages[code]
        assert msg.status is Status.CONSUMED and not msg.live
    assert not consumer.held and broker.topics["t"].delayed_count == 0
    assert broker.topics["t"].live_count == 0
    settled = [(c.code, c.reason) for c in broker.take_changes() if isinstance(c, Settled)]
    assert settled == [(held, "requeued"), (delayed, "requeued"), (waiting, "requeued")]
    assert not broker.finish(held, "again", T0 + 2)  # already finished
    assert not broker.finish("0" * 32, "x", T0)
    assert queued == held  # the consumer's one credit took the first message
    broker.tick(T0 + 120)  # the delayed message's timer finds it settled and delivers nothing
    assert broker.take_pushes() == {}


async def test_requeue_republishes_to_the_original_topic_and_settles_the_dead_letter() -> None:
    clock = ManualClock(T0)
    cfg = Config.default()
    service = BrokerService(cfg, clock=clock)
    await service.start()
    try:
        (code,) = service.publish([Draft("jobs", b"work", key="k.1", priority=7)])[0]
        (lease,) = await service.pull("jobs", None, 1, 30.0, 0.0)
        service.settle_in_group("jobs", None, [code], Settle.REJECT)
        (dead,) = [m for m in service.broker.messages.values() if m.topic == "jobs.dlq"]
        assert dead.headers and dead.headers["original_topic"] == "jobs"
        assert service.broker.topics["jobs.dlq"].published == 1  # counted for the console's rates
        new_code, durable = service.requeue_dead_letter(dead.code)
        assert durable is None  # a memory store confirms at once
        again = service.broker.messages[new_code]
        assert (again.topic, again.data, again.key, again.priority) == ("jobs", b"work", "k.1", 7)
        assert again.status is Status.READY and again.attempts == 0
        assert service.broker.topics["jobs"].published == 2
        assert dead.status is Status.CONSUMED and not dead.live
        with pytest.raises(BrokerError, match="already settled"):
            service.requeue_dead_letter(dead.code)
        with pytest.raises(BadRequestError, match="not a dead letter"):
            service.requeue_dead_letter(new_code)
        with pytest.raises(NotFoundError):
            service.requeue_dead_letter("0" * 32)
        assert lease.msg.code == code
    finally:
        await service.aclose()

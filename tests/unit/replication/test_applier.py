"""A slave's lazy mirror: the bounded queue of what is journaled and not applied, its rules
(``Unapplied``), and the applier that runs them (``Applier``: no task needed for the
paths tested here, which are the ones a takeover and a snapshot take)."""

from __future__ import annotations

import pytest

from kapok.config import Config
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.changes import Change
from kapok.core.replay import Mirror
from kapok.replication.applier import Applier
from kapok.replication.session import Append
from kapok.replication.unapplied import Unapplied
from kapok.storage.records import encode_payload

T0 = 1_700_000_000.0
SETTINGS = Config.default().mq.settings()


def _append(first: int, count: int, size: int = 10) -> Append:
    return Append(first, count, b"x" * size)


def _full(queue: Unapplied) -> bool:
    return queue.full  # read anew each time (mypy would narrow the property across asserts)


def test_a_queue_is_due_once_the_link_was_quiet_or_it_is_full() -> None:
    queue = Unapplied(100, max_records=10, max_bytes=1000, quiet_s=0.02, light_records=2)
    assert not queue.due(50.0)  # nothing to apply
    queue.add(_append(100, 4), now=1.0)
    assert queue.end == 104 and queue.applied == 100 and queue.records == 4
    assert not queue.due(1.01) and queue.quiet_at() == pytest.approx(1.02)
    assert queue.due(1.02)  # quiet for quiet_s: the loop is idle
    queue.add(_append(104, 6), now=1.015)
    assert _full(queue) and queue.due(1.015)  # full: apply whatever the link does
    taken = queue.take()
    assert taken is not None and (taken.first_lsn, taken.end) == (100, 104)
    assert queue.applied == 104 and queue.records == 6 and not _full(queue)
    with pytest.raises(ValueError, match="ends at 110"):
        queue.add(_append(111, 1), now=2.0)  # a gap is a bug, never skipped


def test_the_bound_counts_payload_bytes_too() -> None:
    queue = Unapplied(0, max_records=1000, max_bytes=100, quiet_s=0.02, light_records=0)
    queue.add(_append(0, 1, size=60), now=0.0)
    assert not _full(queue)
    queue.add(_append(1, 1, size=60), now=0.0)
    assert _full(queue) and queue.bytes == 120
    queue.take()
    queue.take()
    assert queue.take() is None and queue.bytes == 0 and queue.applied == 2


def test_a_light_load_is_applied_as_it_comes_a_heavy_one_once_the_link_is_quiet() -> None:
    queue = Unapplied(0, max_records=10_000, max_bytes=1 << 20, quiet_s=0.1, light_records=100)
    queue.add(_append(0, 40), now=1.0)
    assert queue.due(1.0)  # 40 records in this window and none before: light
    queue.add(_append(40, 40), now=1.05)
    assert queue.due(1.05)  # 80
    queue.add(_append(80, 40), now=1.12)  # a new window, the one before had 80: 120 in two
    assert not queue.due(1.12) and queue.due(1.23)  # heavy: wait for a quiet link
    queue.add(_append(120, 80), now=1.25)  # 40 in the window before, 80 in this one
    assert not queue.due(1.25)
    queue.add(_append(200, 10), now=1.50)  # a window went by empty: light again
    assert queue.due(1.50)


def _master_log() -> tuple[Broker, list[list[Change]]]:
    """A master's log in three batches: publishes, a delivery and an ack, a delete."""
    master = Broker(SETTINGS, journal=True)
    batches = []
    codes = master.publish([Draft("jobs", b"a"), Draft("jobs", b"b"), Draft("news", b"c")], T0)
    batches.append(master.take_changes())
    [lease] = master.pull("jobs", None, 1, 30.0, T0 + 1)
    master.settle_in_group("jobs", None, [lease.msg.code], Settle.ACK, T0 + 2)
    batches.append(master.take_changes())
    master.delete(codes[2], T0 + 3)
    batches.append(master.take_changes())
    return master, batches


def _journal(applier: Applier, batches: list[list[Change]], first: int = 0) -> int:
    for records in batches:
        applier.journaled(Append(first, len(records), encode_payload(records)))
        first += len(records)
    return first


async def test_journaled_batches_wait_until_a_catch_up_applies_them_all() -> None:
    master, batches = _master_log()
    mirror = Mirror(Broker(SETTINGS))
    applier = Applier(mirror, 0, lambda: T0)
    end = _journal(applier, batches)
    assert len(mirror.broker.messages) == 0  # journaled, acked, not applied
    assert applier.records == end and applier.queue.end == end
    await applier.catch_up()
    assert applier.records == 0 and applier.queue.applied == end
    assert set(mirror.broker.messages) == set(master.messages)
    assert [m.live for m in mirror.broker.messages.values()] == [m.live for m in master.messages.values()]


async def test_over_its_bound_the_follower_applies_the_oldest_before_it_reads_on() -> None:
    _, batches = _master_log()
    mirror = Mirror(Broker(SETTINGS))
    first = len(batches[0])
    applier = Applier(mirror, 0, lambda: T0, max_records=first + 1)
    _journal(applier, batches[:1])  # under the bound
    assert applier.records == first and len(mirror.broker.messages) == 0
    _journal(applier, batches[1:2], first=first)  # over it: the oldest batches are applied at once
    assert applier.records <= first and len(mirror.broker.messages) == 3


async def test_a_batch_that_cannot_be_applied_is_skipped_and_said(caplog: pytest.LogCaptureFixture) -> None:
    _, batches = _master_log()
    mirror = Mirror(Broker(SETTINGS))
    applier = Applier(mirror, 0, lambda: T0)
    records = batches[0]
    applier.journaled(Append(0, len(records) + 1, encode_payload(records)))  # claims one more
    applier.journaled(Append(len(records) + 1, 1, b"\x09garbage"))
    await applier.catch_up()
    assert applier.failed is not None and f"held {len(records)}" in applier.failed
    assert len(mirror.broker.messages) == 0
    assert sum("cannot be applied" in r.message for r in caplog.records) == 1  # once, not per batch

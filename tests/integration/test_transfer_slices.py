"""A full transfer taken in slices while the master keeps changing.

The master's snapshot is walked a slice at a time, the event loop serving clients in
between, so messages are published, leased, acked, requeued, dead-lettered and deleted
while it is taken: some before the walk reaches them, some after. Replaying the log from
the snapshot's LSN on top of it must still give the slave exactly the master's state.
Here the transfer is paused between two slices (its encoding, on a worker thread, waits)
while the test changes the master, twice; then the two brokers are compared.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tests.integration.conftest import Start

from kapok.core.broker import Broker, Settle
from kapok.core.model import Draft
from kapok.replication import transfer
from kapok.testing import eventually
from kapok.testing.slow import scaled

T = scaled(10.0)  # upper bound of every wait
JOBS = 3000  # with 100-byte payloads, far more log than the master's 64 KiB backlog
LATE = 20  # published last: the walk reaches them last
PAUSES = (1, 15)  # the slices before which the test changes the master (100 records each)

pytestmark = pytest.mark.timeout(60)

SETS = ("replication.mode=async", "replication.backlog_bytes=65536")


class Pauses:
    """Holds the transfer's encoding of the slices in ``PAUSES`` until the test lets it go."""

    def __init__(self) -> None:
        self.slices = 0
        self.reached = {n: threading.Event() for n in PAUSES}
        self.go = {n: threading.Event() for n in PAUSES}
        self._encode = transfer._snapshot_frame

    def encode(self, records: list[Any]) -> bytes:  # on the executor's thread
        n, self.slices = self.slices, self.slices + 1
        if n in self.reached:
            self.reached[n].set()
            assert self.go[n].wait(T), "the test never let the transfer go on"
        return self._encode(records)

    async def at(self, n: int) -> None:
        await eventually(self.reached[n].is_set, timeout_s=T, what=f"the transfer's slice {n}")

    def release_all(self) -> None:
        for event in self.go.values():
            event.set()


def state(broker: Broker) -> dict[str, Any]:
    """What a mirror must agree on with its master: every message, and per durable group
    whether its entry is final (and how) or open, and how often it was delivered."""
    messages = {
        code: (
            msg.topic, msg.seq, msg.data, msg.dedup_id, msg.live,
            sorted(
                (e.group.name, e.status.value if e.status.final else "open", e.attempts)
                for e in msg.all_entries() if e.group.durable
            ),
        )
        for code, msg in broker.messages.items()
    }  # fmt: skip
    return {
        "messages": messages,
        "dedup": sorted(broker.admission.dedup.items()),
        "next_seq": broker.next_seq,
    }


async def test_a_snapshot_taken_in_slices_while_the_master_changes_ends_exact(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transfer, "SLICE_RECORDS", 100)
    monkeypatch.setattr(transfer, "SLICE_S", 10.0)  # slices end by count only: the walk's place is known
    pauses = Pauses()
    monkeypatch.setattr(transfer, "_snapshot_frame", pauses.encode)
    master = await start("m", *SETS)
    service = master.service
    jobs: list[str] = []
    for first in range(0, JOBS, 500):
        drafts = [Draft("jobs", f"{i:0100d}".encode(), dedup_id=f"d{i}" if i % 7 == 0 else "") for i in
                  range(first, first + 500)]  # fmt: skip
        codes, durable = service.publish(drafts)
        jobs += codes
        if durable is not None:
            await durable  # one WAL batch each: the backlog lets go of the first ones
    late = service.publish([Draft("late", f"late {i}".encode()) for i in range(LATE)])[0]

    slave = await start("s", "replication.role=slave", f"replication.master={master.url}", *SETS)
    leader = master.replication.leader
    assert leader is not None

    # Slice 1: about 200 records walked, all of them jobs of the first batch.
    await pauses.at(1)
    fresh = service.publish([Draft("jobs", f"fresh {i}".encode(), dedup_id=f"f{i}") for i in range(50)])[0]
    leased = [e.msg.code for e in await service.pull("jobs", None, 20, 30.0, 0.0)]
    assert leased == jobs[:20]  # walked already
    assert service.settle_in_group("jobs", None, leased[:10], Settle.ACK) == []
    assert service.settle_in_group("jobs", None, leased[10:15], Settle.REQUEUE) == []
    assert service.settle_in_group("jobs", None, leased[15:], Settle.REJECT) == []  # to jobs.dlq
    assert service.delete(jobs[30]) and service.delete(jobs[2500])  # walked, and not yet
    late_leased = [e.msg.code for e in await service.pull("late", None, 10, 30.0, 0.0)]
    assert late_leased == late[:10]  # not walked yet: the snapshot will hold their ack
    assert service.settle_in_group("late", None, late_leased[:5], Settle.ACK) == []

    # Slice 15: about 1,500 walked.
    pauses.go[1].set()
    await pauses.at(15)
    assert service.delete(jobs[2600]) and service.delete(fresh[0])  # not walked; never walked
    again = [e.msg.code for e in await service.pull("jobs", None, 10, 30.0, 0.0)]
    assert sorted(again[:5]) == leased[10:15]  # the requeued ones, delivered a second time
    assert service.settle_in_group("jobs", None, again, Settle.ACK) == []
    more_late = [e.msg.code for e in await service.pull("late", None, 5, 30.0, 0.0)]
    assert service.settle_in_group("late", None, more_late, Settle.ACK) == []
    service.publish([Draft("jobs", f"last {i}".encode()) for i in range(10)])
    pauses.release_all()

    await eventually(lambda: leader.link_up and leader.caught_up(), timeout_s=T, what="the slave catching up")
    assert leader.full_transfers == 1
    assert pauses.slices > max(PAUSES)
    expected = state(master.broker)
    assert state(slave.broker) == expected
    # The changes made during the transfer are all there (the comparison is not vacuous).
    messages = expected["messages"]
    assert jobs[30] not in messages and jobs[2500] not in messages and fresh[0] not in messages
    assert messages[leased[0]][5] == [("default", "consumed", 1)]
    assert messages[leased[10]][5] == [("default", "consumed", 2)]
    assert messages[leased[15]][5] == [("default", "dead", 1)]
    assert messages[late[5]][5] == [("default", "open", 1)]
    assert sum(m[0] == "jobs.dlq" for m in messages.values()) == 5

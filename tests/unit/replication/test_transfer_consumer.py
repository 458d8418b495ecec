"""A delivery's consumer in a full state transfer and in the diverged records
(``kapok.replication.transfer``): the slave gets every shape of ``Delivered`` record as it
was, and an operator reads the consumer among the records set aside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from kapok.core import changes as ch
from kapok.protocol.sync import SNAPSHOT
from kapok.replication import transfer
from kapok.storage.records import decode_frames

T0 = 1_700_000_000.0
CODE = "018bcfe5680000000000000000000001"

RECORDS: list[ch.Change] = [
    ch.Published(1, CODE, "jobs", b"d", "", 0, T0, T0, 0.0, "p", "", None, ("a", "b", "c", "d")),
    ch.Delivered(CODE, "jobs", "a", 1, T0),  # before claims and consumers
    ch.Delivered(CODE, "jobs", "b", 1, T0, "spark:q1", 30.0),  # claimed, no consumer
    ch.Delivered(CODE, "jobs", "c", 1, T0, consumer="alice"),
    ch.Delivered(CODE, "jobs", "d", 2, T0, "spark:q1", 30.0, "bob"),
]


class Link:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.controls: list[tuple[str, dict[str, Any]]] = []

    async def send_binary(self, data: bytes) -> None:
        self.frames.append(data)

    async def send_control(self, op: str, **fields: Any) -> None:
        self.controls.append((op, fields))


async def test_a_full_transfer_carries_each_delivery_s_consumer() -> None:
    link = Link()
    count, _ = await transfer.send_transfer(link, iter(RECORDS), 9)
    assert count == len(RECORDS)
    received: list[ch.Change] = []
    for data in link.frames:  # what the slave writes to its snapshot file, as it comes
        assert data[:1] == SNAPSHOT
        decoded = decode_frames(data[1:])
        assert decoded.problem is None
        received += decoded.records
    assert received == RECORDS
    assert [r.consumer for r in received if isinstance(r, ch.Delivered)] == ["", "", "alice", "bob"]
    assert link.controls == [("snapshot_end", {"lsn": 9})]


def test_diverged_records_show_the_consumer(tmp_path: Path) -> None:
    path = tmp_path / "diverged" / "diverged-epoch2-lsn7.jsonl"
    assert transfer.write_diverged(RECORDS, path) == (5, 1)
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(row["group"], row["consumer"]) for row in rows if row["type"] == "delivered"] == [
        ("a", ""),
        ("b", ""),
        ("c", "alice"),
        ("d", "bob"),
    ]

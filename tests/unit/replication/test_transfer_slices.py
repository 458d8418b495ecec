"""``send_transfer``: the master's snapshot goes out in slices, encoded off the event loop,
never ahead of what the link has taken."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kapok.core import changes as ch
from kapok.protocol.sync import SNAPSHOT
from kapok.replication import transfer
from kapok.storage.records import decode_frames

T0 = 1_700_000_000.0


def published(n: int, size: int = 8) -> list[ch.Change]:
    return [
        ch.Published(i, f"code{i}", "jobs", b"x" * size, "", 0, T0, T0, 0.0, "", "", None, ("default",))
        for i in range(n)
    ]


class FakeLink:
    """A link that keeps what is sent; ``gate`` (when given) holds every binary send."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.frames: list[bytes] = []
        self.controls: list[tuple[str, dict[str, Any]]] = []

    async def send_binary(self, data: bytes) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.frames.append(data)

    async def send_control(self, op: str, **fields: Any) -> None:
        self.controls.append((op, fields))

    def records(self) -> list[ch.Change]:
        out: list[ch.Change] = []
        for data in self.frames:
            assert data[:1] == SNAPSHOT
            decoded = decode_frames(data[1:])
            assert decoded.problem is None
            out += decoded.records
        return out


class Counted:
    """An iterator that counts how far it has been walked."""

    def __init__(self, records: list[ch.Change]) -> None:
        self._it = iter(records)
        self.taken = 0

    def __iter__(self) -> Iterator[ch.Change]:
        return self

    def __next__(self) -> ch.Change:
        record = next(self._it)
        self.taken += 1
        return record


async def test_the_state_goes_out_whole_in_slices_then_snapshot_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transfer, "SLICE_RECORDS", 100)
    records = [ch.Checkpoint(1001, T0), ch.GroupCreated("jobs", "g", T0), *published(1000)]
    link = FakeLink()
    count, size = await transfer.send_transfer(link, iter(records), 42)
    assert link.records() == records
    assert count == len(records) and size == sum(map(len, link.frames))
    assert len(link.frames) == 11  # 100 records a slice at most
    assert link.controls == [("snapshot_end", {"lsn": 42})]


async def test_an_empty_state_sends_only_snapshot_end() -> None:
    link = FakeLink()
    assert await transfer.send_transfer(link, iter([]), 7) == (0, 0)
    assert link.frames == [] and link.controls == [("snapshot_end", {"lsn": 7})]


def test_a_slice_ends_at_its_count_its_bytes_or_its_time() -> None:
    records = published(100, size=1000)
    assert len(transfer._take_slice(iter(records), 10.0, 30, 10**9)) == 30
    # Bytes: the message that reaches the limit is the slice's last.
    assert len(transfer._take_slice(iter(records), 10.0, 1000, 2500)) == 3
    # Time: the clock is looked at every _CLOCK_EVERY records; here each look moves it 1 s.
    ticks = itertools.count()
    taken = transfer._take_slice(iter(records), 2.5, 1000, 10**9, clock=lambda: float(next(ticks)))
    assert len(taken) == 3 * transfer._CLOCK_EVERY
    assert transfer._take_slice(iter([]), 1.0, 10, 10) == []


async def test_the_walk_never_runs_ahead_of_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slave that does not read holds the walk back: aiohttp's send_bytes waits for the
    transport to drain, and nothing more is taken from the state meanwhile."""
    monkeypatch.setattr(transfer, "SLICE_RECORDS", 50)
    gate = asyncio.Event()
    link = FakeLink(gate)
    walk = Counted(published(500))
    sending = asyncio.ensure_future(transfer.send_transfer(link, walk, 1))
    for _ in range(100):  # the loop turns; the first send waits on the gate
        await asyncio.sleep(0)
    assert walk.taken == 50 and link.frames == [] and not sending.done()
    gate.set()
    assert (await sending)[0] == 500
    assert walk.taken == 500


async def test_slices_are_encoded_off_the_loop_and_the_loop_runs_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transfer, "SLICE_RECORDS", 10)
    threads: set[int] = set()
    encode = transfer._snapshot_frame

    def spy(records: list[ch.Change]) -> bytes:
        threads.add(threading.get_ident())
        return encode(records)

    monkeypatch.setattr(transfer, "_snapshot_frame", spy)
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    ticker = asyncio.ensure_future(other_work())
    try:
        link = FakeLink()
        await transfer.send_transfer(link, iter(published(200)), 1)
    finally:
        ticker.cancel()
    assert len(link.frames) == 20
    assert threads and threading.get_ident() not in threads
    assert turns >= 20  # other tasks ran at least once a slice

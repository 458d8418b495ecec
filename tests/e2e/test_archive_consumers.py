"""Per-consumer deliveries in the archive, on real processes, through a takeover.

A master and its slave (async replication, so the slave takes publishes alone once it
leads) and two ``kapok.client.Consumer`` of one group, named ``alice`` and ``bob``. Every
message published to the master is received by one of them; the master's ``delivered``
archive lines name, for each message, exactly the consumer that received it, and both
names appear. The Delivered records the slave received over the replication link carry
the names too (read from its WAL). Then the master's process gets SIGKILL, the slave
takes over, both consumers follow it, and the slave's own archive names them in the same
way for what it delivers. Old nodes wrote no ``consumer``: every assertion on it fails there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from kapok.client import Consumer
from kapok.core import changes as ch
from kapok.errors import KapokError
from kapok.launch import NodeProcess, get_json, group_members, stop_all, wait_for
from kapok.storage.archive import list_archive_files, read_archive_file
from kapok.storage.events import Event
from kapok.storage.records import FrameReader
from kapok.storage.segments import list_segments
from kapok.testing.nodehttp import metric, publish
from kapok.testing.pair import start_pair, state_of
from kapok.testing.poll import eventually
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(scaled(300))]

TIMEOUT_S = 1.0  # replication.failover_timeout_s of the pair
DEADLINE_S = scaled(30.0)
TOPIC, GROUP = "jobs", "workers"
NAMES = ("alice", "bob")
N = 20  # messages in each period: while the master leads, then while the slave does
FAST: dict[str, Any] = {"backoff_cap_s": 0.5, "refresh_interval_s": 0.5, "prefetch": 1}

Receipt = tuple[str, str]  # (consumer, code)


async def _take(consumer: Consumer, received: list[Receipt]) -> None:
    """Receive and ack until cancelled, noting who got what."""
    async for message in consumer:
        received.append((consumer.name, message.code))
        # Settled on the node before the test goes on; if its node went away, the message
        # is delivered again (and noted again).
        with contextlib.suppress(KapokError):
            await message.ack(wait=True)


async def _both_subscribed(url: str) -> bool:
    """Both consumers subscribed to the group on the node at ``url``."""
    stats: dict[str, Any] = await asyncio.to_thread(get_json, url, f"/v1/topics/{TOPIC}", key="test") or {}
    subscribed: int = sum(g["consumers"] for g in stats.get("groups", []) if g["name"] == GROUP)
    return subscribed == len(NAMES)


def _archive(workdir: Path) -> list[Event]:
    directory = workdir / "data" / "archive"
    return [e for f in list_archive_files(directory) for e in read_archive_file(f.path)]


def _delivered(events: Iterable[Event], codes: set[str]) -> set[Receipt]:
    """(consumer, code) of every ``delivered`` event of ``codes`` ("" for one without a consumer)."""
    delivered = (e for e in events if e["ev"] == "delivered" and e["code"] in codes)
    return {(e.get("consumer", ""), e["code"]) for e in delivered}


def _replicated(workdir: Path) -> dict[str, str]:
    """Every delivered code's consumer in the records the node holds in its WAL."""
    out: dict[str, str] = {}
    for segment in list_segments(workdir / "data" / "wal"):
        for record in FrameReader(segment.path.read_bytes()):  # stops at a torn tail
            if isinstance(record, ch.Delivered):
                out[record.code] = getattr(record, "consumer", "")
    return out


def _settled_archive_feed(url: str) -> None:
    """Wait until the node has handed its archiver every frame written so far: the bytes
    fed stay the same over several reads (the WAL hands frames over every 25 ms at most)."""
    seen: list[float] = []

    def steady() -> bool:
        seen.append(metric(url, "kapok_storage_archive_bytes_fed_total", -1.0))
        return len(seen) > 5 and seen[-1] >= 0 and seen[-1] == seen[-5]

    wait_for(steady, DEADLINE_S, 0.05)


def _publish(url: str, period: str) -> set[str]:
    status, answer = publish(url, *(f"{period} {i}" for i in range(N)), topic=TOPIC)
    assert status == 200, answer
    return set(answer["codes"])


async def test_each_consumer_is_named_in_the_archive_on_the_master_and_on_the_slave_that_took_over(
    tmp_path: Path,
) -> None:
    master, slave = await asyncio.to_thread(
        start_pair, tmp_path, mode="async", profile="fast", failover_timeout_s=TIMEOUT_S
    )
    nodes: list[NodeProcess] = [master, slave]
    received: list[Receipt] = []
    try:
        seeds = [master.url, slave.url]
        alice = Consumer(seeds, topic=TOPIC, group=GROUP, name="alice", **FAST)
        bob = Consumer(seeds, topic=TOPIC, group=GROUP, name="bob", **FAST)
        async with alice, bob:
            takers = [asyncio.create_task(_take(c, received)) for c in (alice, bob)]
            try:
                await eventually(lambda: _both_subscribed(master.url), timeout_s=DEADLINE_S)
                before = await asyncio.to_thread(_publish, master.url, "before")
                await eventually(lambda: before <= {code for _, code in received}, timeout_s=DEADLINE_S)

                # The slave holds everything (the acks too), and the archiver was fed it all.
                def caught_up() -> bool:
                    lag = state_of(master).get("lag") or {}
                    return lag.get("records") == 0 and before <= set(_replicated(slave.workdir))

                await asyncio.to_thread(wait_for, caught_up, DEADLINE_S, 0.05)
                await asyncio.to_thread(_settled_archive_feed, master.url)
                replicated = await asyncio.to_thread(_replicated, slave.workdir)
                # SIGKILL to the node alone: its archiver reads to the end of the pipe and
                # writes out what it was given, then exits.
                os.kill(master.pid, signal.SIGKILL)
                await asyncio.to_thread(wait_for, lambda: group_members(master.pid) == [], DEADLINE_S, 0.05)
                await asyncio.to_thread(master.kill)  # reaps it

                def leads() -> bool:
                    return bool((get_json(slave.url, "/health") or {}).get("active"))

                await asyncio.to_thread(wait_for, leads, DEADLINE_S, 0.05)
                await eventually(lambda: _both_subscribed(slave.url), timeout_s=DEADLINE_S)
                after = await asyncio.to_thread(_publish, slave.url, "after")
                await eventually(lambda: after <= {code for _, code in received}, timeout_s=DEADLINE_S)
            finally:
                for task in takers:
                    task.cancel()
                await asyncio.gather(*takers, return_exceptions=True)
        assert await asyncio.to_thread(slave.stop, scaled(30.0)) == 0  # its archiver writes everything
    finally:
        await asyncio.to_thread(stop_all, nodes)

    got = set(received)
    on_master = _delivered(_archive(master.workdir), before)
    assert on_master == {(name, code) for name, code in got if code in before}
    assert {name for name, _ in on_master} == set(NAMES)  # both worked, each under its name

    assert {(replicated[code], code) for code in before} == on_master  # as the link carried them

    on_slave = _delivered(_archive(slave.workdir), after)
    assert on_slave == {(name, code) for name, code in got if code in after}
    assert {name for name, _ in on_slave} == set(NAMES)

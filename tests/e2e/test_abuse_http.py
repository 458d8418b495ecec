"""More attacks on a live node, each shown to be bounded (see ``test_abuse.py``, whose
helpers these use): KapokMQ handshakes that never show the key, and request bodies of
unknown length (chunked) far over the limit.

Each test starts a real ``kapok serve``, publishes ``KEPT`` confirmed messages, attacks
it, then checks that a normal producer and consumer still work, that the node's RSS
stayed under the test's bound, and that every confirmed message is still there. The RSS
figures are printed (run with ``-s``): before the attack, at its peak, after.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from tests.e2e.test_abuse import ENDED, KEPT, T, after_attack, launch, metric, nodes, publish, rss_mb, session
from tests.integration.test_http_limits import stream_chunked

from kapok.launch import NodeProcess
from kapok.protocol.kapokmq import ASK_KEY
from kapok.testing.slow import scaled

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

__all__ = ["nodes", "session"]  # fixtures of test_abuse.py, used here

MB = 1e6


@contextlib.asynccontextmanager
async def peak_rss(node: NodeProcess) -> AsyncIterator[list[float]]:
    """Samples the node's RSS (MB) every 50 ms while the block runs: ``[peak]``."""
    peak = [rss_mb(node)]

    async def sample() -> None:
        while True:
            with contextlib.suppress(AssertionError):
                peak[0] = max(peak[0], rss_mb(node))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler


# ---------------------------------------------------------------- 8. silent KapokMQ handshakes


async def test_8_a_flood_of_silent_kapokmq_handshakes_is_timed_out_and_counted(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path, "server.auth_timeout_s=1")
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    flood = 300
    async with (
        peak_rss(node) as peak,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as attacker,
    ):

        async def silent(i: int) -> None:
            kind = "Producers" if i % 2 else "Consumers"
            async with attacker.ws_connect(f"{node.ws_url}/{kind}/Conn/t/silent{i}") as ws:
                assert (await ws.receive(timeout=T)).data == ASK_KEY  # ... and never a key
                msg = await ws.receive(timeout=T)
                assert msg.type in ENDED, msg

        await asyncio.gather(*(silent(i) for i in range(flood)))
    # Each counted once, by the handshake that gave up (the sweep's backstop never saw it).
    counted = await metric(session, node, 'kapok_connections_closed_total{reason="handshake_timeout"}')
    assert counted == flood
    await asyncio.sleep(0)  # the print below is the figures' only record
    print(f"\nsilent handshakes: RSS peak {peak[0]:.0f} MB")
    await after_attack(session, node, kept, before + 40, before, f"{flood} silent KapokMQ handshakes")


# ---------------------------------------------------------------- 9. chunked bodies over the limit


async def test_9_chunked_bodies_far_over_the_limit_are_cut_off_at_the_limit(
    nodes: list[NodeProcess], tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    node = launch(nodes, tmp_path)
    kept = await publish(session, node, "kept", KEPT)
    before = rss_mb(node)
    port = int(node.url.rsplit(":", 1)[1])
    limit = 9 * MB  # about what the defaults allow (8.9 MB): frame_limit(1 MiB, 100)
    heads = [
        "POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test\r\n"
        "Content-Type: application/json\r\n",
        "POST /Producer/Send HTTP/1.1\r\nHost: x\r\nsecretKey: test\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n",
    ] * 2
    async with peak_rss(node) as peak:
        results = await asyncio.wait_for(
            asyncio.gather(*(stream_chunked(port, head, 50 * 2**20) for head in heads)), scaled(60)
        )
    for sent, got, closed in results:
        assert sent < limit + 16 * MB, f"{sent / MB:.0f} MB of a 50 MB body went out: the node kept reading"
        assert got.startswith(b"HTTP/1.1 413 ") and b"message_too_large" in got, got[:300]
        assert closed
    sent_mb = [round(sent / MB, 1) for sent, _, _ in results]
    print(f"\nchunked 50 MB bodies: {sent_mb} MB of each sent; RSS peak {peak[0]:.0f} MB")
    assert peak[0] < before + 80, f"RSS peaked at {peak[0]:.0f} MB"
    await after_attack(session, node, kept, before + 40, before, "chunked bodies over the limit")

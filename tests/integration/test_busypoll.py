"""Busy polling on a real node (``server.busy_poll_us``): a client that waits for each answer
keeps the loop polling, a trickle never does, and 0 turns it off; ``/metrics`` tells the cost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from kapok.server.busypoll import BusyPoll
from kapok.server.keys import BUSY_POLL
from kapok.testing import eventually
from kapok.testing.nodehttp import scrape_metric
from kapok.testing.slow import scaled

T = scaled(5.0)
_METRIC = "kapok_busy_poll_seconds_total"


async def _pings(ws: aiohttp.ClientWebSocketResponse, n: int, gap_s: float = 0.0) -> None:
    for i in range(n):
        await ws.send_str(f'{{"op": "ping", "id": {i}}}')
        assert (await ws.receive(timeout=T)).json() == {"op": "pong", "id": i}
        if gap_s:
            await asyncio.sleep(gap_s)  # the traffic's shape, not a wait for a condition


async def test_request_after_request_keeps_the_loop_polling(make_node: Any, auth: dict[str, str]) -> None:
    # A window of 50 ms: a round trip on loopback is far shorter, even on a busy machine.
    node = await make_node("server.busy_poll_us=50000")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth) as ws:
            await _pings(ws, 40)
        poll = node.app[BUSY_POLL]
        # The polling ends 50 ms after the last data; only then are its seconds counted.
        await eventually(lambda: poll.seconds > 0, what="a polling period")
        assert (await scrape_metric(session, node.url, _METRIC, None) or 0.0) >= poll.seconds > 0


async def test_a_trickle_never_polls(make_node: Any, auth: dict[str, str]) -> None:
    node = await make_node("server.busy_poll_us=200")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth) as ws:
            await _pings(ws, 15, gap_s=0.02)
        assert node.app[BUSY_POLL].seconds == 0.0
        assert await scrape_metric(session, node.url, _METRIC, None) == 0.0


async def test_zero_turns_it_off(make_node: Any, auth: dict[str, str]) -> None:
    node = await make_node("server.busy_poll_us=0")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{node.ws_url}/v1/ws", headers=auth) as ws:
            await _pings(ws, 40)
        assert BUSY_POLL not in node.app
        assert await scrape_metric(session, node.url, _METRIC, None) is None


async def test_polling_stops_when_the_core_goes_to_other_work() -> None:
    window_s = 0.05
    poll = BusyPoll(window_s)
    for _ in range(20):  # dense data: polling starts
        poll.heard()
    await asyncio.sleep(0)
    started = poll.polling
    assert started
    taken_until = time.monotonic() + 2 * window_s  # the loop does not run for two windows
    while time.monotonic() < taken_until:  # (its core was taken), bounded by the clock
        pass
    poll.heard()  # data came meanwhile, so the window is open again
    for _ in range(3):
        await asyncio.sleep(0)
    assert not poll.polling  # a contended core: polling would only take from the others
    assert poll.seconds >= 2 * window_s

"""The client's time bounds against nodes that stop answering.

* A publish to a node frozen with SIGSTOP (a real ``kapok serve``, the producer connected
  before the freeze) raises within ``publish_timeout_s`` + 1 s, with a reason.
* The same against a server that accepts the WebSocket and then answers nothing (no
  ``puback``, no ``pong``): an in-test aiohttp app that names itself the one master.
* Discovery from a seed that accepts TCP and never answers HTTP fails with a message that
  names the seed and the reason (a time-out), not an empty one.
* Cancelling a task inside ``async with Producer(...)`` while messages are in flight to a
  frozen node ends the task within 1 s: cancelled, and the producer closed.
* A seed with nothing listening: ``start()`` raises, the client is CLOSED and every
  aiohttp session it opened is closed.

The bounds (``publish_timeout_s`` + 1 s; 1 s for a cancel) are what these tests are about,
so they are asserted; only their slack (the 1 s) is scaled by ``KAPOK_TEST_SLOW``. Each
wait is capped well beyond its bound, so a client that misses a bound fails with the time
it took instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.client import Consumer, Producer, Status
from kapok.client.base import ClientBase
from kapok.errors import KapokError
from kapok.launch import NodeProcess, start_node
from kapok.testing.poll import eventually
from kapok.testing.slow import scaled

pytestmark = pytest.mark.timeout(120)

PUBLISH_TIMEOUT_S = 2.0  # the producer's publish_timeout_s in these tests
SLACK_S = scaled(1.0)  # what a bound may be missed by (1 s on an ordinary machine)
CAP_S = scaled(40.0)  # how long a test waits for a call that should have ended long before
NAME = "solo"  # server.name of the frozen node


class FrozenNode:
    """A real ``kapok serve`` that the test can freeze (SIGSTOP) and thaw (SIGCONT)."""

    def __init__(self, proc: NodeProcess) -> None:
        self.proc = proc
        self.frozen = False

    @property
    def url(self) -> str:
        return self.proc.url

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.frozen:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.frozen = False


@pytest.fixture
def node(tmp_path: Path) -> Iterator[FrozenNode]:
    frozen = FrozenNode(start_node(tmp_path / NAME, f"server.name={NAME}"))
    try:
        yield frozen
    finally:
        frozen.thaw()  # a stopped process would not see the SIGTERM
        frozen.proc.stop()


async def _outcome(call: Coroutine[Any, Any, object], cap_s: float = CAP_S) -> tuple[float, object]:
    """Run ``call`` for at most ``cap_s``: the seconds it took and what it returned or raised
    (a string saying so when it had not ended by then; it is cancelled)."""
    task = asyncio.ensure_future(call)
    started = time.monotonic()
    await asyncio.wait({task}, timeout=cap_s)
    elapsed = time.monotonic() - started
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return elapsed, f"still waiting after {cap_s:g} s"
    if task.cancelled():
        return elapsed, "cancelled"
    exc = task.exception()
    return elapsed, exc if exc is not None else task.result()


def _check_failed_in_time(what: str, elapsed: float, outcome: object) -> None:
    print(f"\n{what}: {elapsed:.2f} s (bound {PUBLISH_TIMEOUT_S:g} + {SLACK_S:g} s): {outcome!r}")
    assert isinstance(outcome, KapokError), f"{what}: after {elapsed:.2f} s: {outcome!r}"
    message = str(outcome).strip()
    assert message and not message.endswith(":"), f"{what}: no reason given: {outcome!r}"
    assert elapsed <= PUBLISH_TIMEOUT_S + SLACK_S, f"{what}: raised after {elapsed:.2f} s: {outcome!r}"


# ---------------------------------------------------------------- publishing to a node that went silent


async def test_a_publish_to_a_frozen_node_fails_within_publish_timeout(node: FrozenNode) -> None:
    producer = Producer(node.url, topic="frozen", publish_timeout_s=PUBLISH_TIMEOUT_S)
    async with producer:
        await asyncio.wait_for(producer.publish("before"), scaled(10.0))
        assert producer.status is Status.CONNECTED
        node.freeze()
        try:
            elapsed, outcome = await _outcome(producer.publish("during"))
        finally:
            node.thaw()  # the producer closes against a live node
    _check_failed_in_time("publish to a frozen node", elapsed, outcome)


class SilentNode:
    """An aiohttp app that says, on ``/cluster/nodes``, that it is the cluster's one master,
    and on ``/v1/ws`` accepts the upgrade and then reads and answers nothing (no reply, no
    pong) until ``release``d."""

    def __init__(self) -> None:
        self.url = ""
        self.upgrades = 0
        self.release = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/cluster/nodes", self._nodes)
        self.app.router.add_get("/v1/ws", self._ws)

    async def _nodes(self, request: web.Request) -> web.Response:
        row = {
            "name": "silent", "http_url": self.url, "gossip_addr": "127.0.0.1:1", "state": "alive",
            "incarnation": 1, "role": "master", "pair": None, "pair_id": "silent", "epoch": 1,
            "active": True, "load": 0.0,
        }  # fmt: skip
        return web.json_response([row])

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        self.upgrades += 1
        await self.release.wait()
        await ws.close()
        return ws


async def test_a_publish_to_a_node_that_never_answers_fails_within_publish_timeout(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    silent = SilentNode()
    server = await aiohttp_server(silent.app, host="127.0.0.1", port=0)
    silent.url = str(server.make_url("")).rstrip("/")
    try:
        async with Producer(silent.url, topic="silent", publish_timeout_s=PUBLISH_TIMEOUT_S) as producer:
            try:
                elapsed, outcome = await _outcome(producer.publish("unanswered"))
            finally:
                silent.release.set()  # the producer closes against a server that answers its close
    finally:
        silent.release.set()
    assert silent.upgrades >= 1  # the producer did connect and write to it
    _check_failed_in_time("publish to a node that never answers", elapsed, outcome)


# ---------------------------------------------------------------- discovery


@pytest.fixture
def mute_seed() -> Iterator[str]:
    """A seed URL whose port accepts TCP connections (the kernel's backlog completes them)
    and never answers: nothing ever accepts or reads them."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_discovery_time_out_names_its_reason(mute_seed: str) -> None:
    connect_timeout_s = 1.0
    producer = Producer(mute_seed, topic="mute", connect_timeout_s=connect_timeout_s)
    elapsed, outcome = await _outcome(producer.start())
    print(f"\ndiscovery from a mute seed: {elapsed:.2f} s: {outcome!r}")
    assert isinstance(outcome, KapokError), outcome
    message = str(outcome)
    assert mute_seed in message
    reason = message.split(mute_seed, 1)[1].lstrip(": ").strip()
    assert reason, f"the reason is empty: {message!r}"
    assert re.search(r"time[sd]?[ -]?out|within", reason, re.IGNORECASE), message
    assert elapsed <= connect_timeout_s + SLACK_S
    assert producer.status is Status.CLOSED


# ---------------------------------------------------------------- cancelling


async def test_cancelling_a_task_inside_async_with_producer_returns_within_1_s(node: FrozenNode) -> None:
    connected, go = asyncio.Event(), asyncio.Event()
    holder: list[Producer] = []
    futures: list[asyncio.Future[str]] = []

    async def body() -> None:
        # publish_timeout_s is no bound of a cancel: a producer that waits for it, or for a
        # frozen node to answer its close, misses the 1 s.
        async with Producer(node.url, topic="cancel", publish_timeout_s=5.0) as producer:
            holder.append(producer)
            await producer.publish("before")
            connected.set()
            await go.wait()
            futures.extend([await producer.send(f"m{i}") for i in range(100)])
            await producer.flush()

    task = asyncio.ensure_future(body())
    try:
        await asyncio.wait_for(connected.wait(), scaled(10.0))
        node.freeze()
        go.set()
        producer = holder[0]
        await eventually(lambda: producer.stats.node(NAME).sent >= 101, what="the batch written to the node")
        started = time.monotonic()
        task.cancel()
        await asyncio.wait({task}, timeout=CAP_S)
        elapsed = time.monotonic() - started
        state = "cancelled" if task.cancelled() else "done" if task.done() else f"running after {CAP_S:g} s"
        print(f"\ncancel in async with Producer, 100 messages in flight to a frozen node: {elapsed:.2f} s "
              f"(bound {SLACK_S:g} s), task {state}, producer {producer.status.value}")  # fmt: skip
        assert task.done() and elapsed <= SLACK_S, f"the cancelled task ended after {elapsed:.2f} s ({state})"
        assert task.cancelled(), f"the cancellation was swallowed: {state}"
        assert producer.status is Status.CLOSED
    finally:
        node.thaw()
        if not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CAP_S)
        for future in futures:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the test does not care how each one ended


# ---------------------------------------------------------------- a bad seed


@pytest.fixture
def dead_seed() -> Iterator[str]:
    """A seed URL with nothing listening: the port is bound (so nobody else takes it) but
    not listening, so a connection is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("kind", [Producer, Consumer])
async def test_a_bad_seed_fails_start_and_leaves_the_client_closed_with_no_open_session(
    dead_seed: str, kind: type[Producer] | type[Consumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[aiohttp.ClientSession] = []
    original = aiohttp.ClientSession.__init__

    def recording(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", recording)
    client: ClientBase = kind(dead_seed, topic="nowhere")
    elapsed, outcome = await _outcome(client.start())
    print(f"\n{kind.__name__}.start() with a dead seed: {elapsed:.2f} s: {outcome!r}; "
          f"{len(opened)} aiohttp session(s) opened")  # fmt: skip
    assert isinstance(outcome, KapokError), outcome
    assert str(outcome).strip()
    assert client.status is Status.CLOSED
    assert all(session.closed for session in opened), "an aiohttp session was left open"

"""A fake transport for the client: in-memory nodes behind the ``NodeSession`` seam.

Each ``FakeNode`` stores what is published to it (with a duplicate filter on
``dedup_id``, like a real node) and can be told to refuse connections or to break a
connection right after storing a batch (the in-doubt case). Discovery is answered with
aioresponses (the HTTP side is not what these tests are about).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import types
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import ClientResponse
from aioresponses import CallbackResult, aioresponses

from kapok.client.session import Deliver, SubSpec
from kapok.client.view import Member
from kapok.errors import (
    BadRequestError,
    ConnectionLostError,
    KapokError,
    NotActiveError,
    QueueFullError,
    RateLimitedError,
    StorageFullError,
)

SEED = "http://seed.test:1"


class MockResponse(ClientResponse):
    """aioresponses (0.7.9) builds responses without the ``stream_writer`` argument that
    aiohttp 3.14 requires; a response that was never sent needs only its ``output_size``.
    Pass as ``response_class=`` to every mocked route."""

    def __init__(self, method: str, url: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stream_writer", types.SimpleNamespace(output_size=0))
        super().__init__(method, url, **kwargs)


class FakeNode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.url = f"http://{name}.test:1"
        self.stored: dict[str, str] = {}  # dedup id -> code
        self.data: list[str] = []
        self.refuse = False  # connections fail before anything is sent
        self.break_after_store = 0  # this many publishes store, then drop the connection
        self.sessions: list[FakeSession] = []
        self.in_doubt: list[list[str]] = []  # batches stored, then their connection dropped
        self.view: dict[str, Any] = {}  # how /cluster/nodes shows this node (over the defaults)
        self.passive = False  # answers not_active, like a slave that has not taken over
        self.on_break: Callable[[], None] | None = None
        self.max_length = 0  # > 0: a batch that would store more than this in all is refused (queue_full)
        self.tokens: int | None = None  # a rate limit: how many more messages it takes
        self.delay_s = 0.0  # each publish answers this much later
        self.silent = False  # publishes are never answered (a stopped process)
        self.disk_full = False  # publishes are refused with storage_full, nothing stored

    def row(self, **fields: Any) -> dict[str, Any]:
        row = {"name": self.name, "http_url": self.url, "state": "alive", "role": "master",
               "active": True, "pair": None, "epoch": 0, "load": 0.0}  # fmt: skip
        row.update(self.view)
        row.update(fields)
        return row

    def take_over_from(self, master: FakeNode) -> None:
        """This slave becomes the active member of ``master``'s pair, with its log (and so its
        duplicate filter) replicated, and the master is dead."""
        self.stored, self.data = dict(master.stored), list(master.data)
        self.passive = False
        self.view = {"role": "slave", "active": True, "pair": master.name, "epoch": 1}
        master.refuse = True
        master.view = {"state": "dead"}

    def store(self, msgs: list[dict[str, Any]]) -> list[str | KapokError]:
        if any(m["data"] == "bad" for m in msgs):
            raise BadRequestError("field 'data' is bad")  # the node refuses the whole batch
        if self.disk_full:
            raise StorageFullError(f"{self.name}: storage.dir is below storage.min_free_bytes")
        fresh = sum(1 for m in msgs if (m.get("dedup_id") or "") not in self.stored)
        if self.max_length and len(self.data) + fresh > self.max_length:
            raise QueueFullError(f"topic is full (max_length {self.max_length})")
        if self.tokens is not None:
            if fresh > self.tokens:
                raise RateLimitedError("over its publish rate")
            self.tokens -= fresh
        codes: list[str | KapokError] = []
        for m in msgs:
            dedup = m.get("dedup_id") or f"anon-{len(self.data)}"
            if dedup not in self.stored:
                self.stored[dedup] = f"{self.name}-{len(self.data)}"
                self.data.append(m["data"])
            codes.append(self.stored[dedup])
        return codes


class FakeSession:
    supports_nack = True

    def __init__(self, node: FakeNode, member: Member) -> None:
        self.node = node
        self.member = member
        self.deliver: Deliver | None = None
        self.settled: list[tuple[str, list[str], bool]] = []
        self._closed = False
        self._done = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        if self._closed:
            raise ConnectionLostError("closed", False)
        await asyncio.sleep(self.node.delay_s)  # a round trip
        if self.node.silent:
            await self._done.wait()  # answered by nothing but the connection's end
        if self._closed:  # the connection broke while the batch was on its way
            raise ConnectionLostError(f"lost {self.node.name}")
        codes = self.node.store(msgs)
        if self.node.break_after_store:
            self.node.break_after_store -= 1
            self.node.in_doubt.append([m["data"] for m in msgs])
            if self.node.on_break is not None:
                self.node.on_break()
            await self.close()
            raise ConnectionLostError(f"lost {self.node.name} after it stored the batch")
        return codes

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        self.deliver = deliver
        return 1

    def push(self, *codes: str, size: int = 10) -> None:
        assert self.deliver is not None
        self.deliver(1, [{"code": c, "topic": "t", "data": "x" * size} for c in codes])

    def settle(self, op: str, sub: int, codes: list[str], requeue: bool = True) -> None:
        self.settled.append((op, codes, requeue))

    async def wait_closed(self) -> None:
        await self._done.wait()

    async def close(self) -> None:
        self._closed = True
        self._done.set()


class FakeCluster:
    def __init__(self, *names: str, session: type[FakeSession] = FakeSession) -> None:
        self.nodes = {n: FakeNode(n) for n in names}
        self.session_type = session

    async def connect(self, member: Member) -> FakeSession:
        node = self.nodes[member.name]
        if node.refuse:
            raise ConnectionLostError(f"cannot connect to {node.name}", False)
        if node.passive:
            raise NotActiveError(f"{node.name} is a passive slave")
        session = self.session_type(node, member)
        node.sessions.append(session)
        return session

    @contextlib.contextmanager
    def serving(self) -> Iterator[aioresponses]:
        """Mocked HTTP in which every fake node answers ``/cluster/nodes`` with the view."""
        with aioresponses() as mock:
            self.serve_view(mock)
            yield mock

    def serve_view(self, mock: aioresponses) -> None:
        """Every fake node answers with the nodes' current rows (tests change them)."""

        def answer(url: Any, **kwargs: Any) -> CallbackResult:
            rows = [node.row() for node in self.nodes.values()]
            return CallbackResult(payload=rows, response_class=MockResponse)  # type: ignore[arg-type]

        pattern = re.compile(r"^http://[a-z0-9]+\.test:1/cluster/nodes$")
        mock.get(pattern, repeat=True, response_class=MockResponse, callback=answer)

"""``Consumer``: one subscription on every active pair, one bounded buffer, one iterator.

Each pair of the view gets a *feed*: a task that connects to the pair's active member,
subscribes, and waits for the connection to end, then reconnects with backoff (full
jitter). When the view says another member now serves the pair (a slave took over), the
feed drops its connection and subscribes there. A feed of a pair that left the view stops.

Pushes go into one buffer that the iterator drains. The broker never has more than
``prefetch`` unacked messages out per subscription, so in manual-ack mode the buffer holds
at most ``prefetch`` × pairs; ``max_buffered`` / ``max_buffered_bytes`` bound it anyway
(auto-ack subscriptions have no such limit on the node's side). What does not fit is
nacked back to the broker (manual mode: requeued, nothing lost, but the attempt counts
toward ``max_deliveries``) or dropped (auto mode: at-most-once), counted in
``stats.dropped``, and reported as a ``SlowConsumerError``: to ``on_error`` if given,
otherwise raised once by the next ``get`` / iteration step.

When a connection breaks, the messages it delivered that are still in the buffer are
discarded: the node requeues them at once and delivers them again, so handing them out
would only produce duplicates whose acks cannot be sent. A message already handed out
raises ``ConnectionLostError`` on ``ack`` for the same reason.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import logging
from collections.abc import Sequence
from typing import Any, Self, Unpack

from kapok.client.base import ClientBase, ClientOptions
from kapok.client.session import NodeSession, SubSpec
from kapok.client.stats import Status
from kapok.client.view import Member
from kapok.errors import (
    AuthError,
    BadRequestError,
    ClientClosedError,
    ConnectionLostError,
    KapokError,
    SlowConsumerError,
    SubscriptionError,
    UnknownCodeError,
    UnsupportedError,
)
from kapok.protocol.native import Settle
from kapok.tasks import cancel_and_wait, spawn

__all__ = ["Consumer", "Message"]

log = logging.getLogger("kapok.client")

_FATAL = (AuthError, BadRequestError, SubscriptionError, UnsupportedError)  # retrying cannot help


class Message:
    """A delivered message. ``ack`` / ``nack`` / ``touch`` go back on the connection that
    delivered it; ``node`` names the member it came from."""

    __slots__ = (
        "_consumer", "_session", "_settled", "_sub", "attempts", "code", "create_time", "data",
        "headers", "key", "node", "priority", "redelivered", "topic",
    )  # fmt: skip

    def __init__(self, obj: dict[str, Any], consumer: Consumer, session: NodeSession, sub: int) -> None:
        data = obj.get("data", "")
        self.code: str = obj["code"]
        self.topic: str = obj.get("topic", "")
        self.data: bytes = base64.b64decode(data) if obj.get("enc") == "base64" else data.encode()
        self.key: str = obj.get("key", "")
        self.priority: int = obj.get("priority", 0)
        self.create_time: float = obj.get("create_time", 0.0)
        self.attempts: int = obj.get("attempts", 1)
        self.redelivered: bool = obj.get("redelivered", False)
        self.headers: dict[str, str] = obj.get("headers") or {}
        self.node = session.member.name
        self._consumer = consumer
        self._session = session
        self._sub = sub
        self._settled = False

    @property
    def text(self) -> str:
        return self.data.decode()

    def __repr__(self) -> str:
        return f"<Message {self.code} topic={self.topic!r} node={self.node!r} {len(self.data)} B>"

    async def ack(self) -> None:
        """Done with it (manual mode; a no-op on an auto-ack subscription)."""
        if self._consumer.spec.ack == "auto":
            return
        self._settle("ack")
        self._consumer.stats.acked += 1

    async def nack(self, requeue: bool = True) -> None:
        """Give it back: redelivered (``requeue=True``) or dead-lettered at once."""
        self._settle("nack", requeue)
        self._consumer.stats.nacked += 1

    async def touch(self) -> None:
        """Still working on it: extends its ack deadline."""
        self._settle("touch")

    def _settle(self, op: Settle, requeue: bool = True) -> None:
        if self._consumer.spec.ack == "auto":
            raise UnsupportedError(f"{op} on an auto-ack subscription: the message is settled already")
        if op != "ack" and not self._session.supports_nack:
            raise UnsupportedError(f"the {self._consumer.protocol} protocol has no {op}")
        if self._settled:
            raise UnknownCodeError(f"message {self.code} was acked or nacked already", [self.code])
        if self._session.closed:
            raise ConnectionLostError(
                f"the connection to {self.node} that delivered {self.code} is gone; "
                "the node delivers the message again",
                False,
            )
        self._session.settle(op, self._sub, [self.code], requeue)
        if op != "touch":
            self._settled = True


class _Feed:
    def __init__(self, pair: str, member: Member) -> None:
        self.pair = pair
        self.member = member
        self.session: NodeSession | None = None
        self.task: asyncio.Task[None] | None = None
        self.first = asyncio.get_running_loop().create_future()  # first attempt done


class Consumer(ClientBase):
    """Consumes a topic from every active pair. Use as ``async with Consumer(seeds, topic=...)``
    and ``async for message in consumer``; ``get(timeout_s)`` takes one message.

    Options beyond ``ClientBase``'s: ``group``, ``key`` (routing-key pattern), ``prefetch``,
    ``ack`` (``"manual"`` | ``"auto"``), ``weight``, ``max_buffered``, ``max_buffered_bytes``,
    ``on_error`` (called with each ``SlowConsumerError`` instead of raising it).
    """

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        topic: str,
        group: str | None = None,
        key: str | None = None,
        prefetch: int | None = None,
        ack: str = "manual",
        weight: int | None = None,
        max_buffered: int = 10_000,
        max_buffered_bytes: int = 64 * 1024 * 1024,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(seeds, **options)
        if ack not in ("manual", "auto"):
            raise ValueError(f'ack must be "manual" or "auto", got {ack!r}')
        if max_buffered < 1:
            raise ValueError("max_buffered must be at least 1")
        self.spec = SubSpec(topic, group, key, prefetch, ack, weight)
        self.max_buffered = max_buffered
        self.max_buffered_bytes = max_buffered_bytes
        self._feeds: dict[str, _Feed] = {}
        self._buffer: collections.deque[Message] = collections.deque()
        self._buffered_bytes = 0
        self._ready = asyncio.Event()
        self._problem: KapokError | None = None  # raised by the next get()

    async def start(self) -> Self:
        """Discover the cluster and subscribe on every active pair (waits for the first
        attempt on each, at most ``connect_timeout_s``)."""
        await super().start()
        firsts = [feed.first for feed in self._feeds.values()]
        if firsts:
            await asyncio.wait(firsts, timeout=self.connect_timeout_s)
        if isinstance(self._problem, _FATAL):
            problem, self._problem = self._problem, None
            await self.close()
            raise problem
        return self

    # ------------------------------------------------------------ taking messages

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except ClientClosedError:
            raise StopAsyncIteration from None

    async def get(self, timeout_s: float | None = None) -> Message:
        """The next message; ``TimeoutError`` after ``timeout_s`` without one."""
        async with asyncio.timeout(timeout_s):
            while True:
                if self._problem is not None:
                    problem, self._problem = self._problem, None
                    raise problem
                if self._buffer:
                    msg = self._buffer.popleft()
                    self._buffered_bytes -= len(msg.data)
                    return msg
                if self.status is Status.CLOSED or self.status is Status.NEW:
                    raise ClientClosedError(
                        "the consumer is closed"
                        if self.status is Status.CLOSED
                        else "the consumer is not started (use 'async with' or start())"
                    )
                self._ready.clear()
                await self._ready.wait()

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def close(self) -> None:
        if self.status is Status.CLOSED:
            return
        feeds = list(self._feeds.values())
        self._feeds.clear()
        for feed in feeds:
            await self._stop_feed(feed)
        await self._stop_upkeep()
        self._ready.set()

    # ------------------------------------------------------------ feeds

    def _on_view(self) -> None:
        for pair, member in self.view.items():
            feed = self._feeds.get(pair)
            if feed is None:
                feed = self._feeds[pair] = _Feed(pair, member)
                feed.task = asyncio.get_running_loop().create_task(self._run_feed(feed))
            elif not feed.member.same_node(member):
                log.info("%s: pair %s is now served by %s", self.name, pair, member.name)
                feed.member = member
                if feed.session is not None:  # the feed reconnects, to the new member
                    spawn(feed.session.close())
        for pair in [p for p in self._feeds if p not in self.view]:
            spawn(self._stop_feed(self._feeds.pop(pair)))
        self._update_status()

    async def _stop_feed(self, feed: _Feed) -> None:
        if feed.task is not None:
            await cancel_and_wait(feed.task)
        if feed.session is not None:
            await feed.session.close()

    async def _run_feed(self, feed: _Feed) -> None:
        attempt = 0
        while True:
            member = feed.member
            session: NodeSession | None = None
            try:
                session = await self._connect(member)
                feed.session = session
                await session.subscribe(self.spec, functools.partial(self._deliver, session))
                attempt = 0
                self._update_status()
                if not feed.first.done():
                    feed.first.set_result(None)
                await session.wait_closed()
                reason = "the connection closed"
            except _FATAL as exc:
                self._report(exc)
                if not feed.first.done():
                    feed.first.set_result(None)
                return
            except KapokError as exc:  # connection lost, not active, too many connections
                reason = str(exc)
            finally:
                if session is not None:
                    feed.session = None
                    self._forget(session)
                    await session.close()
            if not feed.first.done():
                feed.first.set_result(None)
            self.stats.node(member.name).failures += 1
            self._update_status()
            self.want_refresh()
            delay = self.backoff(attempt)
            attempt += 1
            log.info("%s: feed from %s ended (%s); again in %.2f s", self.name, member.name, reason, delay)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------ the buffer

    def _deliver(self, session: NodeSession, sub: int, objs: list[dict[str, Any]]) -> None:
        msgs = [Message(obj, self, session, sub) for obj in objs]
        node = self.stats.node(session.member.name)
        node.received += len(msgs)
        self.stats.received += len(msgs)
        room = self.max_buffered - len(self._buffer)
        fits = 0
        size = self._buffered_bytes
        for msg in msgs:
            if fits >= room or (size + len(msg.data) > self.max_buffered_bytes and (fits or self._buffer)):
                break
            size += len(msg.data)
            fits += 1
        self._buffer.extend(msgs[:fits])
        self._buffered_bytes = size
        if fits:
            self._ready.set()
        if fits < len(msgs):
            self._overflow(session, sub, msgs[fits:])

    def _overflow(self, session: NodeSession, sub: int, msgs: list[Message]) -> None:
        self.stats.dropped += len(msgs)
        manual = self.spec.ack == "manual"
        if manual and session.supports_nack and not session.closed:
            session.settle("nack", sub, [m.code for m in msgs], True)
            fate = "requeued on the node"
        elif manual:
            fate = "left to the node's ack timeout"
        else:
            fate = "dropped (auto ack)"
        self._report(SlowConsumerError(
            f"the consumer's buffer is full ({self.max_buffered} messages, {self.max_buffered_bytes} B): "
            f"{len(msgs)} message(s) from {session.member.name} {fate}"
        ))  # fmt: skip

    def _report(self, exc: KapokError) -> None:
        if self.on_error is not None and isinstance(exc, SlowConsumerError):
            self.on_error(exc)
            return
        if self._problem is None:
            self._problem = exc
        self._ready.set()

    def _forget(self, session: NodeSession) -> None:
        """Drop what a lost connection delivered and nobody took yet: it comes again."""
        kept = [m for m in self._buffer if m._session is not session]
        if len(kept) != len(self._buffer):
            self._buffer = collections.deque(kept)
            self._buffered_bytes = sum(len(m.data) for m in kept)

    def _update_status(self) -> None:
        if self.status is Status.CLOSED:
            return
        live = any(f.session is not None and not f.session.closed for f in self._feeds.values())
        self._set_status(Status.CONNECTED if live else Status.RECONNECTING)

    def _tick(self, now: float) -> None:
        self._update_status()

"""``Consumer``: one subscription on every active pair, one bounded buffer, two ways out.

**Feeds.** Each pair of the view gets a *feed*: a task that connects to the pair's active
member, subscribes, holds the subscription until the connection ends, and tries again after
a backoff delay (full jitter). When the view says another member now serves the pair (a
slave took over), the feed drops its connection and subscribes there at once. A feed of a
pair that left the view stops.

**Failures are not silent.** Every attempt of a feed that ends — it could not connect, the
node refused the subscription, the connection closed or sent a frame that cannot be read,
before or after the subscription was confirmed — becomes one error that names the node and
the reason (``ConnectionLostError``, or the node's own class, such as ``NotActiveError``),
and goes to ``on_error``: one report per attempt, and attempts back off, so a dead node
costs at most one report per ``backoff_cap_s``. A subscription that ends before it was held
for ``connect_timeout_s`` counts as a failed attempt, so the backoff keeps growing against a
node that accepts and then drops every connection; one held longer starts afresh.

``start()`` waits until every feed has made its first attempt and one holds a subscription,
at most ``connect_timeout_s``. If none has subscribed by then, it closes what it opened and
raises ``ConnectionLostError`` with each node's last failure (a ``ClientError``, as the
failure is seen from this side; the node's own errors are chained and were reported). An
error no retry can mend (``AuthError``, ``BadRequestError``, ``SubscriptionError``,
``UnsupportedError``) stops its feed and is raised by ``start()`` as itself.

Without ``on_error``, ``get()`` raises a failure instead — but only when nothing can be
delivered: no feed holds a subscription and each has been failing for ``connect_timeout_s``
or more. Then each further failed attempt is raised once by the next ``get()``; a feed that
reconnects while others deliver, or a node back within ``connect_timeout_s``, is not raised.

**The buffer.** Pushes go into one buffer. The broker never has more than ``prefetch``
unacked messages out per subscription, so in manual-ack mode the buffer holds at most
``prefetch`` × pairs; ``max_buffered`` / ``max_buffered_bytes`` bound it anyway (auto-ack
subscriptions have no such limit on the node's side). What does not fit is nacked back to
the broker (manual mode: requeued, nothing lost, but the attempt counts toward
``max_deliveries``) or dropped (auto mode: at-most-once), counted in ``stats.dropped``, and
reported as a ``SlowConsumerError``: to ``on_error`` if given, else raised by the next
``get``. When a connection breaks, its messages still in the buffer are discarded: the node
requeues them at once and delivers them again, so handing them out would only produce
duplicates whose acks cannot be sent (a message already handed out raises
``ConnectionLostError`` on ``ack`` for the same reason).

**Two ways out.** ``get()`` / ``async for`` take one message at a time. Or
``subscribe(callback)`` hands every message to ``callback`` (``async def`` or plain), in
order, ``concurrency`` at a time (1 by default: strictly one after another), with
``Message.process()`` around each call: acked when it returns, nacked with requeue when it
raises (and the failure reported as a ``ClientError`` to ``on_error``, or logged). A
consumer with a callback has no ``get()``; ``close()`` ends both.

**Close.** ``close()`` stops the callbacks (a message being handled is nacked back), the
feeds and the upkeep, and returns: nothing is flushed or awaited but each connection's own
close, which is bounded (``native.CLOSE_TIMEOUT_S``; ``SESSION_CLOSE_S`` backs it up), so a
node that stopped answering cannot hold it. It runs in a task of its own: a cancel of the
caller (say, of a task inside ``async with Consumer(...)``) does not cut it short.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self, Unpack

from kapok.client.base import ClientBase, ClientOptions
from kapok.client.message import Message
from kapok.client.session import AckMode, NodeSession, SubSpec
from kapok.client.stats import Status
from kapok.client.view import Member
from kapok.errors import (
    AuthError,
    BadRequestError,
    ClientClosedError,
    ClientError,
    ConnectionLostError,
    KapokError,
    SlowConsumerError,
    SubscriptionError,
    UnsupportedError,
)
from kapok.tasks import cancel_and_wait, spawn

__all__ = ["Consumer", "Message", "MessageHandler"]

log = logging.getLogger("kapok.client")

_FATAL = (AuthError, BadRequestError, SubscriptionError, UnsupportedError)  # retrying cannot help
SESSION_CLOSE_S = 1.0  # the most a close waits for one connection (each bounds itself below this)

# What ``subscribe`` takes: ``async def handle(message) -> None``, or a plain function.
MessageHandler = Callable[[Message], Awaitable[None] | None]


class _Feed:
    __slots__ = (
        "error", "failing_since", "failures", "member", "pair", "session", "subscribed", "task", "tried",
    )  # fmt: skip

    def __init__(self, pair: str, member: Member) -> None:
        self.pair = pair
        self.member = member
        self.session: NodeSession | None = None
        self.task: asyncio.Task[None] | None = None
        self.subscribed = False  # ``session`` holds the subscription
        self.tried = False  # the first attempt has subscribed or failed
        self.failures = 0  # failed attempts in a row: the backoff's exponent
        self.failing_since: float | None = None  # when this run of failures began
        self.error: KapokError | None = None  # the last failure

    @property
    def live(self) -> bool:
        return self.subscribed and self.session is not None and not self.session.closed


class Consumer(ClientBase):
    """Consumes a topic from every active pair. Use as ``async with Consumer(seeds, topic=...)``
    and ``async for message in consumer``; ``get(timeout_s)`` takes one message;
    ``subscribe(callback)`` hands each to a callback instead.

    Options beyond ``ClientOptions``: ``group``, ``key`` (routing-key pattern), ``prefetch``
    (None: the node's ``mq.prefetch``), ``ack`` (``"manual"``: ack each message; ``"auto"``:
    the node settles it as it sends it, at-most-once), ``weight`` (a share of the group's
    messages), ``max_buffered``, ``max_buffered_bytes``. ``on_error`` gets every failed feed
    attempt, ``SlowConsumerError`` and callback failure (see the module's docstring for what
    happens without it).
    """

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        topic: str,
        group: str | None = None,
        key: str | None = None,
        prefetch: int | None = None,
        ack: AckMode = "manual",
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
        # Named in every subscription: a connection shared through a SessionPool carries
        # the name of whichever client opened it.
        self.spec = SubSpec(topic, group, key, prefetch, ack, weight, self.name)
        self.max_buffered = max_buffered
        self.max_buffered_bytes = max_buffered_bytes
        self._feeds: dict[str, _Feed] = {}
        self._buffer: collections.deque[Message] = collections.deque()
        self._buffered_bytes = 0
        self._ready = asyncio.Event()  # the buffer got messages, a problem, or the consumer closed
        self._changed = asyncio.Event()  # a feed subscribed or failed
        self._subscribed_once = False
        self._fatal: KapokError | None = None  # raised by start()
        self._problem: KapokError | None = None  # raised by the next get()
        self._handler: MessageHandler | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closing: asyncio.Task[None] | None = None

    async def start(self) -> Self:
        """Discover the cluster and subscribe on every active pair. Returns once every feed
        has made its first attempt and one holds a subscription; ``ConnectionLostError`` if
        none does within ``connect_timeout_s`` (see the module's docstring)."""
        if self.status is not Status.NEW:
            return self
        await super().start()
        try:
            await self._wait_for_a_subscription()
        except BaseException:
            await self.close()
            raise
        return self

    async def _wait_for_a_subscription(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout_s
        while True:
            if self._fatal is not None:
                raise self._fatal
            if self._subscribed_once and all(f.tried for f in self._feeds.values()):
                return
            if loop.time() >= deadline:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._changed.wait()
        if self._subscribed_once:
            return  # the feeds still on their first attempt go on in the background
        errors = [f.error for f in self._feeds.values() if f.error is not None]
        reasons = "; ".join(str(e) for e in errors) or "the cluster view holds no active member"
        within = f"within {self.connect_timeout_s:g} s"
        raise ConnectionLostError(
            f"no node took the subscription to {self.spec.topic!r} {within}: {reasons}", False
        ) from (errors[-1] if errors else None)

    # ------------------------------------------------------------ taking messages

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except ClientClosedError:
            raise StopAsyncIteration from None

    async def get(self, timeout_s: float | None = None) -> Message:
        """The next message; ``TimeoutError`` after ``timeout_s`` without one. Raises what
        could not be reported otherwise (see the module's docstring)."""
        if self._handler is not None:
            raise ClientError("get() cannot take messages from a consumer that hands them to a callback")
        async with asyncio.timeout(timeout_s):
            return await self._next()

    async def _next(self) -> Message:
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

    async def subscribe(self, callback: MessageHandler, *, concurrency: int = 1) -> None:
        """Hand every message to ``callback`` from now on, in order, at most ``concurrency``
        at a time, each inside ``Message.process()``: acked when the callback returns, nacked
        with requeue when it raises (the failure goes to ``on_error`` as a ``ClientError``, or
        to the log). The callback may settle a message itself. Ends with ``close()``."""
        self._check_open()
        if self._handler is not None:
            raise ClientError("this consumer hands its messages to a callback already")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._handler = callback
        if self._problem is not None:  # no get() will raise it now
            problem, self._problem = self._problem, None
            self._report(problem)
        loop = asyncio.get_running_loop()
        self._workers = [loop.create_task(self._dispatch(callback)) for _ in range(concurrency)]

    async def _dispatch(self, callback: MessageHandler) -> None:
        while True:
            try:
                msg = await self._next()
            except ClientClosedError:
                return
            returned = False
            try:
                async with msg.process(requeue=True):
                    result = callback(msg)
                    if inspect.isawaitable(result):
                        await result
                    returned = True
            except Exception as exc:
                if returned and isinstance(exc, KapokError):
                    self._report(exc)  # the ack failed (the connection is gone: it comes again)
                    continue
                failure = ClientError(f"the callback failed on message {msg.code} from {msg.node}: {exc!r}")
                failure.__cause__ = exc
                self._report(failure)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """Stop consuming and return: messages handed out and not acked go back to their nodes
        (nacked, or requeued by the node as the connection ends). Bounded; see the module's
        docstring."""
        if self._closing is None:
            if self.status is Status.CLOSED:
                return
            self._closing = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        self.status = Status.CLOSED
        self._ready.set()
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()  # a message being handled is nacked back while its connection is open
        if workers:
            await asyncio.wait(workers, timeout=SESSION_CLOSE_S)
        feeds = list(self._feeds.values())
        self._feeds.clear()
        await asyncio.gather(*(self._stop_feed(feed) for feed in feeds))
        await self._stop_upkeep()

    # ------------------------------------------------------------ feeds

    def _on_view(self) -> None:
        if self.status is Status.CLOSED:
            return
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
        await cancel_and_wait(feed.task)  # its own clean-up closes its session
        if feed.session is not None:
            await self._close_session(feed.session)

    async def _close_session(self, session: NodeSession) -> None:
        try:
            async with asyncio.timeout(SESSION_CLOSE_S):
                await session.close()
        except TimeoutError:
            log.info("%s: %s did not answer our close; dropped", self.name, session.member.name)
        except Exception:  # the connection is being dropped either way
            log.exception("%s: closing the connection to %s failed", self.name, session.member.name)

    async def _run_feed(self, feed: _Feed) -> None:
        while True:
            member = feed.member
            began = time.monotonic()
            try:
                error, held = await self._attempt(feed, member)
            except Exception as exc:  # a bug, or an answer nobody foresaw: the feed must go on
                log.exception("%s: the feed from %s failed", self.name, member.name)
                error, held = ConnectionLostError(f"the feed from {member.name} failed: {exc!r}", False), None
            feed.tried = True
            fatal = isinstance(error, _FATAL)
            if not fatal and not feed.member.same_node(member):
                self._changed.set()
                continue  # the pair moved to another member: not a failure, subscribe there now
            now = time.monotonic()
            if held is not None and held >= self.connect_timeout_s:
                feed.failures, feed.failing_since = 0, now  # it worked for a while: a fresh start
            elif feed.failing_since is None:
                feed.failing_since = began
            feed.error = error
            self.stats.node(member.name).failures += 1
            if fatal and self._fatal is None:
                self._fatal = error
            self._update_status()
            self._changed.set()
            self._report(error, in_get=fatal or self._nothing_deliverable(now))
            if fatal:  # reported above (on_error, or raised by start() / get()): not logged twice
                log.info("%s: feed from %s stopped: %s", self.name, member.name, error)
                return
            self.want_refresh()
            delay = self.backoff(feed.failures)
            feed.failures += 1
            log.info("%s: %s; again in %.2f s", self.name, error, delay)
            await asyncio.sleep(delay)

    async def _attempt(self, feed: _Feed, member: Member) -> tuple[KapokError, float | None]:
        """One connection of ``feed``, from connect to its end: why it ended, and for how many
        seconds it held the subscription (None: it never did)."""
        topic = self.spec.topic
        try:
            session = await self._connect(member)
        except KapokError as exc:  # each names the node and the reason
            return exc, None
        feed.session = session
        try:
            try:
                await session.subscribe(self.spec, functools.partial(self._deliver, session))
            except ConnectionLostError as exc:
                message = f"the subscription to {topic!r} on {member.name} failed before it was confirmed"
                return ConnectionLostError(f"{message}: {exc}", False), None
            except ClientError as exc:  # raised on this side (UnsupportedError): as it is
                return exc, None
            except KapokError as exc:  # the node's error frame
                exc.args = (f"{member.name} refused the subscription to {topic!r}: {exc.message}",)
                return exc, None
            feed.subscribed = feed.tried = True
            self._subscribed_once = True
            self._update_status()
            self._changed.set()
            since = time.monotonic()
            reason = await session.wait_closed()
            held = time.monotonic() - since
            message = f"the subscription to {topic!r} on {member.name} ended after {held:.2f} s: "
            return ConnectionLostError(message + (reason or "the connection closed"), False), held
        finally:
            feed.subscribed = False
            feed.session = None
            self._forget(session)
            await self._close_session(session)

    def _nothing_deliverable(self, now: float) -> bool:
        """No feed holds a subscription, and each has been failing for ``connect_timeout_s``."""
        feeds = self._feeds.values()
        return bool(feeds) and all(
            not f.live and f.failing_since is not None and now - f.failing_since >= self.connect_timeout_s
            for f in feeds
        )

    def _update_status(self) -> None:
        if self.status is Status.CLOSED:
            return
        live = any(f.live for f in self._feeds.values())
        self._set_status(Status.CONNECTED if live else Status.RECONNECTING)

    def _tick(self, now: float) -> None:
        self._update_status()

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

    def _report(self, exc: KapokError, *, in_get: bool = True) -> None:
        """To ``on_error``; else, with a callback, to the log; else, if ``in_get``, to the next
        ``get()`` (the first one waiting is kept)."""
        if self.on_error is not None:
            self._call(self.on_error, exc)
        elif self._handler is not None:
            log.warning("%s: %s", self.name, exc, exc_info=exc.__cause__)
        elif in_get:
            if self._problem is None:
                self._problem = exc
            self._ready.set()

    def _forget(self, session: NodeSession) -> None:
        """Drop what a lost connection delivered and nobody took yet: it comes again."""
        kept = [m for m in self._buffer if m._session is not session]
        if len(kept) != len(self._buffer):
            self._buffer = collections.deque(kept)
            self._buffered_bytes = sum(len(m.data) for m in kept)

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

The class is built in layers, one module each, every layer using only those below it:
``kapok.client.consumer_state`` (the constructor, the state, the buffer and where failures
go), ``kapok.client.feeds`` (the feeds, and the client's hooks that follow the cluster
view); this module adds the public calls (``start``, ``get``, ``subscribe``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Self

from kapok.client.consumer_state import MessageHandler
from kapok.client.feeds import SESSION_CLOSE_S, Feeding
from kapok.client.message import Message
from kapok.client.stats import Status
from kapok.errors import ClientClosedError, ClientError, ConnectionLostError, KapokError

__all__ = ["Consumer", "Message"]


class Consumer(Feeding):
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

"""``Producer``: batches messages, spreads them over the pairs, and retries safely.

Theory of operation.

* Each message is placed when it is sent: the balancer picks a pair (``balance``), and the
  message joins that pair's *lane* (``lanes.py``). A lane accumulates an open batch, sealed
  when it holds ``batch_size`` messages or ``batch_bytes`` bytes, or ``linger_s`` after its
  first message (0: at the end of the current loop turn, so a burst of sends fills batches
  by itself). Sealed batches wait in the lane's queue; at most ``max_inflight`` are
  unconfirmed per lane.
* Every message carries a ``dedup_id`` (generated when the caller gives none), so sending a
  batch again to the *same pair* can never store it twice: the node (or its slave, which
  replicates the duplicate filter) answers a repeat with the original code.
* A failure is handled by what it tells us. Nothing was written (the connection could not
  be opened; a passive slave said ``not_active``): the lane is marked down for a backoff
  delay and its batches go to other pairs at once. The connection broke *after* a batch was
  written: the batch is *in doubt*, since the node may have stored it. Sending it to another
  pair could duplicate it (duplicate filters are per pair), so it is held for its own pair
  for up to ``in_doubt_wait_s`` — long enough for a slave to take over or the node to
  return — and resent there, in order, before anything newer. Only after that wait does it
  go elsewhere (logged: if the first node did store it, it now exists twice).
  ``in_doubt_wait_s=0`` prefers availability: in-doubt batches move at once.
* ``balance="key"`` prefers order to availability: a key belongs to its *pair*, not to a
  node. While the pair has a live member — its master, or a slave about to take over — its
  keys wait for it, through failures and takeovers, and resume in order on the member that
  serves the pair next. They move (each to its next pair by rendezvous hashing) only when
  no member of the pair is left in the cluster. What waits is bounded by ``max_pending``
  and ``publish_timeout_s``.
* Results are per message. A refusal that concerns some messages of a batch and not
  others — ``queue_full`` (the topic had room for some), ``rate_limited`` (the node's
  token bucket had some tokens), ``bad_request`` (one bad message) — makes the producer
  resend the batch message by message, in order: what the node stores is confirmed, the
  rest fails each with its own error. ``rate_limited`` is retried: the lane pauses for a
  backoff delay and resends, one batch at a time for a second so that none overtakes
  another (batches already in flight when the refusal came may have); only the deadline
  fails such a message.
* Nothing waits forever: ``publish_timeout_s`` after it was sent, a message fails with
  ``PublishTimeoutError`` wherever it is — queued, parked, or written and unanswered (a
  node that stopped answering, whose connection is then dropped).
* ``send`` waits while ``max_pending`` messages (or ``max_pending_bytes``) are unconfirmed:
  memory stays bounded however fast the caller produces.
* Ending: ``drain()`` waits for every confirmation (at most ``publish_timeout_s``), then
  closes; ``close()`` stops at once and fails what is unconfirmed with
  ``ClientClosedError`` (a message written but unanswered may still have been stored).
  Leaving ``async with`` drains, unless the block raised or was cancelled: then it closes.

The class is built in layers, one module each, every layer using only those below it:
``kapok.client.producer_state`` (the constructor, the state, placing and outcomes),
``kapok.client.sending`` (batching, sending, retrying, following the cluster view); this
module adds the public calls (``send``, ``publish``, ``flush``, ``drain``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, Unpack

from kapok.client.outgoing import SendOptions, message_object, too_large
from kapok.client.producer_state import Balance
from kapok.client.sending import _Sending
from kapok.client.stats import Status
from kapok.errors import ClientClosedError

__all__ = ["Balance", "Producer", "SendOptions"]

_CLOSE_WAIT_S = 0.25  # close() waits this long for connections to close politely, then cuts them
_CLOSED = "the producer was closed before a node confirmed the message"


class Producer(_Sending):
    """Publishes to a Kapok cluster. Use as ``async with Producer(seeds, ...) as producer``.

    ``await publish(data)`` returns the message code once a node confirmed it (durably, per
    that node's ``storage.fsync``); ``await send(data)`` returns at once with a future of the
    code, and ``flush()`` waits for every future. Options beyond ``ClientOptions``: ``topic``
    (default for ``send``), ``balance``, ``batch_size``, ``batch_bytes``, ``linger_s``,
    ``max_inflight`` (unconfirmed batches per node), ``max_pending`` and
    ``max_pending_bytes`` (unconfirmed in all), ``dedup`` (generate dedup ids),
    ``publish_timeout_s``, ``in_doubt_wait_s``, ``max_message_bytes``.
    """

    # ------------------------------------------------------------ public API

    async def publish(self, data: bytes | str, **fields: Unpack[SendOptions]) -> str:
        """Publish one message and return its code once a node has confirmed it (the
        keywords are ``send``'s)."""
        return await (await self.send(data, **fields))

    async def send(
        self,
        data: bytes | str,
        *,
        topic: str | None = None,
        key: str = "",
        priority: int = 0,
        delay_s: float = 0.0,
        deliver_at: float = 0.0,
        ttl_s: float = 0.0,
        dedup_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> asyncio.Future[str]:
        """Queue one message; returns a future of its code. Waits only while the producer
        holds ``max_pending`` unconfirmed messages (backpressure)."""
        # This is the per-message hot path (the bench's client workload measures it): the
        # common case, text for the producer's own topic and no options, does as little as it
        # can. The producer's topic goes once per frame, not per message (a message of just
        # {"data", "dedup_id"} is also the node's cheapest to read).
        if not self._accepting:
            self._check_open()
            raise ClientClosedError("the producer is closing")
        if (
            self._plain and topic is None and type(data) is str
            and not (key or priority or delay_s or deliver_at or ttl_s or headers or dedup_id)
        ):  # fmt: skip
            size = len(data) if data.isascii() else len(data.encode())
            if size > self.max_message_bytes:
                raise too_large(size, self.max_message_bytes)
            if self.dedup:
                msg = {"data": data, "dedup_id": f"{self._dedup_prefix}{next(self._dedup_seq)}"}
            else:
                msg = {"data": data}
        else:
            options = (key, priority, delay_s, deliver_at, ttl_s, dedup_id, headers)
            msg, size = self._message(data, topic, *options)
        while self._pending >= self.max_pending or (
            self._pending and self._pending_bytes + size > self.max_pending_bytes
        ):
            self._room.clear()
            self._blocked = True
            try:
                await self._room.wait()
            finally:
                self._blocked = False
            if not self._accepting:
                raise ClientClosedError("the producer was closed")
        future: asyncio.Future[str] = self._loop.create_future()
        if not self._pending:
            self._drained.clear()
        self._pending += 1
        self._pending_bytes += size
        self.stats.sent += 1
        pairs = self._candidates
        if self._uniform and len(pairs) > 1:
            lane = self._lanes[pairs[int(self._random() * len(pairs))]]
        else:
            lane = self._route(key)
        self._add(lane, msg, future, size)
        return future

    def _message(
        self, data: bytes | str, topic: str | None, key: str, priority: int, delay_s: float,
        deliver_at: float, ttl_s: float, dedup_id: str | None, headers: Mapping[str, str] | None,
    ) -> tuple[dict[str, Any], int]:  # fmt: skip
        """``send``'s other cases: another topic, bytes, options."""
        if topic is None or topic == self.topic:
            if self.topic is None:
                raise ValueError("no topic: pass topic= to send() or to the Producer")
            topic = None  # the frame's
        elif not topic:
            raise ValueError("the topic must not be empty")
        if not dedup_id and self.dedup:
            dedup_id = f"{self._dedup_prefix}{next(self._dedup_seq)}"
        return message_object(
            data, topic, key, priority, delay_s, deliver_at, ttl_s, dedup_id, headers,
            max_bytes=self.max_message_bytes, kapokmq=self.protocol == "kapokmq",
        )  # fmt: skip

    async def flush(self) -> None:
        """Send what is batched now and wait until every message is confirmed or failed."""
        for lane in (*self._lanes.values(), self._parking):
            self._seal(lane)
        while self._pending:
            await self._drained.wait()

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for every confirmation (at most ``timeout_s``, default ``publish_timeout_s``),
        then close: what is unconfirmed by then fails with ``ClientClosedError``."""
        if self.status is Status.CLOSED:
            return
        self._accepting = False
        try:
            if self.status is not Status.NEW:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.publish_timeout_s if timeout_s is None else timeout_s):
                        await self.flush()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop now: unconfirmed messages fail with ``ClientClosedError`` (one that was
        written and not yet answered may still have been stored), connections close."""
        if self.status is Status.CLOSED:
            return
        self._stopped, self._accepting = True, False
        for task in list(self._tasks):
            task.cancel()  # a batch in flight fails with ClientClosedError as its task ends
        connecting = [lane.connecting for lane in self._lanes.values() if lane.connecting is not None]
        for attempt in connecting:
            attempt.cancel()
        closes = [lane.session.close() for lane in self._lanes.values() if lane.session is not None]
        pending: list[asyncio.Future[Any]] = [asyncio.ensure_future(c) for c in closes]
        pending += [*connecting, *self._tasks]
        if pending:  # bounded: a node that does not answer a close must not hold the caller
            await asyncio.wait(pending, timeout=_CLOSE_WAIT_S)
        closed = ClientClosedError(_CLOSED)
        for lane in (*self._lanes.values(), self._parking):
            self._seal(lane, pump=False)
            for batch in list(lane.queue):
                self._fail(lane.take(batch), closed)
        await self._stop_upkeep()
        self._room.set()

    async def start(self) -> Self:
        await super().start()
        self._accepting = self.status is not Status.CLOSED
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            await self.drain()
        else:  # an error or a cancel: do not make the caller wait for confirmations
            await self.close()

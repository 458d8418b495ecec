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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, Unpack

from kapok.client.balance import make_balancer
from kapok.client.base import ClientBase, ClientOptions
from kapok.client.lanes import Batch, Lane, costs
from kapok.client.outgoing import SendOptions, message_object, too_large
from kapok.client.session import NodeSession
from kapok.client.stats import Status
from kapok.errors import (
    BadRequestError,
    ClientClosedError,
    ConnectionLostError,
    KapokError,
    ProtocolError,
    PublishTimeoutError,
    QueueFullError,
    RateLimitedError,
    ReplicationUnconfirmedError,
    TooManyConnectionsError,
    UnavailableError,
)
from kapok.tasks import spawn

__all__ = ["Balance", "Producer", "SendOptions"]

log = logging.getLogger("kapok.client")

Balance = Literal["random", "p2c", "key"]

_CLOSE_WAIT_S = 0.25  # close() waits this long for connections to close politely, then cuts them
_SERIAL_S = 1.0  # after a rate-limit refusal, a lane sends one batch at a time this long
_CLOSED = "the producer was closed before a node confirmed the message"


class Producer(ClientBase):
    """Publishes to a Kapok cluster. Use as ``async with Producer(seeds, ...) as producer``.

    ``await publish(data)`` returns the message code once a node confirmed it (durably, per
    that node's ``storage.fsync``); ``await send(data)`` returns at once with a future of the
    code, and ``flush()`` waits for every future. Options beyond ``ClientOptions``: ``topic``
    (default for ``send``), ``balance``, ``batch_size``, ``batch_bytes``, ``linger_s``,
    ``max_inflight`` (unconfirmed batches per node), ``max_pending`` and
    ``max_pending_bytes`` (unconfirmed in all), ``dedup`` (generate dedup ids),
    ``publish_timeout_s``, ``in_doubt_wait_s``, ``max_message_bytes``.
    """

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        topic: str | None = None,
        balance: Balance = "random",
        batch_size: int = 100,
        batch_bytes: int = 1024 * 1024,
        linger_s: float = 0.0,
        max_inflight: int = 4,
        max_pending: int = 10_000,
        max_pending_bytes: int = 64 * 1024 * 1024,
        dedup: bool = True,
        publish_timeout_s: float = 30.0,
        in_doubt_wait_s: float = 10.0,
        max_message_bytes: int = 1024 * 1024,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(seeds, **options)
        if batch_size < 1 or max_inflight < 1 or max_pending < 1:
            raise ValueError("batch_size, max_inflight and max_pending must be at least 1")
        if publish_timeout_s <= 0:
            raise ValueError("publish_timeout_s must be more than 0")
        self.topic = topic
        self.balance = balance
        self.batch_size = batch_size if self.protocol == "native" else min(batch_size, 1000)
        self.batch_bytes = batch_bytes
        self.linger_s = linger_s
        self.max_inflight = max_inflight
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.dedup = dedup and self.protocol == "native"  # KapokMQ's routes have no duplicate filter
        self.publish_timeout_s = publish_timeout_s
        self.in_doubt_wait_s = in_doubt_wait_s
        self.max_message_bytes = max_message_bytes
        self._pick = make_balancer(balance, self._rng)
        self._key_mode = balance == "key"
        self._p2c = balance == "p2c"
        self._uniform = balance == "random"
        self._random = self._rng.random
        self._plain = topic is not None and self.protocol == "native"  # send()'s fast path applies
        self._lanes: dict[str, Lane] = {}
        self._parking = Lane("", None)  # batches with no pair to go to, yet
        self._candidates: list[str] = []
        self._seq = itertools.count()
        self._dedup_prefix = secrets.token_hex(8) + "-"
        self._dedup_seq = itertools.count()
        self._pending = 0
        self._pending_bytes = 0
        self._room = asyncio.Event()
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting = False  # started, and neither drain() nor close() began: send() takes messages
        self._blocked = False  # a send() waits for room (max_pending)
        self._stopped = False  # close() began: nothing more is written

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

    # ------------------------------------------------------------ placing and batching

    def _route(self, key: str) -> Lane:
        pairs = self._candidates
        if not pairs:
            return self._parking
        if len(pairs) == 1:
            return self._lanes[pairs[0]]
        loads: dict[str, float] = {}
        if self._p2c:
            loads = costs(self._lanes[p] for p in pairs)
        return self._lanes[self._pick(pairs, key, loads)]

    def _add(self, lane: Lane, msg: dict[str, Any], future: asyncio.Future[str], size: int) -> None:
        batch = lane.open
        if batch is None:
            batch = lane.open = Batch(next(self._seq), time.monotonic() + self.publish_timeout_s)
            loop = self._loop
            if self.linger_s > 0:
                lane.timer = loop.call_later(self.linger_s, self._lingered, lane)
            else:
                lane.timer = loop.call_soon(self._lingered, lane)
        elif lane.timer is None:  # its sealing was put off (see _lingered): look again
            lane.timer = self._loop.call_soon(self._lingered, lane)
        batch.msgs.append(msg)
        batch.futures.append(future)
        batch.size += size
        lane.load += 1
        if len(batch.msgs) >= self.batch_size or batch.size >= self.batch_bytes:
            self._seal(lane)

    def _lingered(self, lane: Lane) -> None:
        """An open batch's linger is over: seal it, unless the caller is blocked on
        ``max_pending`` while the lane has batches in flight. Then more messages come as
        soon as a confirmation frees room, and sealing now would only send a short batch
        (and, under steady backpressure, every batch after it would be as short): it waits
        for the next message (``_add``) or the lane's next confirmation (``_send_batch``)."""
        lane.timer = None
        if self._blocked and lane.inflight and lane.open is not None:
            return
        self._seal(lane)

    def _seal(self, lane: Lane, pump: bool = True) -> None:
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        batch, lane.open = lane.open, None
        if batch is not None:
            lane.queue.append(batch)  # its messages count in lane.load since _add
            if pump:
                self._pump(lane)

    def _pump(self, lane: Lane) -> None:
        now = time.monotonic()
        if self._stopped or not lane.sendable(now):
            return
        loop = self._loop
        limit = 1 if lane.serial_until > now else self.max_inflight
        while lane.queue and lane.inflight < limit:
            batch = lane.queue.popleft()
            lane.inflight += 1
            task = loop.create_task(self._send_batch(lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ sending

    async def _session(self, lane: Lane) -> NodeSession:
        session = lane.session
        if session is not None and not session.closed:
            return session
        if lane.connecting is None or lane.connecting.done():
            lane.connecting = self._loop.create_task(self._open(lane))
            lane.connecting.add_done_callback(_retrieve)  # its waiters may all have gone
        # Shielded: a batch that stops waiting (its deadline) must not cancel the attempt
        # that other batches of the lane wait for too.
        return await asyncio.shield(lane.connecting)

    async def _open(self, lane: Lane) -> NodeSession:
        """One connection attempt per lane at a time; every batch waiting for it shares it."""
        assert lane.member is not None
        gen = lane.gen
        session = await self._connect(lane.member)
        if gen != lane.gen:  # the lane failed or moved meanwhile: this session is stale
            await session.close()
            raise ConnectionLostError(f"{lane.pair} changed while connecting", False)
        lane.session = session
        self._update_status()
        return session

    async def _send_batch(self, lane: Lane, batch: Batch) -> None:
        gen, count = lane.gen, len(batch.msgs)
        try:
            async with asyncio.timeout_at(self._loop.time() + batch.deadline - time.monotonic()):
                session = await self._session(lane)
                node = self.stats.node(session.member.name)
                node.sent += count
                if batch.attempts:
                    self.stats.retried += count
                    node.retried += count
                started = time.monotonic()
                results = await session.publish(batch.msgs, self.topic)
                if len(results) != count:
                    answered = f"{session.member.name} answered {len(results)} codes"
                    raise ProtocolError(f"{answered} for a batch of {count} messages")
        except TimeoutError:
            silent = ConnectionLostError(f"{lane.name} did not answer in time")
            self._lane_failed(lane, gen, silent)
            self._fail(batch, self._late(silent))
        except asyncio.CancelledError:
            self._fail(
                batch, ClientClosedError("the producer was closed before a node confirmed the message")
            )
            raise
        except ConnectionLostError as exc:
            self._lane_failed(lane, gen, exc)
            self._retry(lane, batch, exc, in_doubt=exc.in_doubt)
        except ReplicationUnconfirmedError as exc:
            # Sync replication: the master stored the batch but its slave did not confirm it.
            # In doubt like a broken connection; the pair's duplicate filter makes a resend safe.
            self._retry(lane, batch, exc, in_doubt=True)
        except (UnavailableError, TooManyConnectionsError) as exc:
            # not_active (a passive slave), fenced, replication_unavailable (a sync master
            # without its slave; a resend already stored there is answered with its codes),
            # storage_full (the node's disk), or full: refused before anything was stored,
            # so the batch may go to another node.
            self._lane_failed(lane, gen, exc)
            self._retry(lane, batch, exc, in_doubt=False)
        except RateLimitedError as exc:
            self._rate_limited(lane, batch, exc)
        except (BadRequestError, QueueFullError) as exc:
            if count == 1:
                self._fail(batch, exc)
            else:  # refused whole for some of its messages: find out which, in order
                self._split(lane, batch)
        except KapokError as exc:
            self._fail(batch, exc)
        except Exception as exc:  # a bug or an unexpected reply: fail loudly, keep the producer
            log.exception("%s: publishing a batch failed", self.name)
            self._fail(batch, KapokError(f"publish failed: {type(exc).__name__}: {exc}"))
        else:
            now = time.monotonic()
            lane.failures = lane.limited = 0
            lane.observe(now - started, now)
            self._confirm(batch, results, session.member.name)
        finally:
            lane.inflight -= 1
            lane.load -= count  # a batch held again was counted back by Lane.hold
            if lane.open is not None and lane.timer is None:
                lane.timer = self._loop.call_soon(self._lingered, lane)
            self._pump(lane)

    def _split(self, lane: Lane, batch: Batch) -> None:
        for single in batch.singles():
            lane.hold(single)

    def _rate_limited(self, lane: Lane, batch: Batch, exc: KapokError) -> None:
        """The node's token bucket for this producer is empty: pause the lane, retry in order."""
        if time.monotonic() >= batch.deadline:
            self._fail(
                batch, PublishTimeoutError(f"not confirmed within {self.publish_timeout_s:g} s: {exc}")
            )
            return
        batch.attempts += 1
        for part in batch.singles() if len(batch.msgs) > 1 else [batch]:
            lane.hold(part)
        now = time.monotonic()
        lane.down_until = max(lane.down_until, now + self.backoff(lane.limited))
        lane.serial_until = now + _SERIAL_S  # one batch at a time: none overtakes a refused one
        lane.limited += 1
        self._update_candidates()

    def _lane_failed(self, lane: Lane, gen: int, exc: KapokError) -> None:
        if gen != lane.gen:
            return  # this connection's failure was handled already
        lane.gen += 1
        session, lane.session = lane.session, None
        if session is not None and not session.closed:
            spawn(session.close())
        lane.down_until = time.monotonic() + self.backoff(lane.failures)
        lane.failures += 1
        self.stats.node(lane.name).failures += 1
        wait = lane.down_until - time.monotonic()
        log.info("%s: %s is down (retry in %.2f s): %s", self.name, lane.name, wait, exc)
        self.want_refresh()
        self._update_candidates()
        if self.status is Status.CONNECTING:
            self._set_status(Status.RECONNECTING)
        if not self._key_mode:  # what was never sent goes elsewhere now
            self._seal(lane, pump=False)
            for batch in lane.take_unpinned():
                self._elsewhere(batch)

    def _retry(self, lane: Lane, batch: Batch, exc: KapokError, *, in_doubt: bool) -> None:
        batch.attempts += 1
        now = time.monotonic()
        if now >= batch.deadline:
            self._fail(
                batch, PublishTimeoutError(f"not confirmed within {self.publish_timeout_s:g} s: {exc}")
            )
        elif in_doubt and not batch.pinned_until and self.in_doubt_wait_s > 0:
            batch.pinned_until = now + self.in_doubt_wait_s
            lane.hold(batch)
        elif batch.pinned_until > now or (self._key_mode and not lane.gone):
            lane.hold(batch)
        else:
            self._elsewhere(batch)

    def _elsewhere(self, batch: Batch) -> None:
        """Place a batch again, as if its messages were new (key mode: by key, in order)."""
        batch.pinned_until = 0.0
        if not self._key_mode or not self._candidates:
            lane = self._route("")
            lane.hold(batch)
            self._pump(lane)
            return
        parts: dict[str, Batch] = {}
        for msg, future in zip(batch.msgs, batch.futures, strict=True):
            lane = self._route(msg.get("key", ""))
            part = parts.get(lane.pair)
            if part is None:
                part = parts[lane.pair] = Batch(batch.seq, batch.deadline, attempts=batch.attempts)
            part.msgs.append(msg)
            part.futures.append(future)
            part.size += len(msg["data"])
        for pair, part in parts.items():
            lane = self._lanes[pair]
            lane.hold(part)
            self._pump(lane)

    # ------------------------------------------------------------ outcomes

    def _confirm(self, batch: Batch, results: list[str | KapokError], node: str) -> None:
        ok = 0
        for future, result in zip(batch.futures, results, strict=True):
            if isinstance(result, KapokError):
                self.stats.failed += 1
                if not future.done():
                    future.set_exception(result)
            else:
                ok += 1
                if not future.done():
                    future.set_result(result)
        self.stats.confirmed += ok
        self.stats.node(node).confirmed += ok
        self._release(len(batch.futures), batch.size)

    def _fail(self, batch: Batch, exc: KapokError) -> None:
        for future in batch.futures:
            if not future.done():
                future.set_exception(exc)
        self.stats.failed += len(batch.futures)
        self._release(len(batch.futures), batch.size)

    def _late(self, why: object) -> PublishTimeoutError:
        return PublishTimeoutError(
            f"no node confirmed the message within {self.publish_timeout_s:g} s: {why}"
        )

    def _release(self, count: int, size: int) -> None:
        self._pending -= count
        self._pending_bytes -= size
        self._room.set()
        if not self._pending:
            self._drained.set()

    # ------------------------------------------------------------ view and upkeep

    def _update_candidates(self) -> None:
        if self._key_mode:  # every pair still in the cluster, served now or not
            self._candidates = sorted(p for p, lane in self._lanes.items() if not lane.gone)
        else:
            now = time.monotonic()
            self._candidates = [p for p, lane in self._lanes.items() if lane.sendable(now)]
        self._update_status()

    def _update_status(self) -> None:
        """CONNECTED while some node has a working connection; before the first one,
        CONNECTING; after losing them all, RECONNECTING."""
        if self.status in (Status.CLOSED, Status.NEW):
            return
        if any(lane.session is not None and not lane.session.closed for lane in self._lanes.values()):
            self._set_status(Status.CONNECTED)
        elif self.status is Status.CONNECTED:
            self._set_status(Status.RECONNECTING)

    def _on_view(self) -> None:
        for pair in self.pairs:
            member = self.view.get(pair)
            lane = self._lanes.get(pair)
            if lane is None:
                self._lanes[pair] = Lane(pair, member)
                continue
            lane.gone = False
            if member is None:
                # Failing over: nothing new goes out; what is in flight finishes or fails.
                lane.active = False
                continue
            old, lane.member, lane.active = lane.member, member, True
            if old is not None and not old.same_node(member):
                # A takeover (or a new incarnation): what was in flight to the old member is
                # in doubt and will be resent to the new one, which holds the same log.
                log.info("%s: pair %s is now served by %s", self.name, pair, member.name)
                self._lane_failed(lane, lane.gen, ConnectionLostError(f"{pair} moved to {member.name}"))
                lane.down_until = 0.0
        for pair, lane in self._lanes.items():
            if pair not in self.pairs and not lane.gone:
                lane.gone, lane.active = True, False
                self._seal(lane, pump=False)
        self._update_candidates()
        for lane in self._lanes.values():
            if lane.gone or (not lane.active and not self._key_mode):
                for batch in lane.take_unpinned():
                    self._elsewhere(batch)
            else:
                self._pump(lane)

    def _tick(self, now: float) -> None:
        changed = False
        for lane in (*self._lanes.values(), self._parking):
            if lane.down_until and lane.down_until <= now:
                lane.down_until = 0.0
                changed = True
            for batch in list(lane.queue):
                if batch.deadline <= now:
                    why = f"waiting for {lane.name}" if lane.pair else "no node takes messages"
                    self._fail(lane.take(batch), self._late(why))
                elif batch.pinned_until and batch.pinned_until <= now and not lane.sendable(now):
                    log.warning(
                        "%s: %d message(s) in doubt on %s go elsewhere after %.1f s; if that node had "
                        "stored them, they now exist twice", self.name, len(batch.msgs), lane.pair,
                        self.in_doubt_wait_s,
                    )  # fmt: skip
                    self._elsewhere(lane.take(batch))
        if changed:
            self._update_candidates()
            for lane in self._lanes.values():
                self._pump(lane)
        if self._candidates and self._parking.queue:
            for batch in list(self._parking.queue):
                self._elsewhere(self._parking.take(batch))


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Read a finished task's outcome, so that asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()

"""``Producer``: batches messages, spreads them over the active pairs, and retries safely.

Theory of operation.

* Each message is placed when it is sent: the balancer picks a pair (``balance``), and the
  message joins that pair's *lane*. A lane accumulates an open batch, sealed when it holds
  ``batch_size`` messages or ``batch_bytes`` bytes, or ``linger_s`` after its first message
  (0: at the end of the current loop turn, so a burst of sends fills batches by itself).
  Sealed batches wait in the lane's queue; at most ``max_inflight`` are unconfirmed per lane.
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
* In ``key`` mode a key stays on its pair while the pair is in the view, through failures
  (its messages wait for the pair) and takeovers; keys move only when their pair leaves the
  view, each to its next pair by rendezvous hashing.
* A refusal by the broker (``queue_full``, ``rate_limited``, ...) fails the batch's
  messages. A batch refused for bad input is resent message by message, so one bad message
  does not fail its neighbours. Nothing waits forever: each message fails with
  ``UnavailableError`` ``publish_timeout_s`` after it was sent, wherever it is.
* ``send`` waits while ``max_pending`` messages (or ``max_pending_bytes``) are unconfirmed:
  memory stays bounded however fast the caller produces.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import dataclasses
import itertools
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any, Unpack

from kapok.client.balance import make_balancer
from kapok.client.base import ClientBase, ClientOptions
from kapok.client.kapokmq import compat_frame
from kapok.client.session import NodeSession
from kapok.client.stats import Status
from kapok.client.view import Member
from kapok.errors import (
    BadRequestError,
    ClientClosedError,
    ConnectionLostError,
    KapokError,
    MessageTooLargeError,
    ReplicationUnconfirmedError,
    TooManyConnectionsError,
    UnavailableError,
)
from kapok.tasks import spawn

__all__ = ["Producer"]

log = logging.getLogger("kapok.client")

_NOT_SENDING = frozenset({Status.NEW, Status.CLOSED})


@dataclasses.dataclass(slots=True)
class _Batch:
    seq: int
    deadline: float
    msgs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    futures: list[asyncio.Future[str]] = dataclasses.field(default_factory=list)
    size: int = 0
    attempts: int = 0
    pinned_until: float = 0.0  # while in the future: in doubt, only for its own pair


class _Lane:
    """One pair: its target member, connection, open batch and queue of sealed batches."""

    def __init__(self, pair: str, member: Member | None) -> None:
        self.pair = pair
        self.member = member
        self.session: NodeSession | None = None
        self.connecting: asyncio.Task[NodeSession] | None = None
        self.gen = 0  # bumped on every failure: late reports of an old connection are ignored
        self.open: _Batch | None = None
        self.timer: asyncio.Handle | None = None
        self.queue: collections.deque[_Batch] = collections.deque()  # ordered by seq
        self.inflight = 0  # batches
        self.unconfirmed = 0  # messages, for p2c
        self.failures = 0
        self.down_until = 0.0
        self.gone = member is None  # not in the view (the parking lane never is)

    def hold(self, batch: _Batch) -> None:
        """Put a batch back in seq order (it was sent before everything queued after it)."""
        seqs = [b.seq for b in self.queue]
        self.queue.insert(bisect.bisect(seqs, batch.seq), batch)


class Producer(ClientBase):
    """Publishes to a Kapok cluster. Use as ``async with Producer(seeds, ...) as producer``.

    ``await publish(data)`` returns the message code once a node confirmed it (durably, per
    that node's ``storage.fsync``); ``await send(data)`` returns at once with a future of the
    code, and ``flush()`` waits for every future. Options beyond ``ClientBase``'s: ``topic``
    (default for ``send``), ``balance`` (``random`` | ``p2c`` | ``key``), ``batch_size``,
    ``batch_bytes``, ``linger_s``, ``max_inflight`` (unconfirmed batches per node),
    ``max_pending`` and ``max_pending_bytes`` (unconfirmed in all), ``dedup`` (generate
    dedup ids), ``publish_timeout_s``, ``in_doubt_wait_s``, ``max_message_bytes``.
    """

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        topic: str | None = None,
        balance: str = "random",
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
        self._choice = self._rng.choice
        self._lanes: dict[str, _Lane] = {}
        self._parking = _Lane("", None)  # batches with no pair to go to, yet
        self._candidates: list[str] = []
        self._seq = itertools.count()
        self._dedup_prefix = secrets.token_hex(8) + "-"
        self._dedup_seq = itertools.count()
        self._pending = 0
        self._pending_bytes = 0
        self._room = asyncio.Event()
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    # ------------------------------------------------------------ public API

    async def publish(self, data: bytes | str, **fields: Any) -> str:
        """Publish one message and return its code once a node has confirmed it."""
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
    ) -> asyncio.Future[str]:
        """Queue one message; returns a future of its code. Waits only while the producer
        holds ``max_pending`` unconfirmed messages (backpressure)."""
        # This is the per-message hot path (the bench's client workload measures it): the
        # common case, the producer's topic and no options, does as little as it can.
        if self._closing or self.status in _NOT_SENDING:
            self._check_open()
            raise ClientClosedError("the producer is closing")
        topic = topic or self.topic
        if not topic:
            raise ValueError("no topic: pass topic= to send() or to the Producer")
        # The producer's own topic goes once per frame; only other topics ride on the message
        # (a message of just {"data"} is also the node's cheapest to read).
        msg: dict[str, Any] = {} if topic == self.topic else {"topic": topic}
        if isinstance(data, str):
            msg["data"] = data
            size = len(data) if data.isascii() else len(data.encode())
        else:
            size = len(data)
            try:
                msg["data"] = data.decode()
            except UnicodeDecodeError:
                msg["data"] = base64.b64encode(data).decode()
                msg["enc"] = "base64"
        if size > self.max_message_bytes:
            limit = self.max_message_bytes
            raise MessageTooLargeError(f"message of {size} bytes is over max_message_bytes ({limit})")
        if key or priority or delay_s or deliver_at or ttl_s:
            options = {"key": key, "priority": priority, "delay_s": delay_s, "deliver_at": deliver_at,
                       "ttl_s": ttl_s}  # fmt: skip
            msg.update((name, value) for name, value in options.items() if value)
        if dedup_id or self.dedup:
            msg["dedup_id"] = dedup_id or f"{self._dedup_prefix}{next(self._dedup_seq)}"
        if self.protocol == "kapokmq":
            compat_frame(msg)  # what KapokMQ cannot carry fails here, not in a batch
        while self._pending >= self.max_pending or (
            self._pending and self._pending_bytes + size > self.max_pending_bytes
        ):
            self._room.clear()
            await self._room.wait()
            if self.status is Status.CLOSED:
                raise ClientClosedError("the producer was closed")
        future: asyncio.Future[str] = self._loop.create_future()
        if not self._pending:
            self._drained.clear()
        self._pending += 1
        self._pending_bytes += size
        self.stats.sent += 1
        pairs = self._candidates
        if self._uniform and len(pairs) > 1:
            lane = self._lanes[self._choice(pairs)]
        else:
            lane = self._route(key)
        self._add(lane, msg, future, size)
        return future

    async def flush(self) -> None:
        """Send what is batched now and wait until every message is confirmed or failed."""
        for lane in (*self._lanes.values(), self._parking):
            self._seal(lane)
        while self._pending:
            await self._drained.wait()

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush (for at most ``timeout_s``, default ``publish_timeout_s``), then disconnect;
        messages still unconfirmed then fail with ``ClientClosedError``."""
        if self.status is Status.CLOSED:
            return
        self._closing = True
        if self.status is not Status.NEW:
            try:
                async with asyncio.timeout(self.publish_timeout_s if timeout_s is None else timeout_s):
                    await self.flush()
            except TimeoutError:
                pass
        for lane in (*self._lanes.values(), self._parking):
            for batch in [*lane.queue, *([lane.open] if lane.open else [])]:
                self._fail(batch, ClientClosedError("the producer was closed first"))
            lane.queue.clear()
            lane.open = None
        for task in list(self._tasks):
            task.cancel()
        for lane in self._lanes.values():
            if lane.session is not None:
                await lane.session.close()
        await self._stop_upkeep()
        self._room.set()

    # ------------------------------------------------------------ placing and batching

    def _route(self, key: str) -> _Lane:
        pairs = self._candidates
        if not pairs:
            return self._parking
        if len(pairs) == 1:
            return self._lanes[pairs[0]]
        loads: dict[str, float] = {}
        if self._p2c:
            loads = {p: self.view[p].load + self._lanes[p].unconfirmed for p in pairs if p in self.view}
        return self._lanes[self._pick(pairs, key, loads)]

    def _add(self, lane: _Lane, msg: dict[str, Any], future: asyncio.Future[str], size: int) -> None:
        batch = lane.open
        if batch is None:
            batch = lane.open = _Batch(next(self._seq), time.monotonic() + self.publish_timeout_s)
            loop = self._loop
            if self.linger_s > 0:
                lane.timer = loop.call_later(self.linger_s, self._seal, lane)
            else:
                lane.timer = loop.call_soon(self._seal, lane)
        batch.msgs.append(msg)
        batch.futures.append(future)
        batch.size += size
        if len(batch.msgs) >= self.batch_size or batch.size >= self.batch_bytes:
            self._seal(lane)

    def _seal(self, lane: _Lane) -> None:
        if lane.timer is not None:
            lane.timer.cancel()
            lane.timer = None
        batch, lane.open = lane.open, None
        if batch is not None:
            lane.queue.append(batch)
            self._pump(lane)

    def _pump(self, lane: _Lane) -> None:
        if lane.member is None or lane.gone or lane.down_until > time.monotonic():
            return
        loop = asyncio.get_running_loop()
        while lane.queue and lane.inflight < self.max_inflight:
            batch = lane.queue.popleft()
            lane.inflight += 1
            lane.unconfirmed += len(batch.msgs)
            task = loop.create_task(self._send_batch(lane, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ sending

    async def _session(self, lane: _Lane) -> NodeSession:
        session = lane.session
        if session is not None and not session.closed:
            return session
        if lane.connecting is None or lane.connecting.done():
            lane.connecting = asyncio.get_running_loop().create_task(self._open(lane))
        return await lane.connecting

    async def _open(self, lane: _Lane) -> NodeSession:
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

    async def _send_batch(self, lane: _Lane, batch: _Batch) -> None:
        gen, count = lane.gen, len(batch.msgs)
        try:
            session = await self._session(lane)
            node = self.stats.node(session.member.name)
            node.sent += count
            if batch.attempts:
                self.stats.retried += count
                node.retried += count
            results = await session.publish(batch.msgs, self.topic)
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
            # or full: refused before anything was stored.
            self._lane_failed(lane, gen, exc)
            self._retry(lane, batch, exc, in_doubt=False)
        except BadRequestError as exc:
            if count == 1:
                self._fail(batch, exc)
            else:  # the node refused the whole batch for one message: find out which
                singles = zip(batch.msgs, batch.futures, strict=True)
                lane.queue.extendleft(
                    _Batch(batch.seq, batch.deadline, [m], [f], len(m["data"]), batch.attempts)
                    for m, f in reversed(list(singles))
                )
        except KapokError as exc:
            self._fail(batch, exc)
        except Exception as exc:  # a bug or an unexpected reply: fail loudly, keep the producer
            log.exception("%s: publishing a batch failed", self.name)
            self._fail(batch, KapokError(f"publish failed: {type(exc).__name__}: {exc}"))
        else:
            lane.failures = 0
            self._confirm(batch, results, session.member.name)
        finally:
            lane.inflight -= 1
            lane.unconfirmed -= count
            self._pump(lane)

    def _lane_failed(self, lane: _Lane, gen: int, exc: KapokError) -> None:
        if gen != lane.gen:
            return  # this connection's failure was handled already
        lane.gen += 1
        session, lane.session = lane.session, None
        if session is not None and not session.closed:
            spawn(session.close())
        lane.down_until = time.monotonic() + self.backoff(lane.failures)
        lane.failures += 1
        name = lane.member.name if lane.member else lane.pair
        self.stats.node(name).failures += 1
        wait = lane.down_until - time.monotonic()
        log.info("%s: %s is down (retry in %.2f s): %s", self.name, name, wait, exc)
        self.want_refresh()
        self._update_candidates()
        if self.status is Status.CONNECTING:
            self._set_status(Status.RECONNECTING)
        if not self._key_mode:  # what was never sent goes elsewhere now
            self._seal(lane)
            for batch in [b for b in lane.queue if not b.pinned_until]:
                lane.queue.remove(batch)
                self._elsewhere(batch)

    def _retry(self, lane: _Lane, batch: _Batch, exc: KapokError, *, in_doubt: bool) -> None:
        batch.attempts += 1
        now = time.monotonic()
        if now >= batch.deadline:
            self._fail(batch, UnavailableError(f"not confirmed within {self.publish_timeout_s:g} s: {exc}"))
        elif in_doubt and not batch.pinned_until and self.in_doubt_wait_s > 0:
            batch.pinned_until = now + self.in_doubt_wait_s
            lane.hold(batch)
        elif batch.pinned_until > now or (self._key_mode and not lane.gone):
            lane.hold(batch)
        else:
            self._elsewhere(batch)

    def _elsewhere(self, batch: _Batch) -> None:
        """Place a batch again, as if its messages were new (key mode: by key, in order)."""
        batch.pinned_until = 0.0
        if not self._key_mode or not self._candidates:
            lane = self._route("")
            lane.hold(batch)
            self._pump(lane)
            return
        parts: dict[str, _Batch] = {}
        for msg, future in zip(batch.msgs, batch.futures, strict=True):
            lane = self._route(msg.get("key", ""))
            part = parts.get(lane.pair)
            if part is None:
                part = parts[lane.pair] = _Batch(batch.seq, batch.deadline, attempts=batch.attempts)
            part.msgs.append(msg)
            part.futures.append(future)
            part.size += len(msg["data"])
        for pair, part in parts.items():
            lane = self._lanes[pair]
            lane.hold(part)
            self._pump(lane)

    # ------------------------------------------------------------ outcomes

    def _confirm(self, batch: _Batch, results: list[str | KapokError], node: str) -> None:
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

    def _fail(self, batch: _Batch, exc: KapokError) -> None:
        for future in batch.futures:
            if not future.done():
                future.set_exception(exc)
        self.stats.failed += len(batch.futures)
        self._release(len(batch.futures), batch.size)

    def _release(self, count: int, size: int) -> None:
        self._pending -= count
        self._pending_bytes -= size
        self._room.set()
        if not self._pending:
            self._drained.set()

    # ------------------------------------------------------------ view and upkeep

    def _update_candidates(self) -> None:
        now = time.monotonic()
        if self._key_mode:
            self._candidates = sorted(p for p, lane in self._lanes.items() if not lane.gone)
        else:
            lanes = self._lanes.items()
            self._candidates = [p for p, lane in lanes if not lane.gone and lane.down_until <= now]
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
        for pair, member in self.view.items():
            lane = self._lanes.get(pair)
            if lane is None:
                self._lanes[pair] = _Lane(pair, member)
                continue
            old, lane.member, lane.gone = lane.member, member, False
            if old is not None and not old.same_node(member):
                # A takeover (or a new incarnation): what was in flight to the old member is
                # in doubt and will be resent to the new one, which holds the same log.
                log.info("%s: pair %s is now served by %s", self.name, pair, member.name)
                self._lane_failed(lane, lane.gen, ConnectionLostError(f"{pair} moved to {member.name}"))
                lane.down_until = 0.0
        for pair, lane in self._lanes.items():
            if pair not in self.view and not lane.gone:
                lane.gone = True
                self._seal(lane)
        self._update_candidates()
        for lane in self._lanes.values():
            if lane.gone:
                for batch in [b for b in lane.queue if not b.pinned_until]:
                    lane.queue.remove(batch)
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
                    lane.queue.remove(batch)
                    why = f"no node confirmed it within {self.publish_timeout_s:g} s"
                    self._fail(batch, UnavailableError(why))
                elif batch.pinned_until and batch.pinned_until <= now and (lane.gone or lane.down_until):
                    lane.queue.remove(batch)
                    log.warning(
                        "%s: %d message(s) in doubt on %s go elsewhere after %.1f s; if that node had "
                        "stored them, they now exist twice", self.name, len(batch.msgs), lane.pair,
                        self.in_doubt_wait_s,
                    )  # fmt: skip
                    self._elsewhere(batch)
        if changed:
            self._update_candidates()
            for lane in self._lanes.values():
                self._pump(lane)
        if self._candidates and self._parking.queue:
            parked = list(self._parking.queue)
            self._parking.queue.clear()
            for batch in parked:
                self._elsewhere(batch)

"""How a ``Producer`` gets batches to the nodes (its middle layer, above its state).

``_Sending`` adds to ``_ProducerState`` (``kapok.client.producer_state``) the machinery
that the module docstring of ``kapok.client.producer`` describes: a message joins its
lane's open batch (``_add``), which is sealed by size or linger and pumped out at most
``max_inflight`` at a time; one connection attempt per lane (``_session``); a batch's
answer or failure (``_send_batch``) and what follows from it: retry on the same pair when
in doubt, elsewhere when nothing was written, pause when rate-limited, split when refused
for some of its messages; and the client's hooks (``_on_view``, ``_tick``) that move
batches as the cluster view and the clock change. These parts call each other in a
cycle (sending a batch seals and pumps, a failure places batches again), so they stay
one layer; ``Producer`` above adds only the public calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kapok.client.lanes import Batch, Lane
from kapok.client.producer_state import _ProducerState
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

__all__: list[str] = []

log = logging.getLogger("kapok.client")

_SERIAL_S = 1.0  # after a rate-limit refusal, a lane sends one batch at a time this long


class _Sending(_ProducerState):
    """Batching, sending, retrying and following the view (``Producer``'s middle layer)."""

    # ------------------------------------------------------------ batching

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

    # ------------------------------------------------------------ view and upkeep

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

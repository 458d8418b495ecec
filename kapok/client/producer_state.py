"""A ``Producer``'s state and the bookkeeping that needs no connection (its base layer).

``_ProducerState`` holds the settings and every lane, counter and event of a producer
(the constructor, with ``Producer``'s keywords), and the decisions made without writing to
a node: which lane a message goes to (``_route``), which pairs take messages now
(``_update_candidates``, and the status that follows), and how a batch's outcome settles
its futures and frees room for a waiting ``send`` (``_confirm``, ``_fail``, ``_release``).
The layers above use it: ``kapok.client.sending`` (batching, sending, retrying, following
the cluster view) and ``kapok.client.producer`` (the public calls). It is a module of its
own so that each of them reads as the one job it does.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Sequence
from typing import Literal, Unpack

from kapok.client.balance import make_balancer
from kapok.client.base import ClientBase, ClientOptions
from kapok.client.lanes import Batch, Lane, costs
from kapok.client.stats import Status
from kapok.errors import KapokError, PublishTimeoutError

__all__ = ["Balance"]

Balance = Literal["random", "p2c", "key"]


class _ProducerState(ClientBase):
    """Settings, lanes, counters; placing, outcomes and status (``Producer``'s base)."""

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

    # ------------------------------------------------------------ placing

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

    # ------------------------------------------------------------ candidates and status

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

"""Admission: which drafts of a publish batch the broker may store (pure: ``now`` is an argument).

A batch is accepted or refused as a whole, before anything is stored: every
draft is validated (size, priority, TTL), duplicates are found (the dedup
window, and repeats inside the batch), each topic's quota is checked for the
drafts that would really be stored (``overflow: reject``), so is the node's
whole backlog (``max_backlog_bytes``, against the total the broker passes in),
and each producer's token bucket is charged. Storing is the broker's business; this
module only decides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kapok.core.limits import DedupWindow, RateLimiter
from kapok.core.model import Draft
from kapok.core.settings import BrokerSettings
from kapok.errors import BadRequestError, MessageTooLargeError, QueueFullError, RateLimitedError

if TYPE_CHECKING:
    from kapok.core.topics import Topic

__all__ = ["MAX_PRIORITY", "MESSAGE_OVERHEAD_BYTES", "Admission", "Admitted"]

MAX_PRIORITY = 9
# What a live message costs the node beside its payload (the message object, its entry,
# its code, its place in the queues and indexes), rounded up from the backlog benchmark's
# ~420 B of RSS per queued 100-byte message. mq.max_backlog_bytes counts payload + this.
MESSAGE_OVERHEAD_BYTES = 512


@dataclass(slots=True)
class Admitted:
    """The decision on a batch.

    ``slots`` is None when no draft carries a dedup id (store them all), else one slot
    per draft: None (store it), the code of a known duplicate, or the index of an
    earlier draft of the batch with the same dedup id. ``per_topic`` counts the drafts
    to store, by topic.
    """

    slots: list[str | int | None] | None
    per_topic: dict[str, int]


class Admission:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.dedup = DedupWindow(settings.dedup_window_s, settings.dedup_max_entries)
        self.limiter = RateLimiter(settings.producer_rate, settings.producer_burst)

    def admit(
        self, drafts: list[Draft], topic: Callable[[str], Topic], now: float, backlog_bytes: int = 0
    ) -> Admitted:
        """Decide on a batch; ``topic`` finds (or makes) a topic by name; ``backlog_bytes``
        is the node's live backlog now (payload + ``MESSAGE_OVERHEAD_BYTES`` per message).
        Raises the error that refuses the whole batch."""
        max_bytes = self.settings.max_message_bytes
        first_topic = drafts[0].topic if drafts else ""
        one_topic = True
        any_dedup = False
        for d in drafts:
            if len(d.data) > max_bytes:
                raise MessageTooLargeError(
                    f"message of {len(d.data)} bytes is over max_message_bytes ({max_bytes})"
                )
            if not 0 <= d.priority <= MAX_PRIORITY:
                raise BadRequestError(f"priority must be 0 to {MAX_PRIORITY}, got {d.priority}")
            if d.ttl_s < 0:
                raise BadRequestError("ttl_s must not be negative")
            if d.dedup_id:
                any_dedup = True
            if d.topic != first_topic:
                one_topic = False
        slots: list[str | int | None] | None = None
        if any_dedup:
            slots = [None] * len(drafts)
            per_topic = self._find_duplicates(drafts, slots, now)
        elif one_topic:
            per_topic = {first_topic: len(drafts)} if drafts else {}
        else:
            per_topic = {}
            for d in drafts:
                per_topic[d.topic] = per_topic.get(d.topic, 0) + 1
        if self.settings.max_backlog_bytes:
            self._check_backlog(drafts, slots, backlog_bytes)
        for name, count in per_topic.items():
            self._check_quota(topic(name), drafts, slots, count)
        if self.limiter.enabled:
            self._charge_producers(drafts, now)
        return Admitted(slots, per_topic)

    def known_codes(self, drafts: list[Draft], now: float) -> list[str] | None:
        """The codes of a batch made only of known duplicates (every draft has a dedup id the
        window remembers), else None: such a batch stores nothing when it is sent again."""
        codes = []
        for d in drafts:
            code = self.dedup.get(d.topic, d.dedup_id, now) if d.dedup_id else None
            if code is None:
                return None
            codes.append(code)
        return codes

    def _find_duplicates(
        self, drafts: list[Draft], slots: list[str | int | None], now: float
    ) -> dict[str, int]:
        """Fill ``slots`` for the drafts that are duplicates; returns the fresh drafts per topic."""
        per_topic: dict[str, int] = {}
        seen: dict[tuple[str, str], int] = {}
        known_code = self.dedup.known(now)
        for i, d in enumerate(drafts):
            if d.dedup_id:
                key = (d.topic, d.dedup_id)
                known: str | int | None = known_code(key)
                if known is None:
                    known = seen.get(key)
                if known is not None:
                    slots[i] = known
                    continue
                seen[key] = i
            per_topic[d.topic] = per_topic.get(d.topic, 0) + 1
        return per_topic

    def _check_backlog(self, drafts: list[Draft], slots: list[str | int | None] | None, backlog: int) -> None:
        limit = self.settings.max_backlog_bytes
        if slots is None:
            size = sum(len(d.data) for d in drafts) + MESSAGE_OVERHEAD_BYTES * len(drafts)
        else:
            fresh = [d for d, slot in zip(drafts, slots, strict=True) if slot is None]
            size = sum(len(d.data) for d in fresh) + MESSAGE_OVERHEAD_BYTES * len(fresh)
        if backlog + size > limit:
            raise QueueFullError(
                f"the node's backlog is full ({backlog} of mq.max_backlog_bytes {limit} bytes in use): "
                "consume some messages or try again later"
            )

    @staticmethod
    def _check_quota(
        topic: Topic, drafts: list[Draft], slots: list[str | int | None] | None, count: int
    ) -> None:
        cfg = topic.cfg
        if not (cfg.max_length or cfg.max_bytes) or cfg.overflow != "reject":
            return
        name = topic.name
        if slots is None:
            size = sum(len(d.data) for d in drafts if d.topic == name)
        else:
            size = sum(
                len(d.data) for d, slot in zip(drafts, slots, strict=True) if slot is None and d.topic == name
            )
        too_many = cfg.max_length and topic.live_count + count > cfg.max_length
        too_big = cfg.max_bytes and topic.live_bytes + size > cfg.max_bytes
        if too_many or too_big:
            raise QueueFullError(
                f"topic {name!r} is full (max_length {cfg.max_length}, max_bytes {cfg.max_bytes})"
            )

    def _charge_producers(self, drafts: list[Draft], now: float) -> None:
        per_producer: dict[str, int] = {}
        for d in drafts:
            per_producer[d.producer_id] = per_producer.get(d.producer_id, 0) + 1
        for producer, n in per_producer.items():
            if not self.limiter.allow(producer, n, now):
                raise RateLimitedError(
                    f"producer {producer!r} is over its publish rate of {self.settings.producer_rate}/s"
                )

"""What a message goes through in the broker: stored, requeued, dead-lettered, settled, completed.

``MessageLifecycle`` adds to the state table (``kapok.core.state``) the transitions every
operation shares: ``_store`` (publish, and the dead-letter copy), ``_requeue``,
``_dead_letter``, ``_finish`` (one entry settled), ``_end_message`` (every open entry at
once) and ``_complete`` (the message leaves the live count; kept for its retention).
"""

from __future__ import annotations

import sys

from kapok.core import changes as ch
from kapok.core.admission import MESSAGE_OVERHEAD_BYTES
from kapok.core.codes import SEQ_MASK, CodeBlock, code_prefix
from kapok.core.model import Draft, Entry, Message, Status
from kapok.core.state import BrokerState, small_route
from kapok.core.topics import Group, Topic
from kapok.core.waiting import Waiting

__all__ = ["MessageLifecycle"]

_READY, _DELAYED = Status.READY, Status.DELAYED


class MessageLifecycle(BrokerState):
    """The transitions of a message that every operation shares (``Broker``'s layer)."""

    def _store(self, topic: Topic, d: Draft, headers: dict[str, str] | None, now: float, prefix: str) -> str:
        """Store one message and return its code; ``prefix`` is ``code_prefix`` of ``now``
        (computed once per batch)."""
        seq = self._seq
        self._seq = seq + 1
        block = self._codes.block(prefix, seq)
        code = block.code(seq & 0xFF)
        if d.deliver_at:
            deliver_at = d.deliver_at
        elif d.delay_s:  # a negative delay (KapokMQ's DelayTime may be) is kept, and means "now"
            deliver_at = now + d.delay_s
        else:
            deliver_at = now
        ttl = d.ttl_s or topic.cfg.ttl_s
        expire_at = now + ttl if ttl > 0 else 0.0
        # Keys repeat across messages but arrive as fresh strings: share one copy.
        key = sys.intern(d.key) if d.key else ""
        delayed = deliver_at > now
        status = _DELAYED if delayed else _READY
        groups = topic.group_list
        # A message that will wait (behind many others, or for its time) keeps its code's block,
        # not the code: see CodeBlock. One delivered soon keeps the code it has already.
        waits = delayed or not groups or groups[0].ready_count >= self.keep_codes_queued
        if (
            waits
            and seq <= SEQ_MASK
            and deliver_at == now
            and not expire_at
            and not key
            and not d.priority
            and headers is None
            and small_route(topic, groups)
        ):
            return self._store_waiting(topic, groups[0], d, block, seq, code, now)
        msg = Message(
            seq, block if waits and seq <= SEQ_MASK else code, d.data, key, d.priority, now, deliver_at,
            expire_at, d.producer_id, d.dedup_id, headers, group=groups[0] if groups else topic.no_group(),
            status=status if groups else Status.DROPPED,
        )  # fmt: skip
        self.messages.add_numbered(msg)
        self.stats.published += 1
        if len(groups) > 1:
            msg.route(groups[1:], status)  # the message itself is the entry of the first
        if groups and not delayed:
            for entry in (msg, *msg.more) if msg.more else (msg,):
                group = entry.group
                queue = group.ready[d.priority] or group.queue(d.priority)
                queue.append(entry)
                group.ready_count += 1
                self._dirty.add(group)
        if self.journal:
            self._changes.append(
                ch.Published(
                    seq, code, topic.name, d.data, key, d.priority, now, deliver_at, expire_at,
                    d.producer_id, d.dedup_id, headers, topic.durable,
                )
            )  # fmt: skip
        if not groups:
            self.stats.unrouted += 1
            self._complete(msg, topic, now, counted=False)
            return code
        topic.live_count += 1
        topic.live_bytes += len(d.data)
        self.backlog_bytes += len(d.data) + MESSAGE_OVERHEAD_BYTES
        if topic.order is not None:
            topic.order.append(msg)
        if delayed:
            topic.delayed_count += len(groups)
            self.timers.delay(msg)
        if expire_at:
            self.timers.expire(msg)
        return code

    def _store_waiting(
        self, topic: Topic, group: Group, d: Draft, block: CodeBlock, seq: int, code: str, now: float
    ) -> str:
        """``_store`` of a plain message that waits far back: as a ``Waiting``."""
        held = Waiting(seq, block, d.data, now, d.producer_id, d.dedup_id, group)
        self.messages.add_numbered(held)
        self.stats.published += 1
        (group.ready[0] or group.queue(0)).append(held)
        group.ready_count += 1
        self._dirty.add(group)
        if self.journal:
            self._changes.append(
                ch.Published(
                    seq, code, topic.name, d.data, "", 0, now, now, 0.0, d.producer_id, d.dedup_id, None,
                    topic.durable,
                )
            )  # fmt: skip
        topic.live_count += 1
        topic.live_bytes += len(d.data)
        self.backlog_bytes += len(d.data) + MESSAGE_OVERHEAD_BYTES
        return code

    def _requeue(self, entry: Entry, reason: str, now: float) -> None:
        topic = entry.group.topic
        limit = topic.cfg.max_deliveries
        if limit and not topic.is_dlq and entry.attempts >= limit:
            self._dead_letter(entry, "max_deliveries", now)
            return
        entry.group.push_ready(entry, front=True)
        self._dirty.add(entry.group)
        if self.journal:
            msg = entry.msg
            self._changes.append(
                ch.Requeued(msg.code, msg.topic, entry.group.name, reason, now, entry.attempts)
            )

    def _dead_letter(self, entry: Entry, reason: str, now: float) -> None:
        msg = entry.msg
        topic = entry.group.topic
        self._finish(entry, Status.DEAD, reason, now)
        self.stats.dead_lettered += 1
        if topic.is_dlq:
            return  # a dead letter of a dead letter stays here, marked dead
        headers = {
            "original_code": msg.code,
            "original_topic": msg.topic,
            "group": entry.group.name,
            "reason": reason,
            "attempts": str(entry.attempts),
        }
        # Not ``self.topic()``: the name may be 4 characters over the limit for user topics.
        dlq_name = topic.name + ".dlq"
        dlq = self.topics.get(dlq_name) or self._make_topic(dlq_name)
        draft = Draft(dlq.name, msg.data, msg.key, msg.priority, producer_id=msg.producer_id)
        self._store(dlq, draft, headers, now, code_prefix(int(now * 1000), self.node_id))
        dlq.published += 1

    def _finish(self, entry: Entry, status: Status, reason: str, now: float) -> None:
        entry.status = status
        entry.deadline = now  # = settled_at, see Entry
        entry.consumer = None
        msg = entry.msg
        group = entry.group
        if self.journal:
            self._changes.append(ch.Settled(msg.code, group.topic.name, group.name, status.text, reason, now))
        if msg.status.final and (not msg.more or msg.settled()):
            self._complete(msg, group.topic, now)

    def _end_message(self, msg: Message, status: Status, reason: str, now: float) -> None:
        """Finish every open entry of ``msg`` at once (TTL, overflow, console delete)."""
        if status is Status.EXPIRED:
            self.stats.expired += 1
        elif reason == "overflow":
            self.stats.dropped += 1
        for entry in msg.all_entries():
            st = entry.status
            if st.final:
                continue
            if st is Status.READY:
                entry.group.ready_count -= 1  # stays queued; skipped when reached
            elif st is Status.INFLIGHT and entry.consumer is not None:
                entry.consumer.held.pop(msg.code, None)
                self._dirty.add(entry.group)
                claims = entry.group.claims
                if claims is not None:
                    self._unclaim(claims, entry)
            elif st is Status.DELAYED:
                entry.group.topic.delayed_count -= 1
            if status is Status.EXPIRED and self.settings.expired == "dead_letter":
                self._dead_letter(entry, ch.EXPIRED, now)
            else:
                self._finish(entry, status, reason, now)
        self.timers.undelay(msg)

    def _complete(self, msg: Message, topic: Topic, now: float, counted: bool = True) -> None:
        msg.finished_at = now
        if counted:
            topic.live_count -= 1
            topic.live_bytes -= len(msg.data)
            self.backlog_bytes -= len(msg.data) + MESSAGE_OVERHEAD_BYTES
        if msg.expire_at:
            self.timers.unexpire(msg)
        retain = topic.cfg.retain_consumed_s
        if retain > 0 and self.settings.retain_consumed_max > 0:
            self.timers.retain(msg, now + retain, retain)
        elif self.messages.discard(msg):
            msg.forget()

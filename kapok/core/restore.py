"""The seams recovery and replication rebuild a broker through (``kapok.core.replay``).

``Recovery`` restores topics, groups, the sequence and claims as the change records say,
``resume``s a replayed live message (its open entries queued again, a delivery in flight
requeued) and ``retire``s a finished one for the rest of its retention.
"""

from __future__ import annotations

from collections.abc import Iterable

from kapok.core import changes as ch
from kapok.core.admission import MESSAGE_OVERHEAD_BYTES
from kapok.core.claims import Claims
from kapok.core.lifecycle import MessageLifecycle
from kapok.core.model import Entry, Message, Status
from kapok.core.topics import Group, Topic
from kapok.core.waiting import Waiting

__all__ = ["Recovery"]

_READY, _INFLIGHT = Status.READY, Status.INFLIGHT


class Recovery(MessageLifecycle):
    """The ``restore_*``, ``resume`` and ``retire`` seams (``Broker``'s layer)."""

    # ``kapok.core.replay`` rebuilds state from change records through these seams (the
    # WAL at start-up, a slave's stream). They skip the checks a client's request gets:
    # records hold only what was accepted once.

    def restore_topic(self, name: str) -> Topic:
        return self.topics.get(name) or self._make_topic(name, journal=False)

    def restore_group(self, topic: Topic, name: str, at: float) -> Group:
        # Replayed, never new: its own record is in the log being replayed.
        return self._group(topic, name, durable=True, now=at, journal=False)

    def restore_seq(self, next_seq: int) -> None:
        """Codes made from now on use sequence numbers from ``next_seq`` up (never lower)."""
        self._seq = max(self._seq, next_seq)

    def resume(self, msg: Message, now: float, reason: str = "recovery") -> int:
        """Make a replayed live message deliverable: its open entries go back to their queues
        (or wait for ``deliver_at``, or are dead-lettered past ``max_deliveries``). An entry
        replayed as in flight (delivered, never settled nor requeued) is requeued for
        ``reason`` ("recovery", "takeover"), which is journaled like any other requeue.
        Returns how many were (they are delivered again)."""
        topic = self.topics[msg.topic]
        timers = self.timers
        topic.live_count += 1
        topic.live_bytes += len(msg.data)
        self.backlog_bytes += len(msg.data) + MESSAGE_OVERHEAD_BYTES
        if topic.order is not None:
            topic.order.append(msg)
        if msg.expire_at:
            timers.expire(msg)
        delayed = msg.deliver_at > now
        if delayed:
            timers.delay(msg)
        limit = topic.cfg.max_deliveries
        redelivered = 0
        for entry in msg.all_entries():
            if entry.status.final:
                continue
            claims = entry.group.claims
            if claims is not None and entry in claims.of and entry.status is _INFLIGHT:
                continue  # stays in flight under its claim: ``resume_claims`` leases it again
            if limit and not topic.is_dlq and entry.attempts >= limit:
                self._dead_letter(entry, "max_deliveries", now)
                continue
            if entry.status is _INFLIGHT:
                redelivered += 1
                if self.journal:
                    self._changes.append(
                        ch.Requeued(msg.code, msg.topic, entry.group.name, reason, now, entry.attempts)
                    )
            if delayed:
                entry.status = Status.DELAYED
                topic.delayed_count += 1
            else:
                entry.group.push_ready(entry)
                self._dirty.add(entry.group)
        return redelivered

    def resume_all(self, messages: Iterable[Message | Waiting], now: float, reason: str = "recovery") -> int:
        """``resume`` every replayed live message and ``retire`` every finished one, in the
        order given (publish order); returns how many entries are delivered again. The common
        message (its one entry ready, never delivered, due, with no TTL; every ``Waiting``) is
        queued the short way: a million of them come back at every start-up."""
        dirty = self._dirty
        redelivered = 0
        added = 0
        for msg in messages:
            if type(msg) is Waiting and msg.create_time > now:
                msg = msg.resolve()  # due after now (the clock went back): the long way
            if type(msg) is Waiting or (
                not msg.finished_at
                and msg.status is _READY
                and not msg.attempts
                and not msg.more
                and not msg.expire_at
                and msg.deliver_at <= now
            ):
                group = msg.group
                topic = group.topic
                size = len(msg.data)
                topic.live_count += 1
                topic.live_bytes += size
                added += size + MESSAGE_OVERHEAD_BYTES
                if topic.order is not None and type(msg) is Message:  # (never a ``Waiting``'s topic)
                    topic.order.append(msg)
                (group.ready[msg.priority] or group.queue(msg.priority)).append(msg)
                group.ready_count += 1
                dirty.add(group)
            elif msg.finished_at:  # not ``live``
                self.retire(msg, now)
            else:
                redelivered += self.resume(msg, now, reason)
        self.backlog_bytes += added
        return redelivered

    def restore_claim(self, entry: Entry, claim: str, lease_s: float) -> None:
        """A replayed delivery of ``entry``: under ``claim`` ("" for none: it leaves any
        claim it was under)."""
        group = entry.group
        claims = group.claims
        if claim:
            if claims is None:
                claims = group.claims = Claims()
            claims.add(claim, lease_s, (entry,))
        elif claims is not None:
            self._unclaim(claims, entry)

    def unclaim(self, entry: Entry) -> None:
        """A replayed end of ``entry``'s delivery (settled, requeued, deleted)."""
        claims = entry.group.claims
        if claims is not None:
            self._unclaim(claims, entry)

    def resume_claims(self, now: float) -> int:
        """Lease every replayed entry in flight under a claim (``resume`` left them in
        flight) to its group's pull lessee again, for its claim's lease length from
        ``now``, in the order they were leased; returns how many."""
        resumed = 0
        for topic in self.topics.values():
            for group in topic.groups.values():
                claims = group.claims
                if claims is None:
                    continue
                lessee = self._lessee(group, now)
                held = lessee.held
                add = self.timers.deadlines.add
                for claim in claims.by_name.values():
                    deadline = now + claim.lease_s
                    for entry in claim.entries:
                        entry.consumer = lessee
                        entry.deadline = deadline
                        held[entry.msg.code] = entry
                        add(deadline, claim.lease_s, entry)
                        resumed += 1
        return resumed

    def retire(self, msg: Message, now: float) -> None:
        """Keep a replayed finished message for the rest of its retention, or forget it."""
        retain = self.topics[msg.topic].cfg.retain_consumed_s
        until = msg.finished_at + retain
        if retain > 0 and until > now:
            self.timers.retain(msg, until, retain)
        else:
            self.messages.discard(msg)

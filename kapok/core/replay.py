"""Rebuilding a broker from change records, and describing it as records.

Theory of operation. Recovery replays a snapshot and then the WAL written
after it into a fresh ``Broker`` with ``apply``, then ``finish_recovery``
turns the replayed facts into live structures at the real ``now``: open
entries become ready (or delayed, if not yet due), so whatever was in
flight when the node stopped is delivered again, flagged by its attempt
count, and journaled as a requeue (reason "recovery", or "takeover" on a
promoted slave); finished messages go to retention; timers are rebuilt.
Replay tells in-flight entries from the others by their last record: a
``Delivered`` leaves an entry ``INFLIGHT`` (with no consumer), a
``Requeued`` makes it ``READY`` again. A ``Delivered`` that names a claim
also puts the entry under it (``kapok.core.claims``), and whatever ends the
delivery takes it out: an entry still under a claim at the end stays in
flight, leased again for the claim's lease length. Replay and recovery go
through the broker's public seams (``restore_*``, ``resume``, ``retire``,
``unclaim``), never its private fields, so a replication slave can use them the same way.

Snapshots are *fuzzy*: ``state_records`` walks the live state in slices
while the node keeps running, so a slice may already contain effects of
WAL records written after the snapshot began. Replay is therefore
idempotent: a known code is not published twice, attempts only grow, a
final entry stays final, and a deleted message stays deleted. Replaying the
WAL from the snapshot's start position on top of the snapshot always yields
the state at the end of the WAL.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator, Set

from kapok.core import changes as ch
from kapok.core.broker import Broker, small_route
from kapok.core.codes import CodeBlock, CodeMaker
from kapok.core.model import Entry, Message, Status
from kapok.core.timers import RetentionQueue
from kapok.core.topics import Group
from kapok.core.waiting import Held, Waiting

__all__ = ["Mirror", "Restorer", "apply", "apply_all", "finish_recovery", "state_records"]

# Records ``apply_all`` looks at before it applies them: a busy log delivers a message a few
# hundred records after publishing it.
LOOKAHEAD = 4096


def apply(broker: Broker, record: ch.Change, restorer: Restorer | None = None) -> Message | None:
    """Apply one record during recovery (before ``finish_recovery``); a ``restorer`` given
    shares what consecutive messages share (``apply_all``'s). Returns the message the record
    finished (it settled the last open entry, or published to no group), else None."""
    messages = broker.messages
    if isinstance(record, ch.Published):
        broker.restore_seq(record.seq + 1)
        if record.dedup_id:  # even if the message is deleted later, its id stays taken
            broker.admission.dedup.add(record.topic, record.dedup_id, record.code, record.create_time)
        if messages.find(record.code, record.seq) is None:
            msg = (restorer or Restorer(broker)).restore(record)
            if type(msg) is Message and not msg.live:
                return msg
    elif isinstance(record, ch.Delivered):
        entry = _entry(broker, record.code, record.group)
        if entry is not None and not entry.status.final:
            entry.attempts = max(entry.attempts, record.attempts)
            entry.last_delivered_at = record.at
            entry.status = Status.INFLIGHT
            if record.claim or entry.group.claims is not None:
                broker.restore_claim(entry, record.claim, record.lease_s)
    elif isinstance(record, ch.Requeued):
        entry = _entry(broker, record.code, record.group)
        if entry is not None and entry.status is Status.INFLIGHT:
            entry.status = Status.READY
            if entry.group.claims is not None:
                broker.unclaim(entry)
    elif isinstance(record, ch.Settled):
        entry = _entry(broker, record.code, record.group)
        if entry is not None and not entry.status.final:
            if entry.group.claims is not None:
                broker.unclaim(entry)
            entry.status = Status(record.status)
            entry.settled_at = record.at
            msg = entry.msg
            if msg.settled():
                msg.finished_at = record.at
                return msg
    elif isinstance(record, ch.MessageDeleted):
        deleted = messages.pop(record.code)
        if deleted is not None:
            for entry in deleted.all_entries():
                broker.unclaim(entry)
    elif isinstance(record, ch.GroupCreated):
        group = broker.restore_group(broker.restore_topic(record.topic), record.group, record.at)
        if record.start == ch.EARLIEST:  # idempotent: a message with an entry there already is skipped
            broker.backfill(group, None)
    elif isinstance(record, ch.Deduped):
        broker.admission.dedup.add(record.topic, record.dedup_id, record.code, record.at)
    elif isinstance(record, ch.Checkpoint):
        broker.restore_seq(record.next_seq)
    return None


def apply_all(
    broker: Broker,
    records: Iterable[ch.Change],
    other: Callable[[ch.Change, Restorer], None] | None = None,
    dropped: Callable[[Message], None] | None = None,
) -> int:
    """``apply`` every record of ``records`` in order; returns how many. The common record,
    a message published without a dedup id whose code is not known yet, takes the short
    way (recovery replays a million of them): its topic's and groups' objects are looked up
    once per routing, and the sequence number is restored once at the end. A mirror gives
    ``other``, what it does with every other record, and ``dropped``, what it does with a
    message published to no group (finished at once).

    Records are taken ``LOOKAHEAD`` at a time, and a message that one of them delivers is
    made a ``Message`` at once, not a ``Waiting`` to be made one a few records later."""
    find = broker.messages.find
    restorer = Restorer(broker)
    restore = restorer.restore
    top = -1
    count = 0
    published, delivered = ch.Published, ch.Delivered
    records = iter(records)
    while chunk := list(itertools.islice(records, LOOKAHEAD)):
        restorer.soon = {r.code for r in chunk if type(r) is delivered}
        count += len(chunk)
        for record in chunk:
            if type(record) is not published or record.dedup_id or find(record.code, record.seq) is not None:
                if other is None:
                    apply(broker, record, restorer)
                else:
                    other(record, restorer)
                continue
            msg = restore(record)
            if record.seq > top:
                top = record.seq
            if dropped is not None and type(msg) is Message and not record.groups:
                dropped(msg)
    broker.restore_seq(top + 1)
    return count


class Restorer:
    """Builds the messages of published records (their codes not known yet), entries ready
    in each group. Decoded records hold fresh objects per message; a message keeps the
    broker's own names (or interned ones), the block of its code shared with the messages
    of its batch (``CodeMaker.compact``), and its batch's time, so that a million recovered
    messages hold no more than a million published ones."""

    __slots__ = ("_broker", "_codes", "_routes", "_time", "soon")

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.soon: Set[str] = frozenset()  # codes the records at hand deliver (``apply_all``)
        self._codes = CodeMaker()
        # A record's groups, and its first group (the topic's ``no_group`` when it has
        # none), by its topic and group names.
        self._routes: dict[tuple[str, tuple[str, ...]], tuple[tuple[Group, ...], Group, bool]] = {}
        self._time = 0.0

    def restore(self, record: ch.Published) -> Held:
        route = self._routes.get((record.topic, record.groups))
        if route is None:
            route = self._routes[record.topic, record.groups] = self._route(record)
        groups, first, plain = route
        create_time = record.create_time
        if create_time == self._time:
            create_time = self._time
        else:
            self._time = create_time
        seq = record.seq
        code = self._codes.compact(record.code, seq)
        key = record.key
        producer = sys.intern(record.producer_id) if record.producer_id else ""
        if (
            plain
            and record.code not in self.soon
            and record.deliver_at == create_time
            and not key
            and not record.priority
            and not record.expire_at
            and record.headers is None
        ):  # a plain message: as a ``Waiting`` (the records that follow it may make it a ``Message``)
            msg: Held = Waiting(seq, code, record.data, create_time, producer, record.dedup_id, first)
        else:
            deliver_at = create_time if record.deliver_at == create_time else record.deliver_at
            msg = Message(
                seq, code, record.data, sys.intern(key) if key else "", record.priority, create_time,
                deliver_at, record.expire_at or 0.0, producer, record.dedup_id, record.headers,
                group=first, status=Status.READY if groups else Status.DROPPED,
            )  # fmt: skip
            if len(groups) > 1:
                msg.route(groups[1:], Status.READY)
            elif not groups:
                msg.finished_at = create_time
        if type(code) is CodeBlock:  # the common case, without ``add``'s own test of it
            self._broker.messages.add_numbered(msg)
        else:
            self._broker.messages.add(msg)
        return msg

    def _route(self, record: ch.Published) -> tuple[tuple[Group, ...], Group, bool]:
        """The record's groups, its first group, and whether a plain message of the route
        may be a ``Waiting`` (one listed group, a topic that keeps no publish order)."""
        broker = self._broker
        topic = broker.restore_topic(record.topic)
        groups = tuple(broker.restore_group(topic, name, record.create_time) for name in record.groups)
        return groups, groups[0] if groups else topic.no_group(), small_route(topic, groups)


def _entry(broker: Broker, code: str, group: str) -> Entry | None:
    msg = broker.messages.get(code)
    return msg.entry(group) if msg is not None else None


def finish_recovery(broker: Broker, now: float, reason: str = "recovery") -> int:
    """Turn replayed state into queues and timers; returns how many entries in flight are
    requeued (journaled with ``reason``) to be delivered again. An entry in flight under a
    claim (``kapok.core.claims``) is not: it stays in flight under its claim, with a fresh
    lease of the claim's length, for its reader to fetch again and ack."""
    broker.admission.dedup.expire(now)
    # ``held()`` walks a copy: ``resume_all`` forgets finished messages past their retention.
    redelivered = broker.resume_all(broker.messages.held(), now, reason)
    broker.resume_claims(now)
    broker.dispatch(now)
    return redelivered


def state_records(broker: Broker, now: float) -> Iterator[ch.Change]:
    """The broker's state as records, for a snapshot; consume it in slices while serving."""
    yield ch.Checkpoint(broker.next_seq, now)
    for topic in list(broker.topics.values()):
        for group in list(topic.groups.values()):
            if group.durable:
                yield ch.GroupCreated(topic.name, group.name, now)
    for added, topic_name, dedup_id, code in broker.admission.dedup.items():
        yield ch.Deduped(topic_name, dedup_id, code, added)
    messages = broker.messages
    for msg in messages.held():  # a copy, walked in slices while the node serves
        if not messages.holds(msg):
            continue  # deleted or purged since the walk began
        code = msg.code
        durable = [e for e in msg.all_entries() if e.group.durable]
        yield ch.Published(
            msg.seq, code, msg.topic, msg.data, msg.key, msg.priority, msg.create_time, msg.deliver_at,
            msg.expire_at, msg.producer_id, msg.dedup_id, msg.headers, tuple(e.group.name for e in durable),
        )  # fmt: skip
        for e in durable:
            if isinstance(e, Entry) and e.attempts:  # (a ``Waiting`` was never delivered)
                claims = e.group.claims
                claim = claims.of.get(e) if claims is not None else None
                # The consumer is known while a subscriber holds the entry; a pull lessee is
                # named after its last puller, not necessarily this entry's.
                holder = e.consumer
                consumer = holder.name if holder is not None and not holder.is_pull else ""
                if claim is None:
                    yield ch.Delivered(
                        code, msg.topic, e.group.name, e.attempts, e.last_delivered_at, "", 0.0, consumer
                    )
                else:  # in flight under a claim: recovery keeps it so
                    yield ch.Delivered(
                        code, msg.topic, e.group.name, e.attempts, e.last_delivered_at, claim.name,
                        claim.lease_s, consumer,
                    )  # fmt: skip
                if not e.status.final and e.status is not Status.INFLIGHT:  # requeued since
                    yield ch.Requeued(
                        code, msg.topic, e.group.name, "snapshot", e.last_delivered_at, e.attempts
                    )
            if e.status.final:
                yield ch.Settled(code, msg.topic, e.group.name, e.status.value, "snapshot", e.settled_at)


class Mirror:
    """A broker kept as a copy of another node's log: a slave following its master.

    Records are applied as they arrive (``apply``), exactly as recovery applies them, so
    the broker stays in the replayed form: no queues, no timers, no deliveries. Replay
    alone never forgets a finished message (recovery forgets them once, at the end), so a
    long-lived mirror queues each message that finishes and ``prune`` forgets it when its
    retention is over, or early past ``retain_consumed_max``, as the master does.
    ``promote`` ends mirroring: the broker becomes live (``finish_recovery``).

    Applying records never records anything of its own (the ``restore_*`` seams write no
    change records), so the mirror's log stays its master's, LSN for LSN.
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._finished: RetentionQueue[Message] = RetentionQueue(broker.settings.retain_consumed_max)
        for msg in broker.messages.held():  # what recovery replayed into it already
            if type(msg) is Message and not msg.live:
                self._retire(msg)

    def apply(self, record: ch.Change, restorer: Restorer | None = None) -> None:
        finished = apply(self.broker, record, restorer)
        if finished is not None:
            self._retire(finished)

    def apply_all(self, records: Iterable[ch.Change]) -> None:
        """``apply`` every record of ``records`` in order (a batch of the master's), taking
        recovery's short way for the common publish."""
        apply_all(self.broker, records, self.apply, self._retire)

    def _retire(self, msg: Message) -> None:
        retain = self.broker.topics[msg.topic].cfg.retain_consumed_s
        self._finished.add(msg.finished_at + retain, retain, msg)

    @property
    def over_retention(self) -> bool:
        """More finished messages are kept than ``retain_consumed_max``: prune now."""
        return len(self._finished) > self._finished.max_items

    def prune(self, now: float) -> int:
        """Forget finished messages whose retention is over, or past the count limit;
        returns how many."""
        messages = self.broker.messages
        forgotten = 0
        for msg in self._finished.pop_due(now):
            if messages.discard(msg):
                msg.forget()
                forgotten += 1
        self.broker.admission.dedup.expire(now)
        return forgotten

    def promote(self, now: float, reason: str = "takeover") -> int:
        """Make the mirrored state live; returns how many entries in flight when the log
        ended are requeued (journaled with ``reason``: "takeover" from a master, "recovery"
        of a node's own log at start-up) to be delivered again."""
        return finish_recovery(self.broker, now, reason)

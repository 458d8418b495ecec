"""Pull mode: leases held by a durable group rather than by a connection.

``PullMode`` leases ready messages to a group's pull lessee (``pull``), optionally under a
named claim (``kapok.core.claims``) that a retried pull gets back, and settles leased
messages by group (``settle_in_group``, ``settle_leases``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from kapok.core import changes as ch
from kapok.core.claims import Claim, Claims
from kapok.core.lifecycle import MessageLifecycle
from kapok.core.model import Entry, Status
from kapok.core.state import check_name
from kapok.core.topics import DEFAULT_GROUP, Group
from kapok.errors import NotFoundError, SubscriptionError

__all__ = ["PullMode", "Settle"]


class Settle(enum.Enum):
    """How ``settle_in_group`` settles a leased message."""

    ACK = "ack"
    REQUEUE = "requeue"  # a nack that gives the message back to the queue
    REJECT = "reject"  # a nack that dead-letters it


class PullMode(MessageLifecycle):
    """Leases by group: ``pull`` and settling what was pulled (``Broker``'s layer)."""

    # ------------------------------------------------------------ settling by group

    def _held_in_group(self, topic: str, group: str, code: str) -> Entry | None:
        msg = self.messages.get(code)
        entry = msg.entry(group) if msg is not None and msg.topic == topic else None
        if entry is None or entry.status is not Status.INFLIGHT or entry.consumer is None:
            return None
        return entry

    def settle_in_group(
        self, topic: str, group: str | None, codes: Iterable[str], how: Settle, now: float
    ) -> list[str]:
        """Ack, requeue or reject leased messages by group (``None``: the p2p default group).

        Used by pull mode, where the lease is held by the group rather than by a
        connection; returns the codes that were not in flight in that group. Settling
        creates nothing: an unknown topic or group is a ``NotFoundError``.
        """
        return self.settle_leases(topic, group, codes, "", how, now)[1]

    def settle_leases(
        self, topic: str, group: str | None, codes: Iterable[str], claim: str, how: Settle, now: float
    ) -> tuple[int, list[str]]:
        """``settle_in_group`` of ``codes``, then of every entry in flight under ``claim``
        (when given; an unknown or settled claim settles nothing); returns how many entries
        were settled, and the codes that were not in flight in the group."""
        grp = self._existing_group(topic, group)
        group = grp.name
        unknown: list[str] = []
        codes = codes if isinstance(codes, list) else list(codes)
        claims = grp.claims
        if claim and claims is not None:
            claimed = [e.msg.code for e in claims.take(claim)]
            if not claims.by_name:
                grp.claims = None
            if codes and claimed:
                given = set(codes)
                claimed = [code for code in claimed if code not in given]
            codes = codes + claimed
        for code in codes:
            entry = self._held_in_group(topic, group, code)
            if entry is None:
                unknown.append(code)
                continue
            assert entry.consumer is not None
            if claims is not None:
                self._unclaim(claims, entry)
            entry.consumer.held.pop(code, None)
            self._dirty.add(entry.group)
            if how is Settle.ACK:
                self.stats.acked += 1
                self._finish(entry, Status.CONSUMED, "ack", now)
            elif how is Settle.REQUEUE:
                self.stats.nacked += 1
                self._requeue(entry, "nack", now)
            else:
                self.stats.nacked += 1
                self._dead_letter(entry, "rejected", now)
        self._dispatch(now)
        return len(codes) - len(unknown), unknown

    def _existing_group(self, topic_name: str, group_name: str | None) -> Group:
        topic = self.topics.get(topic_name)
        if topic is None:
            raise NotFoundError(f"no topic {topic_name!r}")
        group = topic.groups.get(DEFAULT_GROUP if group_name is None else group_name)
        if group is None or not group.durable:
            what = "no default group (it is pub/sub)" if group_name is None else f"no group {group_name!r}"
            raise NotFoundError(f"topic {topic_name!r} has {what}")
        return group

    # ------------------------------------------------------------ pull mode

    def pull(
        self,
        topic_name: str,
        group_name: str | None,
        max_n: int,
        lease_s: float,
        now: float,
        claim: str = "",
        start: str = "",
        consumer: str = "",
    ) -> list[Entry]:
        """Lease up to ``max_n`` ready messages of a durable group for ``lease_s`` seconds.

        Under a ``claim`` (``kapok.core.claims``) that still has entries in flight, the
        answer is those entries, their leases renewed, and nothing new is leased; else
        the messages leased are put under the claim. ``start``: see ``pull_group``.
        ``consumer``: who pulls, the name their ``Delivered`` records carry.
        """
        group = self.pull_group(topic_name, group_name, now, start)
        if claim and group.claims is not None:
            held = group.claims.get(claim)
            if held is not None:
                return self._renew(held, lease_s, now)
        lessee = self._lessee(group, now)
        lessee.ack_timeout_s = lease_s
        lessee.prefetch = len(lessee.held) + max_n
        # Every puller of the group shares its lessee, which gets entries only inside this
        # call (its prefetch is 0 otherwise): named so for the call, the deliveries are.
        lessee.name = consumer
        group.unpark()
        self._dirty.add(group)
        journaled = len(self._changes)
        self._dispatch(now)
        lessee.prefetch = 0
        entries = self._pushes.pop(lessee.id, [])
        if claim and entries:
            self._claim(group, claim, lease_s, entries, journaled)
        return entries

    def _claim(self, group: Group, name: str, lease_s: float, entries: list[Entry], journaled: int) -> None:
        """Put ``entries``, just leased, under the claim ``name``; their ``Delivered`` records
        (journaled from index ``journaled`` on) carry it. They are rewritten here rather than
        built so by ``_deliver``, which then tests nothing per message for unclaimed pulls."""
        claims = group.claims
        if claims is None:
            claims = group.claims = Claims()
        claims.add(name, lease_s, entries)
        if not self.journal:
            return
        codes = {entry.msg.code for entry in entries}
        changes = self._changes
        delivered = ch.Delivered
        for i in range(journaled, len(changes)):
            r = changes[i]
            if type(r) is delivered and r.code in codes and r.group == group.name:
                changes[i] = delivered(r.code, r.topic, r.group, r.attempts, r.at, name, lease_s, r.consumer)

    def _renew(self, claim: Claim, lease_s: float, now: float) -> list[Entry]:
        """The entries in flight under ``claim``, their leases ending ``lease_s`` from now."""
        claim.lease_s = lease_s
        deadline = now + lease_s
        add = self.timers.deadlines.add
        entries = list(claim.entries)
        for entry in entries:
            entry.deadline = deadline
            add(deadline, lease_s, entry)
        return entries

    def pull_group(self, topic_name: str, group_name: str | None, now: float, start: str = "") -> Group:
        """The durable group a pull reads, made if new: with ``start`` ``changes.EARLIEST``,
        made with every live message of the topic (``backfill``), else with none (it gets
        what is published from now on). A group that exists is left as it is."""
        topic = self.topic(topic_name)
        if group_name is None:
            if DEFAULT_GROUP not in topic.groups:
                raise SubscriptionError(f"topic {topic_name!r} is pub/sub: pulling needs a named group")
            group_name = DEFAULT_GROUP
        check_name("group", group_name)
        if group_name.startswith("~"):
            raise SubscriptionError("group names starting with '~' are reserved")
        if start == ch.EARLIEST and group_name not in topic.groups:
            group = self._group(topic, group_name, durable=True, now=now, start=ch.EARLIEST)
            self.backfill(group, now)
            return group
        return self._group(topic, group_name, durable=True, now=now)

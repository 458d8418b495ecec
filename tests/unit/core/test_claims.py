"""Claims (``kapok.core.claims``): named pull leases fetched again, acked as a whole, and
kept in flight through a restart, a takeover and a snapshot.

Pure: a ``Broker`` driven with explicit ``now``; recovery is the replay of the records it
journaled into a fresh broker (what the WAL, a slave's mirror and a snapshot do).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kapok.config import Config, FrozenMap, MqConfig, TopicOverride
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.claims import Claims, check_claim
from kapok.core.model import Entry, Status
from kapok.core.replay import Mirror, apply, finish_recovery, state_records
from kapok.errors import BadRequestError

T0 = 1_700_000_000.0
LEASE = 30.0


def make(**kw: Any) -> Broker:
    topics = kw.pop("topics", {})
    mq: MqConfig = replace(Config.default().mq, topics=FrozenMap(topics), **kw)
    return Broker(mq.settings(), journal=True)


def pub(b: Broker, n: int, topic: str = "t", now: float = T0) -> list[str]:
    """Publish ``n`` messages to ``topic``, whose group "g" is made first (so it gets them)."""
    b.pull_group(topic, "g", now)
    return b.publish([Draft(topic, b"m%d" % i) for i in range(n)], now)


def codes(entries: list[Entry]) -> list[str]:
    return [e.msg.code for e in entries]


def pull(b: Broker, n: int, claim: str = "", now: float = T0 + 1, lease: float = LEASE) -> list[str]:
    return codes(b.pull("t", "g", n, lease, now, claim))


def claims_of(b: Broker, topic: str = "t", group: str = "g") -> Claims | None:
    return b.topics[topic].groups[group].claims


def check_index(b: Broker) -> None:
    """Every claimed entry is in flight, held by its group's pull lessee, both ways indexed."""
    for topic in b.topics.values():
        for group in topic.groups.values():
            claims = group.claims
            if claims is None:
                continue
            assert claims.by_name, "an empty Claims is forgotten"
            listed = [e for c in claims.by_name.values() for e in c.entries]
            assert len(listed) == len(claims.of) == len(set(map(id, listed)))
            for claim in claims.by_name.values():
                assert claim.entries
                for e in claim.entries:
                    assert claims.of[e] is claim
                    assert e.status is Status.INFLIGHT
                    assert group.pull is not None and e.consumer is group.pull
                    assert group.pull.held[e.msg.code] is e


def replayed(records: list[ch.Change], **kw: Any) -> Broker:
    b = make(**kw)
    for r in records:
        apply(b, r)
    return b


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "batch-1", "q:7.part_3", "A" * 200, "0"])
def test_valid_claim_names(name: str) -> None:
    assert check_claim(name) == name


@pytest.mark.parametrize("name", ["", "A" * 201, "a b", "a/b", "é", "a\n", 7, None])
def test_invalid_claim_names(name: object) -> None:
    with pytest.raises(BadRequestError):
        check_claim(name)


# ---------------------------------------------------------------- fetch again


def test_a_claim_fetched_again_answers_the_same_entries_and_nothing_new() -> None:
    b = make()
    published = pub(b, 10)
    first = pull(b, 3, "c1")
    assert first == published[:3]
    again = pull(b, 1000, "c1", now=T0 + 20)  # whatever N is: the same three, no new one
    assert again == first
    assert pull(b, 2) == published[3:5]  # an unclaimed pull leases the next ones
    assert pull(b, 2, "c2") == published[5:7]
    assert pull(b, 5, "c1", now=T0 + 21) == first
    check_index(b)


def test_fetching_again_renews_the_leases() -> None:
    b = make()
    pub(b, 2)
    first = b.pull("t", "g", 2, LEASE, T0 + 1, "c")
    assert {e.deadline for e in first} == {T0 + 1 + LEASE}
    b.pull("t", "g", 2, 50.0, T0 + 25, "c")  # renewed before the first lease ended
    assert {e.deadline for e in first} == {T0 + 75}
    b.tick(T0 + 1 + LEASE + 1)  # the first lease's end passes: nothing times out
    assert b.stats.timeouts == 0
    assert pull(b, 5, "c", now=T0 + 40) == codes(first)
    b.tick(T0 + 76)
    assert b.stats.timeouts == 2 and claims_of(b) is None
    # Ended: a pull under the claim leases afresh (the two, requeued to the front).
    assert pull(b, 5, "c", now=T0 + 77) == codes(first)


def test_an_empty_answer_creates_no_claim() -> None:
    b = make()
    assert pull(b, 5, "c") == []
    assert claims_of(b) is None
    codes_ = pub(b, 1)
    assert pull(b, 5, "c") == codes_


def test_a_claim_is_per_group() -> None:
    b = make()
    published = pub(b, 2)
    b.pull("t", "g", 1, LEASE, T0, "c")
    b.pull("t", "h", 1, LEASE, T0, "c")  # group h was made by this pull: gets later messages only
    assert codes(b.pull("t", "g", 1, LEASE, T0, "c")) == published[:1]
    assert b.pull("t", "h", 1, LEASE, T0, "c") == []
    check_index(b)


# ---------------------------------------------------------------- ack by claim


def test_ack_by_claim_settles_every_entry_and_is_idempotent() -> None:
    b = make()
    published = pub(b, 4)
    pull(b, 3, "c")
    b.take_changes()
    assert b.settle_leases("t", "g", [], "c", Settle.ACK, T0 + 2) == (3, [])
    settled = b.take_changes()
    assert [r.code for r in settled if isinstance(r, ch.Settled)] == published[:3]
    assert all(r.status == "consumed" for r in settled if isinstance(r, ch.Settled))
    assert b.settle_leases("t", "g", [], "c", Settle.ACK, T0 + 3) == (0, [])
    assert b.settle_leases("t", "g", [], "never", Settle.ACK, T0 + 3) == (0, [])
    assert claims_of(b) is None
    assert pull(b, 5, "c") == published[3:]  # a settled claim's name leases afresh


def test_ack_by_claim_and_codes_settles_both_sets_once() -> None:
    b = make()
    published = pub(b, 4)
    pull(b, 2, "c")
    pull(b, 1)
    settled, unknown = b.settle_leases(
        "t", "g", [published[2], published[0], "f" * 32], "c", Settle.ACK, T0 + 2
    )
    assert (settled, unknown) == (3, ["f" * 32])
    assert b.stats.acked == 3
    check_index(b)


def test_nack_by_claim_requeues_them() -> None:
    b = make()
    published = pub(b, 3)
    pull(b, 2, "c")
    assert b.settle_leases("t", "g", [], "c", Settle.REQUEUE, T0 + 2) == (2, [])
    assert sorted(pull(b, 3, "d")) == published  # requeued to the front


def test_unknown_group_is_still_not_found() -> None:
    b = make()
    pub(b, 1)
    from kapok.errors import NotFoundError

    with pytest.raises(NotFoundError):
        b.settle_leases("t", "nope", [], "c", Settle.ACK, T0)


# ---------------------------------------------------------------- leaving a claim


def test_entries_leave_their_claim_when_acked_by_code_nacked_timed_out_or_deleted() -> None:
    b = make()
    published = pub(b, 5)
    assert pull(b, 5, "c") == published
    b.settle_in_group("t", "g", [published[0]], Settle.ACK, T0 + 2)
    b.settle_in_group("t", "g", [published[1]], Settle.REQUEUE, T0 + 2)
    b.settle_in_group("t", "g", [published[2]], Settle.REJECT, T0 + 2)
    assert b.delete(published[3], T0 + 2)
    check_index(b)
    assert pull(b, 5, "c", now=T0 + 3) == [published[4]]  # what is left in flight under it
    b.tick(T0 + 3 + LEASE)  # its lease (renewed at T0 + 3) ends
    assert claims_of(b) is None
    assert b.stats.timeouts == 1
    # Both requeued ones come back, leased under a new claim (the one timed out first).
    assert sorted(pull(b, 5, "c2", now=T0 + 40)) == sorted([published[1], published[4]])
    check_index(b)


def test_an_expired_claimed_message_leaves_its_claim() -> None:
    b = make()
    [code] = b.publish([Draft("t", b"x", ttl_s=5.0)], T0)
    pull(b, 1, "c")
    b.tick(T0 + 6)
    assert claims_of(b) is None
    assert b.messages[code].status is Status.EXPIRED if code in b.messages else True


def test_unclaimed_pulls_make_no_claims_and_journal_plain_deliveries() -> None:
    b = make()
    pub(b, 3)
    pull(b, 3)
    assert claims_of(b) is None
    delivered = [r for r in b.take_changes() if isinstance(r, ch.Delivered)]
    assert [(r.claim, r.lease_s) for r in delivered] == [("", 0.0)] * 3


def test_claimed_deliveries_journal_the_claim_and_lease() -> None:
    b = make()
    pub(b, 2)
    b.take_changes()
    pull(b, 2, "c", lease=12.5)
    delivered = [r for r in b.take_changes() if isinstance(r, ch.Delivered)]
    assert [(r.claim, r.lease_s) for r in delivered] == [("c", 12.5)] * 2
    pull(b, 2, "c", lease=7.0)  # fetching again journals nothing
    assert b.take_changes() == []


def test_a_push_consumer_beside_a_claimed_pull_gets_plain_deliveries() -> None:
    b = make()
    consumer = b.subscribe("t", group="g", now=T0, prefetch=2)
    published = pub(b, 2)  # the push consumer takes both
    b.take_changes()
    pub(b, 3)
    b.set_prefetch(consumer.id, 2, T0)
    got = pull(b, 2, "c")
    delivered = {r.code: r.claim for r in b.take_changes() if isinstance(r, ch.Delivered)}
    assert {code: delivered[code] for code in got} == {code: "c" for code in got}
    b.ack(consumer.id, published, T0 + 2)
    check_index(b)


# ---------------------------------------------------------------- durability


def test_recovery_keeps_claimed_entries_in_flight_and_requeues_the_others() -> None:
    one = {"t": TopicOverride(max_deliveries=1)}
    b = make(topics=one)
    published = pub(b, 5)
    claimed = pull(b, 2, "c", lease=40.0)
    plain = pull(b, 2)
    records = b.take_changes()

    r = replayed(records, topics=one)
    now = T0 + 100
    assert finish_recovery(r, now) == 0  # the plain ones: dead-lettered at max_deliveries 1
    check_index(r)
    out = r.take_changes()
    assert {x.code for x in out if isinstance(x, ch.Settled)} == set(plain)
    assert not [x for x in out if isinstance(x, ch.Requeued)]  # a claimed one is not requeued
    entries = r.pull("t", "g", 1000, 10.0, now + 1, "c")
    assert codes(entries) == claimed
    assert r.settle_leases("t", "g", [], "c", Settle.ACK, now + 2) == (2, [])
    assert codes(r.pull("t", "g", 1000, 10.0, now + 3)) == published[4:]


def test_a_recovered_claim_gets_a_fresh_lease_of_its_length() -> None:
    b = make()
    pub(b, 3)
    claimed = pull(b, 2, "c", lease=40.0)
    pull(b, 1)
    r = replayed(b.take_changes())
    now = T0 + 1000  # long after the lease ended on the old node
    assert finish_recovery(r, now) == 1  # the unclaimed one
    out = [x for x in r.take_changes() if isinstance(x, ch.Requeued)]
    assert [(x.reason, x.attempts) for x in out] == [("recovery", 1)]
    lessee = r.topics["t"].groups["g"].pull
    assert lessee is not None and list(lessee.held) == claimed
    assert {e.deadline for e in lessee.held.values()} == {now + 40.0}
    r.tick(now + 39)
    assert r.stats.timeouts == 0
    r.tick(now + 40)
    assert r.stats.timeouts == 2 and claims_of(r) is None
    assert {x.reason for x in r.take_changes() if isinstance(x, ch.Requeued)} == {"timeout"}


def test_replay_follows_a_claim_through_its_end() -> None:
    b = make()
    published = pub(b, 4)
    pull(b, 4, "c")
    b.settle_in_group("t", "g", [published[0]], Settle.ACK, T0 + 2)
    b.settle_in_group("t", "g", [published[1]], Settle.REQUEUE, T0 + 2)
    b.delete(published[2], T0 + 2)
    again = pull(b, 1, "d", now=T0 + 3)  # the requeued one, under another claim
    assert again == [published[1]]
    b.tick(T0 + 3 + LEASE)  # d's lease ends; c's last entry (published[3]) too
    pull(b, 5, now=T0 + 3 + LEASE)  # redelivered unclaimed
    r = replayed(b.take_changes())
    assert r.topics["t"].groups["g"].claims is None
    assert finish_recovery(r, T0 + 500) == 2
    assert r.pull("t", "g", 9, 5.0, T0 + 501, "c") != []  # leased afresh: c was gone


def test_a_slave_mirror_keeps_claims_and_its_takeover_leases_them_again() -> None:
    master = make()
    pub(master, 6)
    mirror = Mirror(make())
    claimed = pull(master, 3, "batch-7", lease=20.0)
    for r in master.take_changes():
        mirror.apply(r)
    pull(master, 2)
    master.settle_leases("t", "g", [], "batch-7", Settle.ACK, T0 + 2)
    claimed_later = pull(master, 1, "batch-8", now=T0 + 3)
    for r in master.take_changes():
        mirror.apply(r)
    slave = mirror.broker
    assert mirror.promote(T0 + 50) == 2  # the two unclaimed ones
    check_index(slave)
    assert [x.reason for x in slave.take_changes() if isinstance(x, ch.Requeued)] == ["takeover"] * 2
    assert codes(slave.pull("t", "g", 100, 20.0, T0 + 51, "batch-8")) == claimed_later
    assert slave.settle_leases("t", "g", [], "batch-7", Settle.ACK, T0 + 52) == (0, [])  # acked before
    assert slave.settle_leases("t", "g", [], "batch-8", Settle.ACK, T0 + 52) == (1, [])
    assert set(claimed).isdisjoint(codes(slave.pull("t", "g", 100, 20.0, T0 + 53)))


def test_a_snapshot_keeps_claims() -> None:
    b = make()
    published = pub(b, 5)
    claimed = pull(b, 2, "c", lease=15.0)
    pull(b, 1)
    b.settle_leases("t", "g", [], "", Settle.ACK, T0)
    snapshot = list(state_records(b, T0 + 2))
    delivered = {r.code: (r.claim, r.lease_s) for r in snapshot if isinstance(r, ch.Delivered)}
    assert delivered == {claimed[0]: ("c", 15.0), claimed[1]: ("c", 15.0), published[2]: ("", 0.0)}
    r = replayed(snapshot)
    assert finish_recovery(r, T0 + 10) == 1
    assert codes(r.pull("t", "g", 100, 5.0, T0 + 11, "c")) == claimed
    check_index(r)


def test_a_snapshot_replayed_under_the_wal_after_it_is_idempotent() -> None:
    b = make()
    published = pub(b, 3)
    before = b.take_changes()
    pull(b, 2, "c")
    snapshot = list(state_records(b, T0 + 2))  # fuzzy: taken after the WAL records below began
    b.settle_leases("t", "g", [], "c", Settle.ACK, T0 + 3)
    pull(b, 1, "c", now=T0 + 4)
    wal = b.take_changes()
    r = replayed(before + snapshot + wal)
    finish_recovery(r, T0 + 10)
    assert codes(r.pull("t", "g", 100, 5.0, T0 + 11, "c")) == published[2:]
    check_index(r)

"""Each delivery's ``Delivered`` record names the consumer that got it (``Consumer.name``).

Pure: a journaling ``Broker`` driven with explicit ``now``. Subscribers are named when
they subscribe (the drivers choose the name: docs/protocol.md, "Consumer names"); a
pull names its puller; a claim leaves the name as it was; a snapshot's walk names the
subscriber that holds an entry in flight; and the records replay as before.
"""

from __future__ import annotations

from kapok.config import Config
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft
from kapok.core.replay import apply, finish_recovery, state_records
from kapok.core.topics import DEFAULT_GROUP

T0 = 1_700_000_000.0


def make() -> Broker:
    return Broker(Config.default().mq.settings(), journal=True)


def delivered(b: Broker) -> list[ch.Delivered]:
    return [r for r in b.take_changes() if isinstance(r, ch.Delivered)]


def test_two_consumers_of_a_group_are_each_named_in_their_deliveries() -> None:
    b = make()
    alice = b.subscribe("jobs", now=T0, group="workers", prefetch=2, name="alice")
    bob = b.subscribe("jobs", now=T0, group="workers", prefetch=2, name="bob")
    codes = b.publish([Draft("jobs", b"m%d" % i) for i in range(4)], T0)
    pushes = b.take_pushes()
    records = delivered(b)
    assert sorted(r.code for r in records) == sorted(codes)
    by_name = {r.code: r.consumer for r in records}
    assert {by_name[e.msg.code] for e in pushes[alice.id]} == {"alice"}
    assert {by_name[e.msg.code] for e in pushes[bob.id]} == {"bob"}
    assert all((r.claim, r.lease_s, r.group) == ("", 0.0, "workers") for r in records)


def test_a_redelivery_names_its_new_consumer() -> None:
    b = make()
    alice = b.subscribe("jobs", now=T0, name="alice")
    (code,) = b.publish([Draft("jobs", b"m")], T0)
    b.unsubscribe(alice.id, T0 + 1)  # requeued: bob gets it next
    b.subscribe("jobs", now=T0 + 2, name="bob")
    assert [(r.code, r.attempts, r.consumer) for r in delivered(b)] == [(code, 1, "alice"), (code, 2, "bob")]


def test_an_unnamed_subscriber_s_deliveries_name_nobody() -> None:
    b = make()
    b.subscribe("jobs", now=T0)
    b.publish([Draft("jobs", b"m")], T0)
    assert [r.consumer for r in delivered(b)] == [""]


def test_a_pull_names_its_puller_and_a_claim_keeps_the_name() -> None:
    b = make()
    b.pull_group("jobs", "g", T0)
    codes = b.publish([Draft("jobs", b"m%d" % i) for i in range(3)], T0)
    b.take_changes()
    assert len(b.pull("jobs", "g", 1, 30.0, T0 + 1, consumer="http:10.0.0.5")) == 1
    assert len(b.pull("jobs", "g", 2, 30.0, T0 + 2, claim="spark:q1", consumer="reader-2")) == 2
    assert [(r.code, r.claim, r.lease_s, r.consumer) for r in delivered(b)] == [
        (codes[0], "", 0.0, "http:10.0.0.5"),
        (codes[1], "spark:q1", 30.0, "reader-2"),
        (codes[2], "spark:q1", 30.0, "reader-2"),
    ]


def test_a_snapshot_names_a_subscriber_holding_an_entry_and_replays_as_before() -> None:
    b = make()
    b.subscribe("jobs", now=T0, prefetch=1, name="alice")
    first, second = b.publish([Draft("jobs", b"a"), Draft("jobs", b"b")], T0)  # alice holds the first
    b.pull_group("pulled", "g", T0)
    (leased,) = b.publish([Draft("pulled", b"c")], T0)
    b.pull("pulled", "g", 1, 30.0, T0 + 1, consumer="bob")
    snap = [r for r in state_records(b, T0 + 2) if isinstance(r, ch.Delivered)]
    # A pull lessee is named after its last puller, which need not be this entry's.
    assert {(r.code, r.consumer) for r in snap} == {(first, "alice"), (leased, "")}

    fresh = Broker(Config.default().mq.settings(), journal=True)
    for record in state_records(b, T0 + 2):
        apply(fresh, record)
    assert finish_recovery(fresh, T0 + 3) == 2  # both in flight: delivered again
    assert fresh.topics["jobs"].groups[DEFAULT_GROUP].ready_count == 2
    assert fresh.messages[second].entries[DEFAULT_GROUP].attempts == 0

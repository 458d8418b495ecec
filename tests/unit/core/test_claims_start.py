"""``start=earliest``: a group made by a pull gets every live message its topic holds.

For a stream reader's first run on a topic with a backlog (what a Kafka user calls
``startingOffsets=earliest``): finished messages are not given again, delayed ones wait
for their time, a group that exists is left as it is, and the group's making is journaled
so that recovery, a snapshot and a slave's mirror rebuild the same entries.
"""

from __future__ import annotations

from dataclasses import replace

from kapok.config import Config
from kapok.core import changes as ch
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.replay import Mirror, apply, finish_recovery, state_records
from kapok.storage.records import decode_frames, encode_batch

T0 = 1_700_000_000.0


def make() -> Broker:
    return Broker(replace(Config.default().mq).settings(), journal=True)


def codes_of(b: Broker, group: str, n: int = 100, now: float = T0 + 1) -> list[str]:
    return [e.msg.code for e in b.pull("t", group, n, 300.0, now)]


def backlog(b: Broker) -> tuple[list[str], str, str]:
    """Five messages in groups g and default: one acked in both (finished), one delayed,
    three ready."""
    b.pull_group("t", "g", T0)
    published = b.publish([Draft("t", b"m%d" % i) for i in range(4)], T0)
    [delayed] = b.publish([Draft("t", b"later", delay_s=60.0)], T0)
    for group in ("g", "default"):  # (a p2p topic has its default group too)
        [done] = codes_of(b, group, 1)
        b.settle_in_group("t", group, [done], Settle.ACK, T0 + 1)
    return published[1:], delayed, done


def test_a_new_group_started_at_earliest_gets_every_live_message() -> None:
    b = make()
    ready, delayed, _done = backlog(b)
    got = [e.msg.code for e in b.pull("t", "s", 100, 300.0, T0 + 2, start="earliest")]
    assert got == ready  # in publish order; neither the finished one nor the delayed one yet
    b.tick(T0 + 61)
    assert codes_of(b, "s", now=T0 + 61) == [delayed]
    assert codes_of(b, "g", now=T0 + 61) == [*ready, delayed]  # g untouched by s


def test_latest_is_the_default_and_an_existing_group_is_left_alone() -> None:
    b = make()
    backlog(b)
    assert b.pull("t", "new", 100, 30.0, T0 + 2) == []
    assert b.pull("t", "new", 100, 30.0, T0 + 3, start="earliest") == []  # exists already
    assert b.pull("t", "g", 1, 30.0, T0 + 3, start="earliest") != []  # g keeps its own


def test_the_making_is_journaled_and_replayed() -> None:
    b = make()
    ready, delayed, _ = backlog(b)
    b.pull_group("t", "s", T0 + 2, "earliest")
    journal = b.take_changes()
    made = [r for r in journal if isinstance(r, ch.GroupCreated) and r.group == "s"]
    assert made == [ch.GroupCreated("t", "s", T0 + 2, "earliest")]
    assert decode_frames(encode_batch(made)).records == made  # the row round-trips
    # Recovery, a slave's mirror and a snapshot all rebuild s's entries.
    recovered = make()
    for r in journal:
        apply(recovered, r)
    finish_recovery(recovered, T0 + 3)
    assert codes_of(recovered, "s", now=T0 + 4) == ready
    mirror = Mirror(make())
    for r in journal:
        mirror.apply(r)
    mirror.promote(T0 + 3)
    assert codes_of(mirror.broker, "s", now=T0 + 4) == ready
    snap = make()
    for r in list(state_records(b, T0 + 3)) + journal[-3:]:  # fuzzy: the tail of the WAL again
        apply(snap, r)
    finish_recovery(snap, T0 + 3)
    assert codes_of(snap, "s", now=T0 + 4) == ready
    snap.tick(T0 + 61)
    assert codes_of(snap, "s", now=T0 + 61) == [delayed]


def test_an_old_group_record_decodes_as_latest() -> None:
    record = ch.GroupCreated("t", "g", T0)
    assert record.start == ""
    assert decode_frames(encode_batch([record])).records == [record]

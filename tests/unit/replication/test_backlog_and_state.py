"""The master's backlog, the durable pair state, and the mirror a slave keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from kapok.config import Config
from kapok.core.broker import Broker, Draft, Settle
from kapok.core.replay import Mirror
from kapok.errors import StorageError
from kapok.replication.backlog import Backlog
from kapok.replication.state import PairState

T0 = 1_700_000_000.0


def test_backlog_keeps_whole_batches_within_its_bytes() -> None:
    backlog = Backlog(max_bytes=100, next_lsn=10)
    assert backlog.holds(10) and backlog.since(10) == []
    for i in range(5):
        backlog.offer(10 + 3 * i, 3, b"x" * 40, T0 + i)
    assert backlog.bytes <= 100 and len(backlog) == 2
    assert backlog.start == 19 and backlog.next_lsn == 25
    assert [b.first_lsn for b in backlog.since(19)] == [19, 22]
    assert backlog.since(25) == []
    assert backlog.since(30) == []  # not yet offered: nothing to send yet
    with pytest.raises(KeyError):
        backlog.since(13)  # evicted
    with pytest.raises(KeyError):
        backlog.since(20)  # inside a batch
    assert not backlog.holds(13) and backlog.holds(22) and backlog.holds(25)
    assert backlog.bytes_after(22) == 40
    assert backlog.logged_at(23) == T0 + 4 and backlog.logged_at(25) is None


def test_backlog_starts_afresh_after_a_gap() -> None:
    backlog = Backlog(max_bytes=1000, next_lsn=0)
    backlog.offer(0, 2, b"ab", T0)
    backlog.offer(50, 1, b"c", T0)
    assert backlog.start == 50 and len(backlog) == 1


def test_a_single_batch_larger_than_the_backlog_is_kept() -> None:
    backlog = Backlog(max_bytes=10, next_lsn=0)
    backlog.offer(0, 1, b"x" * 50, T0)
    assert backlog.holds(0) and backlog.bytes == 50


def test_pair_state_round_trips_and_refuses_damage(tmp_path: Path) -> None:
    assert PairState.load(tmp_path, leading=True) == PairState(leading=True)
    state = PairState().paired_with("b", "http://b:1").raised(2, 120).with_role(True)
    state.save(tmp_path)
    assert PairState.load(tmp_path, leading=False) == state
    assert state.history == ((1, 0), (2, 120)) and state.epoch == 2
    follower = state.following(3, ((1, 0), (2, 120), (3, 200)))
    assert follower.epoch == 3 and not follower.leading and follower.partner == "b"
    (tmp_path / "replication.json").write_text('{"epoch": 9, "history": [[1, 0]], "leading": true}')
    with pytest.raises(StorageError, match="epoch is not the last"):
        PairState.load(tmp_path, leading=True)
    (tmp_path / "replication.json").write_text("{not json")
    with pytest.raises(StorageError, match="cannot read"):
        PairState.load(tmp_path, leading=True)


def test_a_mirror_applies_a_masters_records_and_forgets_what_retention_lets_go() -> None:
    settings = Config.default().mq.settings()
    master = Broker(settings, journal=True)
    mirror = Mirror(Broker(settings))
    codes = master.publish([Draft("jobs", b"a"), Draft("jobs", b"b"), Draft("news", b"c")], T0)
    [lease] = master.pull("jobs", None, 1, 30.0, T0 + 1)
    master.settle_in_group("jobs", None, [lease.msg.code], Settle.ACK, T0 + 2)
    for record in master.take_changes():
        mirror.apply(record)
    copy = mirror.broker
    assert set(copy.messages) == set(master.messages)
    assert not copy.messages[codes[0]].live and copy.messages[codes[1]].live
    # Nothing is queued or delivered on a mirror.
    assert copy.take_pushes() == {} and copy.consumers == {}
    retain = settings.topic("jobs").retain_consumed_s
    assert mirror.prune(T0 + 2 + retain - 1) == 0
    assert mirror.prune(T0 + 3 + retain) == 1
    assert codes[0] not in copy.messages
    # Promoted: the open entries become deliverable.
    assert mirror.promote(T0 + 4) == 0
    consumer = copy.subscribe("jobs", now=T0 + 4)
    assert [e.msg.code for e in copy.take_pushes()[consumer.id]] == [codes[1]]


def test_a_mirror_applies_a_batch_as_it_applies_its_records_one_by_one() -> None:
    settings = Config.default().mq.settings()
    master = Broker(settings, journal=True)
    master.publish([Draft("jobs", b"a"), Draft("jobs", b"b", dedup_id="d"), Draft("news", b"c")], T0)
    [lease] = master.pull("jobs", None, 1, 30.0, T0 + 1)
    master.settle_in_group("jobs", None, [lease.msg.code], Settle.ACK, T0 + 2)
    master.publish([Draft("jobs", b"a again")], T0 + 3)
    records = master.take_changes()
    one_by_one, batched = Mirror(Broker(settings)), Mirror(Broker(settings))
    for record in records:
        one_by_one.apply(record)
    batched.apply_all(records)
    for mirror in (one_by_one, batched):
        assert set(mirror.broker.messages) == set(master.messages)
        assert mirror.broker.next_seq == master.next_seq
    retain = settings.topic("jobs").retain_consumed_s
    assert one_by_one.prune(T0 + 3 + retain) == batched.prune(T0 + 3 + retain) == 1


def test_applying_records_writes_none_of_its_own() -> None:
    """A slave's WAL must stay its master's, LSN for LSN: new topics and groups met while
    replaying must not add records (they did: every p2p topic's default group)."""
    settings = Config.default().mq.settings()
    master = Broker(settings, journal=True)
    master.publish([Draft("jobs", b"a")], T0)
    master.subscribe("news", now=T0, group="g")
    copy = Broker(settings, journal=True)
    mirror = Mirror(copy)
    for record in master.take_changes():
        mirror.apply(record)
    assert copy.take_changes() == []
    assert set(copy.topics) == {"jobs", "news"} and "g" in copy.topics["news"].groups

"""The sync link's two sessions, tested as a pair over a fake link on a manual clock.

A ``Wire`` carries frames both ways and can drop one direction or hold frames back; the
follower's WAL is a list whose durable end moves when the test says. Nothing here
sleeps or opens a socket: every rule of a session (acks capped at what was sent, the
hand-over after the last record, stall detection, when a follower is caught up) is a
function of frames and ``now``.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest

from kapok.core import changes as ch
from kapok.errors import ReplicationError, SyncRefusedError
from kapok.protocol.sync import encode_records
from kapok.replication.backlog import Backlog
from kapok.replication.session import (
    Acked,
    Append,
    Behind,
    FollowerSession,
    Frame,
    HandOver,
    Hello,
    LeaderSession,
    Paired,
    Promoted,
    Violation,
    admit,
    control,
)
from kapok.replication.state import PairState
from kapok.storage.records import decode_payload, encode_payload

HEARTBEAT_S = 0.5
STALL_S = 3.0


def _batch(n: int) -> bytes:
    return encode_payload([ch.Checkpoint(i, 1.0) for i in range(n)])


@dataclasses.dataclass
class Wire:
    """Two one-way queues; a cut direction drops what is sent into it."""

    to_follower: deque[Frame] = dataclasses.field(default_factory=deque)
    to_leader: deque[Frame] = dataclasses.field(default_factory=deque)
    cut_to_leader: bool = False
    cut_to_follower: bool = False


def caught_up(follower: FollowerSession) -> bool:
    """``follower.caught_up``, read through a call: after ``assert not follower.caught_up``
    mypy would hold it false across the steps that change it."""
    return follower.caught_up


class Pair:
    """A leader session and a follower session joined by a wire, on a manual clock."""

    def __init__(self, *, log_end: int = 0, follower_end: int = 0, auto_durable: bool = True) -> None:
        self.now = 100.0
        self.backlog = Backlog(1 << 20, log_end)
        self.log_end = log_end
        self.leader = LeaderSession(
            "s1", "http://s1", position=follower_end, now=self.now, heartbeat_s=HEARTBEAT_S, stall_s=STALL_S,
            pairing=Paired("s1", "http://s1", "tok"),
        )  # fmt: skip
        self.follower = FollowerSession(
            log_end=follower_end, now=self.now, heartbeat_s=HEARTBEAT_S, stall_s=STALL_S
        )
        self.wire = Wire()
        self.wal: list[Append] = []  # what the follower appended
        self.auto_durable = auto_durable
        self.leader_effects: list[Acked | Paired | Promoted] = []
        self.follower_effects: list[Append | HandOver] = []

    def log(self, count: int) -> None:
        self.backlog.offer(self.log_end, count, _batch(count), self.now)
        self.log_end += count

    def step(self, dt: float = 0.1) -> None:
        """One round: the leader sends, the follower takes and answers, the leader takes."""
        self.now += dt
        for frame in self.leader.outgoing(self.now, self.backlog, epoch=1, log_end=self.log_end, lag=None):
            if not self.wire.cut_to_follower:
                self.wire.to_follower.append(frame)
        while self.wire.to_follower:
            for effect in self.follower.receive(self.wire.to_follower.popleft(), self.now):
                self.follower_effects.append(effect)
                if isinstance(effect, Append):
                    self.wal.append(effect)
                    if self.auto_durable:
                        self.follower.made_durable(effect.end)
        for frame in self.follower.outgoing(self.now, epoch=1):
            if not self.wire.cut_to_leader:
                self.wire.to_leader.append(frame)
        while self.wire.to_leader:
            self.leader_effects.extend(self.leader.receive(self.wire.to_leader.popleft(), self.now))

    def run(self, seconds: float, dt: float = 0.1) -> None:
        for _ in range(round(seconds / dt)):
            self.step(dt)


def test_records_stream_in_the_batches_the_wal_wrote_and_acks_come_back() -> None:
    pair = Pair()
    for n in (3, 1, 5):
        pair.log(n)
    pair.step()
    assert [(a.first_lsn, a.count) for a in pair.wal] == [(0, 3), (3, 1), (4, 5)]
    assert [len(decode_payload(a.payload)) for a in pair.wal] == [3, 1, 5]  # the master's very batches
    assert pair.leader.acked == 9 and pair.leader_effects[-1] == Acked(9)


def test_the_pairing_is_recorded_at_the_first_ack_only() -> None:
    pair = Pair()
    pair.log(2)
    pair.run(1.0)
    pairings = [e for e in pair.leader_effects if isinstance(e, Paired)]
    assert pairings == [Paired("s1", "http://s1", "tok")]
    # A follower that never acks is never paired.
    silent = Pair()
    silent.wire.cut_to_leader = True
    silent.log(2)
    silent.run(1.0)
    assert silent.leader_effects == []


def test_an_ack_beyond_what_the_session_sent_ends_it() -> None:
    pair = Pair()
    pair.log(4)
    pair.step()
    with pytest.raises(Violation, match="sent only up to 4"):
        pair.leader.receive(control("ack", lsn=10**15), pair.now)
    # An ack of what was sent is fine, however late.
    assert pair.leader.receive(control("ack", lsn=4), pair.now) == [Acked(4)]


def test_a_ping_never_moves_an_epoch_and_odd_frames_end_the_session() -> None:
    pair = Pair()
    assert pair.leader.receive(control("ping", epoch=99, lsn=0), pair.now) == []
    for bad in (b"R\x00", control("start"), control("hello")):
        with pytest.raises(Violation):
            pair.leader.receive(bad, pair.now)
    with pytest.raises(ReplicationError):
        pair.leader.receive(control("ping", epoch=-1), pair.now)


def test_the_hand_over_goes_after_the_last_record_before_it() -> None:
    pair = Pair()
    pair.log(3)
    pair.leader.hand_over(lsn=3, epoch=2)
    pair.wire.cut_to_follower = True  # the records have not gone out yet: no hand-over either
    pair.leader.position = 0
    frames = pair.leader.outgoing(pair.now, pair.backlog, epoch=1, log_end=3, lag=None, limit=0)
    assert not any(isinstance(f, dict) and f["op"] == "handover" for f in frames)
    pair.wire.cut_to_follower = False
    pair.step()
    assert pair.follower_effects[-1] == HandOver(3, 2)
    assert [a.end for a in pair.wal] == [3]
    # The follower answers promoted; the leader sees it once.
    assert pair.leader.receive(control("promoted", epoch=2), pair.now) == [Promoted(2)]
    assert pair.leader.receive(control("promoted", epoch=2), pair.now) == []


def test_a_hand_over_at_another_lsn_than_the_followers_end_is_refused() -> None:
    follower = FollowerSession(log_end=5, now=0.0, heartbeat_s=HEARTBEAT_S, stall_s=STALL_S)
    with pytest.raises(Violation, match="our log ends at 5"):
        follower.receive(control("handover", lsn=7, epoch=2), 0.0)


def test_records_with_a_gap_are_refused_and_a_batch_is_passed_on_as_it_came() -> None:
    follower = FollowerSession(log_end=5, now=0.0, heartbeat_s=HEARTBEAT_S, stall_s=STALL_S)
    with pytest.raises(Violation, match="records from LSN 6"):
        follower.receive(encode_records(6, 1, _batch(1)), 0.0)
    (appended,) = follower.receive(encode_records(5, 2, _batch(2)), 0.0)
    assert isinstance(appended, Append) and appended.end == 7
    assert appended.payload == _batch(2)  # undecoded: the applier checks its count later
    with pytest.raises(SyncRefusedError) as refused:
        follower.receive(control("refused", why="behind", reason="r"), 0.0)
    assert refused.value.why == "behind"


def test_acks_wait_for_the_wal_and_say_only_what_is_durable() -> None:
    pair = Pair(auto_durable=False)
    pair.log(4)
    pair.step()
    assert pair.wal and pair.leader.acked == 0  # the first ack says where it starts: 0
    pair.follower.made_durable(4)
    pair.step()
    assert pair.leader.acked == 4


def test_caught_up_means_it_acked_the_leaders_end_as_of_the_first_ping() -> None:
    pair = Pair(log_end=0)
    pair.log(10)
    pair.follower.made_durable(0)
    follower = pair.follower
    assert not caught_up(follower)
    pair.step()  # records and the first ping (log end 10) in one round
    assert follower.catch_up_to == 10 and follower.caught_up
    # Records logged later do not move the bar: it stays caught up as it acks on.
    pair.log(5)
    pair.step()
    assert follower.catch_up_to == 10 and follower.caught_up


def test_a_follower_whose_acks_are_stuck_is_never_caught_up() -> None:
    pair = Pair(auto_durable=False)  # a full disk: nothing becomes durable
    pair.log(10)
    pair.run(2.0)
    assert pair.follower.catch_up_to == 10 and not pair.follower.caught_up


def test_a_follower_behind_the_backlog_is_told_so() -> None:
    backlog = Backlog(100, 0)
    for i in range(20):
        backlog.offer(i * 4, 4, _batch(4), 0.0)  # more bytes than the backlog keeps
    assert backlog.start > 0
    session = LeaderSession("s1", "u", position=0, now=0.0, heartbeat_s=HEARTBEAT_S, stall_s=STALL_S)
    with pytest.raises(Behind):
        session.outgoing(0.0, backlog, epoch=1, log_end=80, lag=None)


def test_pings_every_heartbeat_keep_an_idle_link_from_stalling() -> None:
    pair = Pair()
    pair.run(10 * STALL_S)
    assert pair.leader.silence_left(pair.now) > 0 and pair.follower.silence_left(pair.now) > 0


@pytest.mark.parametrize("direction", ["to_leader", "to_follower"])
def test_a_link_silent_in_one_direction_is_stalled_after_stall_s(direction: str) -> None:
    pair = Pair()
    pair.run(1.0)
    setattr(pair.wire, f"cut_{direction}", True)
    cut_at = pair.now
    while pair.now - cut_at < 2 * STALL_S:
        pair.step()
        deaf = pair.leader if direction == "to_leader" else pair.follower
        if deaf.silence_left(pair.now) <= 0:
            break
    # Stalled stall_s after the last frame heard (a ping at most a heartbeat before the cut).
    assert STALL_S - HEARTBEAT_S - 0.1 <= pair.now - cut_at <= STALL_S + 0.1
    other = pair.follower if direction == "to_leader" else pair.leader
    assert other.silence_left(pair.now) > 0


# ---------------------------------------------------------------- admission


def _hello(**kw: object) -> Hello:
    fields: dict[str, object] = {
        "node": "s1", "http_url": "http://s1", "epoch": 1, "lsn": 0, "history": ((1, 0),), "token": "tok",
        "ask_back": False,
    }  # fmt: skip
    fields.update(kw)
    return Hello(**fields)  # type: ignore[arg-type]


def test_admission_refuses_strangers_newer_epochs_and_second_sessions() -> None:
    paired = dataclasses.replace(PairState(), partner="s1", token="tok", epoch=1)
    assert admit(_hello(), "m1", paired, live_session=False) is None
    cases = {
        "paired": _hello(node="intruder"),
        "stranger": _hello(token="guess"),
        "newer_epoch": _hello(epoch=99),
    }
    for why, hello in cases.items():
        refusal = admit(hello, "m1", paired, live_session=False)
        assert refusal is not None and refusal.why == why, why
    busy = admit(_hello(), "m1", paired, live_session=True)
    assert busy is not None and busy.why == "busy"
    # A master never paired takes its first slave, whatever token it shows.
    assert admit(_hello(token=""), "m1", PairState(), live_session=False) is None

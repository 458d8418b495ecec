"""One sync link's two ends as pure state machines: frames and ``now`` in, frames and effects out.

The leader's ``/sync/v1`` handler and the follower's dialler (``leader.py``,
``follower.py``) only move bytes and run effects; every rule of a session lives here and
is tested as a pair over a fake link on a manual clock (``tests/unit/replication/
test_sessions.py``), the way h11 tests two connections against each other.

- ``admit`` is the leader's answer to a ``hello``: a refusal with its reason, or None. A
  stranger (another slave, a wrong pairing token) is refused and changes nothing; a higher
  epoch is not adopted from a hello (the node checks gossip or the partner's ``/health``
  first); a live session is never displaced.
- ``LeaderSession``: ``outgoing`` gives the records the follower has not been sent yet (the
  very batches the WAL wrote), the ``handover`` frame once every record before its LSN has
  gone out, and a ``ping`` every heartbeat; ``receive`` takes the follower's frames. An ack
  is capped at what this session sent (beyond it: ``Violation``); a ping never moves an
  epoch; the pairing is recorded at the first ack (the follower acks only once it has stored
  the token).
- ``FollowerSession``: ``receive`` checks each records frame against the log's end (no
  gap) and answers ``Append``, without decoding the batch (the follower journals it as it
  came and applies it later: ``kapok.replication.applier``, which checks the count); a
  ``handover`` at the log's end answers ``HandOver``. ``outgoing`` acks what the WAL made
  durable and pings every heartbeat. It is *caught up* once it has acked the leader's log
  end as of the first ping.
- Both ends call a link *stalled* after ``stall_s`` without a frame (a TCP connection that
  stalled still looks open).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from kapok.errors import ReplicationError, SyncRefusedError
from kapok.protocol.sync import RECORDS, decode_records, encode_records, get_int, get_str
from kapok.replication.backlog import Backlog
from kapok.replication.protocol import History, history_from_json
from kapok.replication.state import PairState

__all__ = [
    "Acked",
    "Append",
    "Behind",
    "FollowerSession",
    "HandOver",
    "Hello",
    "LeaderSession",
    "Paired",
    "Promoted",
    "Refusal",
    "Start",
    "Violation",
    "admit",
    "control",
    "parse_hello",
    "parse_start",
    "refused",
]

Frame = dict[str, Any] | bytes  # a control frame ({"op": ...}) or a binary one


def control(op: str, **fields: Any) -> dict[str, Any]:
    return {"op": op, **fields}


class Violation(ReplicationError):
    """The other end sent a frame that breaks the protocol: the session ends, counted."""


class Behind(Exception):
    """The follower's position has left the backlog: it needs a full transfer."""


# ---------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Acked:
    """Leader: the follower holds everything before ``lsn`` durably."""

    lsn: int


@dataclass(frozen=True, slots=True)
class Paired:
    """Leader: record the pairing (the follower's first ack)."""

    name: str
    url: str
    token: str


@dataclass(frozen=True, slots=True)
class Promoted:
    """Leader: the follower confirmed a hand-over at ``epoch``."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Append:
    """Follower: write this batch to the WAL as it came, and queue it for the mirror."""

    first_lsn: int
    count: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.first_lsn + self.count


@dataclass(frozen=True, slots=True)
class HandOver:
    """Follower: once everything before ``lsn`` is durable, lead at ``epoch``."""

    lsn: int
    epoch: int


# ---------------------------------------------------------------- the leader's admission


@dataclass(frozen=True, slots=True)
class Hello:
    node: str
    http_url: str
    epoch: int
    lsn: int  # the end of the follower's log
    history: History
    token: str
    ask_back: bool  # a returning master that wants its role back


def parse_hello(frame: dict[str, Any]) -> Hello:
    return Hello(
        node=get_str(frame, "node"),
        http_url=get_str(frame, "http_url"),
        epoch=get_int(frame, "epoch"),
        lsn=get_int(frame, "lsn"),
        history=history_from_json(frame.get("history")),
        token=get_str(frame, "token", ""),
        ask_back=frame.get("ask_back") is True,
    )


@dataclass(frozen=True, slots=True)
class Start:
    """The leader's answer to a hello, as the follower takes it."""

    leader: str
    mode: str  # "resume" or "full"
    lsn: int  # resume: the follower's log end; full: the snapshot's LSN
    shared: int  # full: the end of the log prefix both share (the rest is set aside)
    epoch: int
    history: History
    token: str


def parse_start(frame: dict[str, Any], *, epoch: int, log_end: int) -> Start:
    """``ReplicationError`` for a leader behind our epoch, or a resume elsewhere than our end."""
    start = Start(
        leader=get_str(frame, "leader"),
        mode="full" if frame.get("mode") == "full" else "resume",
        lsn=get_int(frame, "lsn"),
        shared=get_int(frame, "shared") if frame.get("mode") == "full" else log_end,
        epoch=get_int(frame, "epoch"),
        history=history_from_json(frame.get("history")),
        token=get_str(frame, "token"),
    )
    if start.epoch < epoch:
        raise ReplicationError(f"the master leads at epoch {start.epoch}, ours is {epoch}")
    if start.mode == "resume" and start.lsn != log_end:
        raise ReplicationError(f"the master resumes at {start.lsn}, our log ends at {log_end}")
    return start


@dataclass(frozen=True, slots=True)
class Refusal:
    why: str  # a key the follower maps to words for its operator
    reason: str

    def frame(self) -> dict[str, Any]:
        return control("refused", why=self.why, reason=self.reason)


def admit(hello: Hello, me: str, state: PairState, *, live_session: bool) -> Refusal | None:
    """Whether the leader ``me`` takes this follower; ``live_session``: a session that has
    been heard within ``stall_s`` is open already."""
    if state.partner not in (None, hello.node):
        return Refusal("paired", f"{me} is paired with {state.partner}; unpair it first")
    if state.token is not None and not _same(hello.token, state.token):
        return Refusal("stranger", f"{hello.node} did not show this pair's token; unpair {me} first")
    if hello.epoch > state.epoch:  # the other node says it led later: the node checks it
        return Refusal("newer_epoch", f"epoch {hello.epoch} is newer than {me}'s {state.epoch}")
    if live_session:
        return Refusal("busy", f"{hello.node} is already connected; a live session is never replaced")
    return None


def _same(a: str, b: str) -> bool:
    return secrets.compare_digest(a.encode(), b.encode())


def refused(frame: dict[str, Any]) -> SyncRefusedError:
    """The error a ``refused`` frame stands for."""
    return SyncRefusedError(f"refused: {frame.get('reason')}", str(frame.get("why", "")))


# ---------------------------------------------------------------- the leader's side


class LeaderSession:
    """The leader's end of one follower's session."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        position: int,
        now: float,
        heartbeat_s: float,
        stall_s: float,
        ask_back: bool = False,
        acked: int = -1,
        pairing: Paired | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.ask_back = ask_back
        self.position = position  # the next LSN to send
        self.acked = acked  # the follower's durable end, once it says (a resume knows it already)
        self.pairing = pairing  # recorded at the follower's first ack
        self.promoted: int | None = None  # the epoch the follower confirmed a hand-over at
        self.heartbeat_s = heartbeat_s
        self.stall_s = stall_s
        self.last_heard = now
        self._last_ping = -math.inf
        self._handover: tuple[int, int] | None = None  # (LSN, epoch): sent once position reaches LSN

    def hand_over(self, lsn: int, epoch: int) -> None:
        self._handover = (lsn, epoch)

    def outgoing(
        self, now: float, backlog: Backlog, *, epoch: int, log_end: int, lag: Any, limit: int = 64
    ) -> list[Frame]:
        """What to send now: records from the follower's position, the hand-over after the
        last record before it, a ping when one is due. ``Behind`` when the position left
        the backlog."""
        try:
            batches = backlog.since(self.position, limit)
        except KeyError:
            raise Behind(self.position) from None
        out: list[Frame] = [encode_records(b.first_lsn, b.count, b.payload) for b in batches]
        if batches:
            self.position = batches[-1].end
        if self._handover is not None and self.position >= self._handover[0]:
            lsn, handover_epoch = self._handover
            self._handover = None
            out.append(control("handover", lsn=lsn, epoch=handover_epoch))
        if now - self._last_ping >= self.heartbeat_s:
            self._last_ping = now
            out.append(control("ping", epoch=epoch, lsn=log_end, lag=lag))
        return out

    def more_to_send(self, backlog: Backlog) -> bool:
        return self.position < backlog.next_lsn

    def receive(self, frame: Frame, now: float) -> list[Acked | Paired | Promoted]:
        self.last_heard = now
        if isinstance(frame, bytes):
            raise Violation("a slave sent a binary frame")
        op = frame["op"]
        if op == "ack":
            lsn = get_int(frame, "lsn")
            if lsn > self.position:
                raise Violation(f"{self.name} acked LSN {lsn}, but was sent only up to {self.position}")
            self.acked = max(self.acked, lsn)
            effects: list[Acked | Paired | Promoted] = []
            if self.pairing is not None:
                effects.append(self.pairing)
                self.pairing = None
            effects.append(Acked(self.acked))
            return effects
        if op == "ping":
            get_int(frame, "epoch")  # epochs are learned from gossip or /health, never from a ping
            return []
        if op == "promoted":
            if self.promoted is None:
                self.promoted = get_int(frame, "epoch")
                return [Promoted(self.promoted)]
            return []
        raise Violation(f"a slave sent {op!r}")

    def silence_left(self, now: float) -> float:
        """Seconds until the link counts as stalled (≤ 0: it does)."""
        return self.last_heard + self.stall_s - now


# ---------------------------------------------------------------- the follower's side


class FollowerSession:
    """The follower's end, from the ``start`` frame on."""

    def __init__(self, *, log_end: int, now: float, heartbeat_s: float, stall_s: float) -> None:
        self.expected = log_end  # where the next records frame must start
        self.durable = log_end  # the end of what the WAL has made durable
        self.acked = -1  # so the first ack says where we are
        self.catch_up_to: int | None = None  # the leader's log end as of its first ping
        self.lag: tuple[int, int, float] | None = None  # as the leader last reported it
        self.heartbeat_s = heartbeat_s
        self.stall_s = stall_s
        self.last_heard = now
        self._last_ping = -math.inf

    @property
    def caught_up(self) -> bool:
        """It has acked everything its leader had logged when this session began."""
        return self.catch_up_to is not None and self.acked >= self.catch_up_to

    def receive(self, frame: Frame, now: float) -> list[Append | HandOver]:
        self.last_heard = now
        if isinstance(frame, bytes):
            if frame[:1] != RECORDS:
                raise Violation("expected a records frame")
            first, count, view = decode_records(frame)
            if first != self.expected:
                raise Violation(f"records from LSN {first}, but our log ends at {self.expected}")
            self.expected = first + count
            return [Append(first, count, bytes(view))]
        op = frame["op"]
        if op == "ping":
            lag = frame.get("lag")
            if isinstance(lag, list) and len(lag) == 3:
                self.lag = (int(lag[0]), int(lag[1]), float(lag[2]))
            if self.catch_up_to is None:
                self.catch_up_to = get_int(frame, "lsn")
            return []
        if op == "handover":
            lsn, epoch = get_int(frame, "lsn"), get_int(frame, "epoch")
            if lsn != self.expected:
                raise Violation(f"hand-over at LSN {lsn}, but our log ends at {self.expected}")
            return [HandOver(lsn, epoch)]
        if op == "refused":
            raise refused(frame)
        raise Violation(f"the master sent {op!r}")

    def made_durable(self, end: int) -> None:
        self.durable = max(self.durable, end)

    def outgoing(self, now: float, *, epoch: int) -> list[Frame]:
        """An ack when the WAL made more durable; a ping when one is due."""
        out: list[Frame] = []
        if self.durable > self.acked:
            self.acked = self.durable
            out.append(control("ack", lsn=self.acked))
        if now - self._last_ping >= self.heartbeat_s:
            self._last_ping = now
            out.append(control("ping", epoch=epoch, lsn=self.durable))
        return out

    def silence_left(self, now: float) -> float:
        return self.last_heard + self.stall_s - now

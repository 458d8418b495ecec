"""The master/slave link's rules, free of I/O: its frames, epoch histories, and when to act.

Theory of operation. A pair is two nodes; at any time one *leads* (takes producers and
consumers, writes the log) and the other *follows* (mirrors the log, serves no client).
The follower dials the leader's ``/sync/v1`` WebSocket (the key is checked before the
upgrade) and says ``hello``: its name, its epoch, its epoch history and the end of its
log. The leader answers ``start``: ``resume`` from that LSN when the follower's log is a
prefix of its own and the backlog still holds what follows, else ``full``: a snapshot of
the state at an LSN (binary ``S`` frames, ended by ``snapshot_end``), then the log from
there. Records travel in the very batches the leader's WAL wrote (binary ``R`` frames:
first LSN, count, payload), so the follower writes and applies exactly what the leader
logged, under the same LSNs, and acks the LSN it has made durable (``ack``). Both sides
send ``ping`` with their epoch, their log's end and the time; silence on the link is what
the follower watches.

Epochs fence a pair. Every node keeps, durably, its epoch and its *history*: the LSN at
which each epoch began (Kafka's leader epochs). A follower that takes over raises the
epoch by one and starts a new history entry at its log's end. When the old leader comes
back, the shared end of the two logs is where its last epoch ended in the new leader's
history (``shared_end``): anything it wrote past that point never reached the new leader
(in sync mode it was never confirmed; in async mode it is the loss), and is set aside.

``assess`` is the state table: given the facts a node sees (the link, the gossip view,
the pair's epochs) it says what to do next. Drivers (``kapok.replication.link``,
``kapok.replication.node``) carry its answers out and make no decisions of their own.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Any, Final

import orjson

from kapok.errors import ReplicationError

__all__ = [
    "RECORDS",
    "SNAPSHOT",
    "Action",
    "Facts",
    "History",
    "Role",
    "assess",
    "decode_control",
    "decode_records",
    "encode_control",
    "encode_records",
    "end_of_epoch",
    "history_from_json",
    "leads_at_start",
    "shared_end",
]

History = tuple[tuple[int, int], ...]  # (epoch, the LSN of its first record), oldest first

RECORDS: Final = b"R"  # + first LSN, count, then a WAL batch payload
SNAPSHOT: Final = b"S"  # + snapshot frames as a snapshot file holds them
_RECORDS_HEAD: Final = struct.Struct(">QI")

# Control frames are JSON objects with an "op"; these are every op of the link.
OPS: Final = frozenset({"hello", "start", "snapshot_end", "ack", "ping", "handover", "promoted", "refused"})
MAX_CONTROL_BYTES: Final = 64 * 1024


class Role(enum.StrEnum):
    """What a node is in its pair right now."""

    STARTING = "starting"  # recovering; not yet decided
    LEADER = "leader"  # takes clients, writes the log, streams it
    FENCED = "fenced"  # a leader that lost its follower and the majority: refuses writes
    FOLLOWER = "follower"  # mirrors the leader's log, serves no client
    HANDING_OVER = "handing_over"  # a leader giving its role away: refuses clients meanwhile


class Action(enum.Enum):
    NONE = "none"
    TAKE_OVER = "take_over"  # follower: the leader is gone (link and gossip agree)
    FENCE = "fence"  # leader: cut off from the follower and from the majority
    UNFENCE = "unfence"  # fenced leader: the follower or the majority is back
    STEP_DOWN = "step_down"  # the other node leads at a higher epoch
    GIVE_BACK = "give_back"  # leader: hand the role back to the configured master


@dataclass(frozen=True, slots=True)
class Facts:
    """What a node knows when it asks ``assess``; times in seconds."""

    role: Role
    epoch: int
    paired: bool  # this node has had its partner (durable pairing)
    link_up: bool  # a sync link to the partner is open
    link_silent_s: float  # since the last frame from the partner, link up or not
    failover_timeout_s: float
    gossip: bool  # cluster membership is running (else the link alone decides)
    partner_alive: bool  # gossip sees the partner alive (not suspect, dead or left)
    partner_epoch: int  # the partner's epoch as gossip carries it (0: unknown)
    partner_active: bool  # the partner takes clients, as gossip says
    members_alive: int  # alive members in this node's view, itself included
    members_total: int  # members in the view that have not left, itself included
    give_back: bool = False  # this node is the configured slave, leads, and give_back is on
    partner_caught_up: bool = False  # the follower's acked LSN is the log's end


def assess(f: Facts) -> Action:
    """The state table of a pair, seen from one node."""
    if f.partner_active and f.partner_epoch > f.epoch and f.role is not Role.FOLLOWER:
        return Action.STEP_DOWN  # fencing: a higher epoch leads, always
    silent = f.link_silent_s >= f.failover_timeout_s
    if f.role is Role.FOLLOWER:
        # A broken link alone is not a dead leader: gossip must agree (when it runs).
        if f.paired and silent and not (f.gossip and f.partner_alive):
            return Action.TAKE_OVER
        return Action.NONE
    isolated = f.paired and silent and f.gossip and 2 * f.members_alive < f.members_total
    if f.role is Role.LEADER:
        if isolated:
            return Action.FENCE
        if f.give_back and f.link_up and f.partner_caught_up:
            return Action.GIVE_BACK
        return Action.NONE
    if f.role is Role.FENCED and not isolated:
        return Action.UNFENCE
    return Action.NONE


def leads_at_start(
    *, paired: bool, configured_master: bool, epoch: int, leading: bool, partner: tuple[int, bool] | None
) -> bool:
    """Whether a node starts as its pair's leader. ``partner`` is the partner's (epoch,
    active) from its ``/health``, or None when it does not answer. A higher epoch leads; at
    the same epoch an active partner keeps leading, else the configured master leads; an
    unreachable partner leaves the node in the role it had when it stopped (``leading``)."""
    if not paired:
        return configured_master
    if partner is None:
        return leading
    their_epoch, their_active = partner
    if their_active:
        return their_epoch < epoch
    return epoch > their_epoch or (epoch == their_epoch and configured_master)


# ---------------------------------------------------------------- epoch histories


def end_of_epoch(history: History, epoch: int, log_end: int) -> int | None:
    """Where ``epoch`` ended in ``history``: the first LSN of the next epoch, or
    ``log_end`` when it is the last one; None when the history has no such epoch."""
    for i, (e, _start) in enumerate(history):
        if e == epoch:
            return history[i + 1][1] if i + 1 < len(history) else log_end
    return None


def shared_end(follower: History, follower_end: int, leader: History, leader_end: int) -> int:
    """The end of the longest log prefix the two nodes share: the follower's newest epoch
    that the leader also knows, cut where either of them ended it."""
    for i in range(len(follower) - 1, -1, -1):
        epoch = follower[i][0]
        mine = follower[i + 1][1] if i + 1 < len(follower) else follower_end
        theirs = end_of_epoch(leader, epoch, leader_end)
        if theirs is not None:
            return min(mine, theirs)
    return 0


def history_from_json(value: Any) -> History:
    if not isinstance(value, list) or not value:
        raise ReplicationError("history must be a non-empty list of [epoch, lsn]")
    out: list[tuple[int, int]] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(type(x) is int and x >= 0 for x in item)
            or (out and (item[0] <= out[-1][0] or item[1] < out[-1][1]))
        ):
            raise ReplicationError(f"bad history entry {item!r}: epochs and LSNs must grow")
        out.append((item[0], item[1]))
    return tuple(out)


# ---------------------------------------------------------------- frames


def encode_control(op: str, **fields: Any) -> bytes:
    return orjson.dumps({"op": op, **fields})


def decode_control(raw: str | bytes) -> dict[str, Any]:
    if len(raw) > MAX_CONTROL_BYTES:
        raise ReplicationError("control frame too large")
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ReplicationError("control frame is not JSON") from None
    if not isinstance(frame, dict) or frame.get("op") not in OPS:
        raise ReplicationError(f"unknown control frame {str(raw)[:80]!r}")
    return frame


def encode_records(first_lsn: int, count: int, payload: bytes) -> bytes:
    return RECORDS + _RECORDS_HEAD.pack(first_lsn, count) + payload


def decode_records(frame: bytes) -> tuple[int, int, memoryview]:
    """``(first LSN, count, payload)`` of an ``R`` frame."""
    head = _RECORDS_HEAD.size + 1
    if len(frame) < head or frame[:1] != RECORDS:
        raise ReplicationError("not a records frame")
    first_lsn, count = _RECORDS_HEAD.unpack_from(frame, 1)
    if count < 1:
        raise ReplicationError("a records frame without records")
    return first_lsn, count, memoryview(frame)[head:]


def get_int(frame: dict[str, Any], name: str) -> int:
    value = frame.get(name)
    if type(value) is not int or value < 0:
        raise ReplicationError(f"{frame.get('op')}: field {name!r} must be a non-negative integer")
    return value


def get_str(frame: dict[str, Any], name: str, default: str | None = None) -> str:
    value = frame.get(name, default)
    if not isinstance(value, str):
        raise ReplicationError(f"{frame.get('op')}: field {name!r} must be a string")
    return value

"""The master/slave link's rules, free of I/O: epoch histories, and when to act.

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
the follower watches. The frames themselves are ``kapok.protocol.sync``'s.

Epochs fence a pair. Every node keeps, durably, its epoch and its *history*: the LSN at
which each epoch began (Kafka's leader epochs). A follower that takes over raises the
epoch by one and starts a new history entry at its log's end. When the old leader comes
back, the shared end of the two logs is where its last epoch ended in the new leader's
history (``shared_end``): anything it wrote past that point never reached the new leader
(in sync mode it was never confirmed; in async mode it is the loss), and is set aside.

``assess`` is the state table: given the facts a node sees (the link, the gossip view,
the pair's epochs) it says what to do next; ``TRANSITIONS`` is the one table of role
changes; ``kapok.replication.session`` holds the rules of one link's two ends. Drivers
(``leader``, ``follower``, ``node``) carry their answers out and decide nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from kapok.errors import ReplicationError

__all__ = [
    "TRANSITIONS",
    "Action",
    "Event",
    "Facts",
    "History",
    "Role",
    "assess",
    "end_of_epoch",
    "history_from_json",
    "is_isolated",
    "leads_at_start",
    "shared_end",
    "transition",
]

History = tuple[tuple[int, int], ...]  # (epoch, the LSN of its first record), oldest first


class Role(enum.StrEnum):
    """What a node is in its pair right now."""

    STARTING = "starting"  # recovering; not yet decided
    LEADER = "leader"  # takes clients, writes the log, streams it
    FENCED = "fenced"  # a leader that lost its follower and the majority: refuses writes
    FOLLOWER = "follower"  # mirrors the leader's log, serves no client
    HANDING_OVER = "handing_over"  # a leader giving its role away: refuses clients meanwhile
    STOPPED = "stopped"  # stopping or stopped: serves nothing, never takes a role back


class Event(enum.StrEnum):
    """What changes a node's role; ``TRANSITIONS`` says from which roles and to which."""

    LEAD = "lead"  # start-up decided to lead
    FOLLOW = "follow"  # start-up decided to follow, or a higher epoch leads elsewhere
    TAKE_OVER = "take_over"  # the follower's own decision: its leader is gone
    PROMOTED = "promoted"  # the leader handed its role over to us, or an operator promoted us
    FENCE = "fence"
    UNFENCE = "unfence"
    HAND_OVER = "hand_over"  # start giving the role away
    HANDED = "handed"  # the follower confirmed: it leads now
    HAND_OVER_FAILED = "hand_over_failed"
    STOP = "stop"


_LEADING = (Role.LEADER, Role.FENCED, Role.HANDING_OVER)

# role x event -> role: the only way a node's role changes (``ReplicationNode._become``).
TRANSITIONS: Final[dict[tuple[Role, Event], Role]] = {
    (Role.STARTING, Event.LEAD): Role.LEADER,
    (Role.STARTING, Event.FOLLOW): Role.FOLLOWER,
    (Role.FOLLOWER, Event.FOLLOW): Role.FOLLOWER,  # the leader moved: dial the new one
    (Role.FOLLOWER, Event.TAKE_OVER): Role.LEADER,
    (Role.FOLLOWER, Event.PROMOTED): Role.LEADER,
    (Role.LEADER, Event.FENCE): Role.FENCED,
    (Role.FENCED, Event.UNFENCE): Role.LEADER,
    (Role.LEADER, Event.HAND_OVER): Role.HANDING_OVER,
    (Role.HANDING_OVER, Event.HANDED): Role.FOLLOWER,
    (Role.HANDING_OVER, Event.HAND_OVER_FAILED): Role.LEADER,
    **{(role, Event.FOLLOW): Role.FOLLOWER for role in _LEADING},  # a higher epoch leads
    **{(role, Event.STOP): Role.STOPPED for role in Role},
}


def transition(role: Role, event: Event) -> Role:
    """The role ``event`` leads to from ``role``; ``ReplicationError`` when it may not happen."""
    try:
        return TRANSITIONS[(role, event)]
    except KeyError:
        raise ReplicationError(f"no transition from {role.value} on {event.value}") from None


class Action(enum.Enum):
    NONE = "none"
    TAKE_OVER = "take_over"  # follower: the leader is gone (link and gossip agree)
    FENCE = "fence"  # leader: cut off from the follower and from the majority
    UNFENCE = "unfence"  # fenced leader: the majority is back and no higher epoch leads
    STEP_DOWN = "step_down"  # the other node leads at a higher epoch
    GIVE_BACK = "give_back"  # leader: hand the role back to the configured master
    GO_ALONE = "go_alone"  # sync leader: the follower is gone, the majority is here: confirm alone
    BACK_IN_SYNC = "back_in_sync"  # a leader that confirmed alone: its follower holds it all again


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
    give_back: bool = False  # this node is the configured slave, leads, and its master asks back
    partner_caught_up: bool = False  # the follower's acked LSN is the log's end
    in_sync: bool = False  # follower: it has acked its leader's log end as of connecting
    partner_alone: bool = False  # the partner announced it confirms writes alone
    alone: bool = False  # leader: it confirms writes alone now
    sync_mode: bool = True  # replication.mode is sync (only then does "alone" mean anything)
    partner_confirmed: bool = False  # fenced: since the fence, gossip or its /health showed
    # the partner at an epoch no higher than ours, or not leading
    in_doubt: bool = False  # this node was frozen: its view is old until it hears its partner
    partner_left: bool = False  # gossip: the partner announced a graceful leave (it is stopping)


def _majority(f: Facts) -> bool:
    """This node sees a strict majority of the cluster alive, itself included."""
    return 2 * f.members_alive > f.members_total


def is_isolated(f: Facts) -> bool:
    """A leader cut off from its follower and from most of the cluster. It fences at half the
    failover timeout, so it has stopped before its follower (which waits the whole timeout)
    may take over: never two active nodes at once."""
    silent = f.link_silent_s >= f.failover_timeout_s / 2
    return f.paired and silent and f.gossip and 2 * f.members_alive < f.members_total


def assess(f: Facts) -> Action:
    """The state table of a pair, seen from one node."""
    if f.partner_active and f.partner_epoch > f.epoch and f.role in _LEADING:
        return Action.STEP_DOWN  # fencing: a higher epoch leads, always
    if f.in_doubt:
        return Action.NONE  # after a freeze nothing is decided on an old view
    silent = f.link_silent_s >= f.failover_timeout_s
    # A partner that left gracefully (an authenticated leave notice) is gone at once.
    partner_gone = f.paired and ((silent and not (f.gossip and f.partner_alive)) or f.partner_left)
    if f.role is Role.FOLLOWER:
        # A broken link alone is not a dead leader: gossip must agree (when it runs). Only a
        # follower that holds every write the pair confirmed may take over: it was acking
        # in this epoch, and its leader had not gone on alone. With gossip and a witness it
        # must also see the majority (one pair alone cannot tell a cut from a crash).
        witnessed = not f.gossip or f.members_total <= 2 or _majority(f)
        if partner_gone and f.in_sync and not f.partner_alone and witnessed:
            return Action.TAKE_OVER
        return Action.NONE
    isolated = is_isolated(f)
    if f.role is Role.LEADER:
        if isolated:
            return Action.FENCE
        if f.alone:
            return Action.BACK_IN_SYNC if f.link_up and f.partner_caught_up else Action.NONE
        if f.give_back and f.link_up and f.partner_caught_up:
            return Action.GIVE_BACK
        if f.sync_mode and partner_gone and f.gossip and _majority(f):
            return Action.GO_ALONE
        return Action.NONE
    if f.role is Role.FENCED and not isolated and f.partner_confirmed:
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

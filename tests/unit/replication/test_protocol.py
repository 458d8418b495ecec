"""The pair's state table and epoch arithmetic, as tables."""

from __future__ import annotations

from dataclasses import replace
from typing import TypedDict

import pytest

from kapok.errors import ReplicationError
from kapok.replication.protocol import (
    TRANSITIONS,
    Action,
    Event,
    Facts,
    Role,
    assess,
    end_of_epoch,
    history_from_json,
    leads_at_start,
    shared_end,
    transition,
)

FOLLOWING = Facts(
    role=Role.FOLLOWER, epoch=1, paired=True, link_up=True, link_silent_s=0.1, failover_timeout_s=3.0,
    gossip=True, partner_alive=True, partner_epoch=1, partner_active=True, members_alive=2, members_total=2,
    in_sync=True,
)  # fmt: skip
LEADING = replace(FOLLOWING, role=Role.LEADER, partner_active=False, in_sync=False)


class Gone(TypedDict):
    link_up: bool
    link_silent_s: float
    partner_alive: bool


GONE: Gone = {
    "link_up": False,
    "link_silent_s": 5.0,
    "partner_alive": False,
}  # the partner, as a node sees it


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        (FOLLOWING, Action.NONE),
        # A silent link alone is not a dead master: gossip must agree.
        (replace(FOLLOWING, link_up=False, link_silent_s=5.0), Action.NONE),
        (replace(FOLLOWING, **GONE), Action.TAKE_OVER),
        # Gossip says dead but the link was heard recently: not yet.
        (replace(FOLLOWING, link_silent_s=1.0, partner_alive=False), Action.NONE),
        # Without gossip the link decides alone.
        (replace(FOLLOWING, link_up=False, link_silent_s=5.0, gossip=False), Action.TAKE_OVER),
        # A slave that never had its master has nothing to take over with.
        (replace(FOLLOWING, paired=False, link_silent_s=9.0, partner_alive=False), Action.NONE),
        # Only a follower holding every confirmed write may: one that never acked in this
        # epoch (never synced, a full transfer cut short) waits for its master or an operator,
        (replace(FOLLOWING, **GONE, in_sync=False), Action.NONE),
        # and so does one whose leader went on alone,
        (replace(FOLLOWING, **GONE, partner_alone=True), Action.NONE),
        # and one in the minority of a cluster with witnesses (it is the one cut off).
        (replace(FOLLOWING, **GONE, members_alive=1, members_total=3), Action.NONE),
        (replace(FOLLOWING, **GONE, members_alive=2, members_total=3), Action.TAKE_OVER),
        # A node that was frozen decides nothing until it has heard its partner again.
        (replace(FOLLOWING, **GONE, in_doubt=True), Action.NONE),
        (replace(LEADING, partner_epoch=2, partner_active=True, in_doubt=True), Action.STEP_DOWN),
        (LEADING, Action.NONE),
        # Cut off from the slave and from most of the cluster: fence.
        (replace(LEADING, link_up=False, link_silent_s=5.0, members_alive=1, members_total=3), Action.FENCE),
        # Cut off from the slave while gossip sees it: neither fenced nor alone (sync waits).
        (replace(LEADING, link_up=False, link_silent_s=5.0, members_alive=2, members_total=3), Action.NONE),
        # The slave is gone and the majority is here: sync mode confirms alone,
        (replace(LEADING, **GONE, members_alive=2, members_total=3), Action.GO_ALONE),
        # a follower that left gossip gracefully (it is stopping) is gone at once,
        (replace(LEADING, link_up=False, link_silent_s=0.1, partner_left=True), Action.GO_ALONE),
        (
            replace(
                LEADING, link_up=False, link_silent_s=0.1, partner_left=True, members_alive=1, members_total=1
            ),
            Action.GO_ALONE,
        ),
        # async mode has nothing to change,
        (replace(LEADING, **GONE, members_alive=2, members_total=3, sync_mode=False), Action.NONE),
        # one pair and no witness cannot tell a cut from a crash: neither fence nor alone
        # (docs/replication.md),
        (replace(LEADING, **GONE, members_alive=1, members_total=2), Action.NONE),
        # and alone ends once the follower holds the whole log again.
        (replace(LEADING, alone=True, link_up=True, partner_caught_up=False), Action.NONE),
        (replace(LEADING, alone=True, link_up=True, partner_caught_up=True), Action.BACK_IN_SYNC),
        (replace(LEADING, **GONE, alone=True, members_alive=1, members_total=3), Action.FENCE),
        (
            replace(LEADING, role=Role.FENCED, link_silent_s=5.0, members_alive=1, members_total=3),
            Action.NONE,
        ),
        # A fenced node waits for the facts, not for the majority alone.
        (
            replace(LEADING, role=Role.FENCED, link_silent_s=5.0, members_alive=2, members_total=3),
            Action.NONE,
        ),
        (
            replace(
                LEADING,
                role=Role.FENCED,
                link_silent_s=5.0,
                members_alive=2,
                members_total=3,
                partner_confirmed=True,
            ),
            Action.UNFENCE,
        ),
        (
            replace(
                LEADING,
                role=Role.FENCED,
                link_silent_s=0.2,
                members_alive=1,
                members_total=3,
                partner_confirmed=True,
            ),
            Action.UNFENCE,
        ),
        # A higher epoch leads, always: from a leader, a fenced leader, one handing over.
        (replace(LEADING, partner_epoch=2, partner_active=True), Action.STEP_DOWN),
        (replace(LEADING, role=Role.FENCED, partner_epoch=2, partner_active=True), Action.STEP_DOWN),
        (replace(LEADING, role=Role.HANDING_OVER, partner_epoch=2, partner_active=True), Action.STEP_DOWN),
        (replace(LEADING, role=Role.STOPPED, partner_epoch=2, partner_active=True), Action.NONE),
        (replace(LEADING, partner_epoch=2, partner_active=False), Action.NONE),
        (replace(LEADING, partner_epoch=1, partner_active=True), Action.NONE),
        (replace(LEADING, give_back=True, partner_caught_up=True), Action.GIVE_BACK),
        (replace(LEADING, give_back=True, partner_caught_up=False), Action.NONE),
        (replace(LEADING, give_back=True, partner_caught_up=True, link_up=False), Action.NONE),
    ],
)
def test_the_state_table(facts: Facts, action: Action) -> None:
    assert assess(facts) is action


def test_roles_change_only_along_the_table() -> None:
    assert transition(Role.FOLLOWER, Event.TAKE_OVER) is Role.LEADER
    assert transition(Role.HANDING_OVER, Event.HANDED) is Role.FOLLOWER
    assert all(transition(role, Event.STOP) is Role.STOPPED for role in Role)
    # A stopped node never takes a role again; a follower never fences; a leader is never promoted.
    for role, event in [
        (Role.STOPPED, Event.PROMOTED),
        (Role.STOPPED, Event.LEAD),
        (Role.STOPPED, Event.FOLLOW),
        (Role.FOLLOWER, Event.FENCE),
        (Role.LEADER, Event.PROMOTED),
        (Role.LEADER, Event.HANDED),
    ]:
        with pytest.raises(ReplicationError):
            transition(role, event)
    assert set(TRANSITIONS.values()) == set(Role) - {Role.STARTING, Role.HANDING_OVER} | {Role.HANDING_OVER}


@pytest.mark.parametrize(
    ("follower", "follower_end", "leader", "leader_end", "shared"),
    [
        (((1, 0),), 100, ((1, 0),), 150, 100),  # a slave behind its master: all of it is shared
        (((1, 0),), 150, ((1, 0),), 100, 100),  # a slave ahead of a master that lost its tail
        # The old master comes back: it wrote to 180 in epoch 1, its slave took over at 120.
        (((1, 0),), 180, ((1, 0), (2, 120)), 300, 120),
        (((1, 0),), 100, ((1, 0), (2, 120)), 300, 100),  # it had less than the slave: a prefix
        # A node that led epoch 2 meets one that led epoch 3 from 200.
        (((1, 0), (2, 120)), 250, ((1, 0), (2, 120), (3, 200)), 400, 200),
        (((1, 0), (2, 120)), 150, ((1, 0), (2, 120), (3, 200)), 400, 150),
        (((5, 0),), 50, ((1, 0),), 100, 0),  # no epoch in common
    ],
)
def test_shared_end(
    follower: tuple[tuple[int, int], ...], follower_end: int, leader: tuple[tuple[int, int], ...],
    leader_end: int, shared: int,
) -> None:  # fmt: skip
    assert shared_end(follower, follower_end, leader, leader_end) == shared


def test_end_of_epoch() -> None:
    history = ((1, 0), (2, 120), (4, 300))
    assert end_of_epoch(history, 1, 500) == 120
    assert end_of_epoch(history, 2, 500) == 300
    assert end_of_epoch(history, 4, 500) == 500
    assert end_of_epoch(history, 3, 500) is None


@pytest.mark.parametrize(
    "value",
    [None, [], [[1]], [[1, 0], [1, 5]], [[2, 10], [3, 5]], [[-1, 0]], [[1, "0"]], "x", [[True, 0]]],
)
def test_bad_histories_are_refused(value: object) -> None:
    with pytest.raises(ReplicationError):
        history_from_json(value)


def test_history_round_trip() -> None:
    assert history_from_json([[1, 0], [2, 120]]) == ((1, 0), (2, 120))


@pytest.mark.parametrize(
    ("paired", "master", "epoch", "leading", "partner", "leads"),
    [
        (False, True, 1, True, None, True),  # a master that never had a slave
        (False, False, 1, False, None, False),  # a fresh slave follows its configured master
        (True, True, 1, True, (2, True), False),  # its slave took over: follow it
        (True, False, 2, True, (1, True), True),  # we led later than the active partner did
        (True, True, 1, True, (1, True), False),  # one epoch, one leader: the active one keeps it
        (True, True, 1, True, (1, False), True),  # both starting, same epoch: the master leads
        (True, False, 1, False, (1, False), False),
        (True, False, 2, True, (1, False), True),  # both starting: the higher epoch leads
        (True, True, 1, True, None, True),  # partner unreachable: the role it had
        (True, True, 2, False, None, False),  # (it was following when it stopped)
    ],
)
def test_the_start_up_rule(
    paired: bool, master: bool, epoch: int, leading: bool, partner: tuple[int, bool] | None, leads: bool
) -> None:
    assert (
        leads_at_start(paired=paired, configured_master=master, epoch=epoch, leading=leading, partner=partner)
        is leads
    )

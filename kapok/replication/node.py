"""A node's place in its master/slave pair: its role, its epoch, and every change of them.

``ReplicationNode`` owns the durable pair state (``state``), the current ``Role`` and the
driver of that role: a ``Leader`` (backlog, follower session, sync confirmations) or a
``Follower`` (the link to the leader and the mirror). A watchdog gathers the facts (the
link, the gossip view, the partner's epoch) every tick and asks the state table
(``protocol.assess``) what to do; every transition runs under one lock, and the role
changes only through ``protocol.transition`` (``_become``):

* lead (start-up, take-over, hand-over received): end following, raise the epoch when
  asked (durably, with the LSN it starts at), make the mirror live (in-flight messages
  are delivered again), start the archive and the backlog, accept clients;
* follow (start-up, a higher epoch seen, hand-over given): refuse clients and close
  their connections, reopen the store as a mirror, dial the leader;
* fence / unfence: a leader cut off from its follower and from the majority of the
  cluster refuses writes until the majority is back *and* it has learned, from gossip or
  its partner's ``/health``, that no node of its pair leads at a higher epoch;
* alone / back in sync (sync mode): a leader whose follower is gone (link silent, gossip
  agrees) confirms writes by itself while it sees the majority, says so (WARNING, gossip
  ``alone_since``, ``/health``), and stops once the follower holds its log again;
* stop: a master stopped on purpose hands its role to a caught-up follower exactly once,
  and never takes it back.

Start-up picks the first role from what this node remembers and what its partner's
``/health`` says (``first_role``). The service asks ``gate`` before serving a client.

The class is built in layers, each module using only those below it: the node's fields,
its pair state and what its drivers and the service call (``hosting``), the changes of
role listed above (``transitions``), and here the node itself: its life cycle, its
watchdog and the operator's commands.
"""

from __future__ import annotations

import asyncio
import logging

from kapok.cluster.messages import State
from kapok.errors import NotActiveError, ReplicationError
from kapok.replication.hosting import Service
from kapok.replication.leader import Leader
from kapok.replication.partner import epoch_active, probe_health
from kapok.replication.protocol import (
    Action,
    Event,
    Facts,
    Role,
    assess,
    is_isolated,
    leads_at_start,
)
from kapok.replication.transitions import _Transitions
from kapok.tasks import cancel_and_wait

__all__ = ["ReplicationNode", "Service"]

log = logging.getLogger("kapok.replication")


class ReplicationNode(_Transitions):
    # ------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self.service.gate = self.gate
        self.service.confirm = self.confirm
        self.partner.started()
        self._pulse = asyncio.get_running_loop().create_task(self._beat())
        role, url = await self._first_role()
        async with self._lock:
            if role is Role.LEADER:
                await self._lead(Event.LEAD, None, "start-up")
            else:
                await self._follow(Event.FOLLOW, url, "start-up", reopen=False)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _first_role(self) -> tuple[Role, str]:
        state = self.state
        url = self.partner_url()
        health = await probe_health(url) if state.paired else None
        partner = None if health is None else epoch_active(health)
        lead = leads_at_start(
            paired=state.paired, configured_master=self.configured_role == "master",
            epoch=state.epoch, leading=state.leading, partner=partner,
        )  # fmt: skip
        seen = "unreachable" if partner is None else f"epoch {partner[0]}, active {partner[1]}"
        log.info(
            "start-up: %s (epoch %d; partner %s: %s)",
            "leading" if lead else "following", state.epoch, state.partner, seen,
        )  # fmt: skip
        return (Role.LEADER, "") if lead else (Role.FOLLOWER, url)

    async def aclose(self) -> None:
        """Stop. A master stopped on purpose first hands its role to its follower, once: it
        closes its clients (so the log stops growing), waits up to ``failover_timeout_s``
        for the follower to hold its last LSN, hands over at the next epoch, and never
        takes the role back (``ask_back`` is off from here on)."""
        self._stopping = True
        if self._watchdog is not None:
            await cancel_and_wait(self._watchdog)
            self._watchdog = None
        if self._pulse is not None:
            await cancel_and_wait(self._pulse)
            self._pulse = None
        await self.partner.aclose()
        async with self._lock:
            if self.role is Role.STOPPED:
                return
            leader = self.leader
            session = leader.session if leader is not None else None
            if self.role is Role.LEADER and leader is not None and session is not None and leader.link_up:
                await self._close_clients(f"handing over to {self.partner_url() or session.state.url}")
                if await self._catch_up(leader, self.cfg.failover_timeout_s):
                    await self._hand_over(stopping=True)
            self._stopped()
            await self._stop_drivers()

    def _stopped(self) -> None:
        if self.role is not Role.STOPPED:  # a hand-over before the stop got there already
            self._become(Event.STOP)

    async def _catch_up(self, leader: Leader, timeout_s: float) -> bool:
        """Whether the follower holds everything logged, after waiting up to ``timeout_s``
        for its acks (its last ones are usually in flight: the closed clients' requeues)."""
        clock = self.service.clock
        deadline = clock.time() + timeout_s
        await self.wal.flush()
        if not leader.caught_up() and leader.session is not None:
            name = leader.session.state.name
            log.info("waiting up to %.1f s for %s to catch up before handing over", timeout_s, name)
        while not leader.caught_up():
            if leader.session is None or clock.time() >= deadline:
                log.warning("%s did not catch up: stopping without a hand-over", self.state.partner)
                return False
            await asyncio.sleep(0.01)
        return True

    # ------------------------------------------------------------ the watchdog

    async def _beat(self) -> None:
        """The freeze detector's tick (``Partner.tick``), every half heartbeat. It takes no
        lock: a transition that holds the lock for long while the loop turns (a takeover or
        a promote applying a long journal first) is not a freeze; a process stopped, or a
        loop kept from turning, is."""
        while True:
            await asyncio.sleep(self.heartbeat_s / 2)
            leader = self.leader
            session = leader.session if leader is not None else None
            if self.partner.tick(self.state, session.state.last_heard if session is not None else None):
                self._on_change()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s / 2)
            try:
                async with self._lock:
                    if self.role is Role.STOPPED:
                        return
                    # A decision can make the next one due at once (a takeover of a node gone
                    # for good, then confirming alone): a few steps a tick, not one.
                    for _ in range(3):
                        if not await self._act(self.facts()):
                            break
            except Exception:
                log.exception("replication watchdog step failed")

    async def _act(self, facts: Facts) -> bool:
        """Carry out what the state table says; whether it changed anything."""
        if self._dialled_stale:
            self._dialled_stale = False
            if self.role is Role.FOLLOWER:
                await self._lead(Event.TAKE_OVER, None, "our epoch is the newer one")
                return True
        action = assess(facts)
        if action is Action.TAKE_OVER:
            self.takeovers += 1
            epoch = max(self.state.epoch, self.partner.epoch(self.state)) + 1
            why = f"the master has been silent for {self.cfg.failover_timeout_s} s"
            await self._lead(Event.TAKE_OVER, epoch, why, partner_gone=True)
        elif action is Action.STEP_DOWN:
            self.step_downs += 1
            epoch = self.partner.epoch(self.state)
            await self._follow(
                Event.FOLLOW, self.partner_url(), f"{self.state.partner} leads at epoch {epoch}"
            )
        elif action is Action.FENCE:
            await self._fence()
        elif action is Action.UNFENCE:
            self._become(Event.UNFENCE)
            log.warning(
                "no longer fenced: the majority is back and %s leads at no higher epoch", self.state.partner
            )
        elif action is Action.GIVE_BACK:
            await self._hand_over()
        elif action is Action.GO_ALONE:
            self._set_alone(self.wal.next_lsn)
        elif action is Action.BACK_IN_SYNC:
            self._set_alone(None)
        if self.role is Role.FENCED:
            if is_isolated(facts):  # what it said while we were cut off may be overtaken
                self.partner.health = None
            else:  # learn the partner's epoch from its /health as well as from gossip
                self.partner.probe(self.state)
        return action is not Action.NONE

    def facts(self) -> Facts:
        members = self.gossip.members() if self.gossip is not None else []
        row = self.partner.row(self.state)
        follower, leader = self.follower, self.leader
        if follower is not None:
            link_up, silent = follower.link_up, follower.silent_s()
        elif leader is not None:
            link_up, silent = leader.link_up, leader.silent_s()
        else:
            link_up, silent = False, 0.0
        epoch, active = self.partner.leading(self.state)
        return Facts(
            role=self.role,
            epoch=self.state.epoch,
            paired=self.state.paired,
            link_up=link_up,
            link_silent_s=silent,
            failover_timeout_s=self.cfg.failover_timeout_s,
            gossip=self.gossip is not None,
            partner_alive=row is not None and row.state is State.ALIVE,
            partner_left=row is not None and row.state is State.LEFT,
            partner_epoch=epoch,
            partner_active=active,
            members_alive=sum(1 for m in members if m.state is State.ALIVE),
            members_total=sum(1 for m in members if m.state is not State.LEFT),
            give_back=(
                self.cfg.give_back
                and self.configured_role == "slave"
                and leader is not None
                and leader.session is not None
                and leader.session.state.ask_back
            ),
            partner_caught_up=leader is not None and leader.caught_up(),
            in_sync=follower is not None and follower.in_sync and self._mirror_whole(),
            partner_alone=row is not None and row.meta.alone_since is not None,
            alone=self.alone_since is not None,
            sync_mode=self.cfg.mode == "sync",
            partner_confirmed=link_up or self.partner.confirmed(self.state),
            # the tick may not have run yet after a freeze: a late one is doubt too
            in_doubt=self.partner.in_doubt(),
        )

    # ------------------------------------------------------------ operator

    async def unpair(self) -> None:
        """Forget the partner on purpose: a master then confirms writes alone again."""
        async with self._lock:
            if self.role is Role.FOLLOWER:
                raise NotActiveError(f"{self.name} is a slave: unpair its master instead")
            log.warning("unpaired from %s by the operator", self.state.partner)
            if self.leader is not None and self.leader.session is not None:
                await self.leader.session.link.close("unpaired by the operator")
            self._set_alone(None)
            self._save(self.state.paired_with(None, None))

    async def promote(self, *, force: bool) -> None:
        """An operator makes this follower lead (its master is gone for good). Without
        ``force`` only a follower that was in sync may: one that was not would lose what
        its master confirmed after it fell behind."""
        async with self._lock:
            follower = self.follower
            if self.role is not Role.FOLLOWER or follower is None:
                raise ReplicationError(f"{self.name} is not following: there is nothing to promote")
            if not (follower.in_sync and self._mirror_whole()) and not force:
                raise ReplicationError(
                    f"{self.name} was not in sync with its master: promoting it may lose confirmed writes "
                    "(use --force to accept that)"
                )
            log.warning("promoted by the operator%s", " (forced)" if force else "")
            epoch = max(self.state.epoch, self.partner.epoch(self.state)) + 1
            await self._lead(Event.PROMOTED, epoch, "promoted by the operator", partner_gone=True)

    def lag(self) -> tuple[int, int, float] | None:
        if self.follower is not None:
            return self.follower.lag
        return self.leader.lag() if self.leader is not None else None

    def link_state(self) -> str:
        """The sync link as an operator reads it: up, down, refused (why), alone."""
        if self.follower is not None:
            return self.follower.link_state
        if self.leader is not None:
            if self.alone_since is not None:
                return "alone"
            return "up" if self.leader.link_up else "down"
        return "down"

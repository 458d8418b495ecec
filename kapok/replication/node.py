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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from kapok.clock import Clock
from kapok.cluster.messages import State
from kapok.cluster.node import GossipNode
from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.replay import Mirror
from kapok.errors import FencedError, NotActiveError, ReplicationError
from kapok.replication.applier import Applier
from kapok.replication.follower import Follower
from kapok.replication.leader import Leader
from kapok.replication.link import LinkFactory, SyncLink
from kapok.replication.partner import Partner, epoch_active, probe_health
from kapok.replication.protocol import (
    Action,
    Event,
    Facts,
    History,
    Role,
    assess,
    is_isolated,
    leads_at_start,
    transition,
)
from kapok.replication.state import FILE_NAME, PairState
from kapok.replication.transfer import receive_transfer
from kapok.storage.disk import DiskStore
from kapok.storage.wal import WriteAheadLog
from kapok.tasks import cancel_and_wait

__all__ = ["ReplicationNode", "Service"]

log = logging.getLogger("kapok.replication")


class Service(Protocol):
    """What the node needs of the broker service (``kapok.service.BrokerService``)."""

    config: Config
    node_name: str
    broker: Broker
    store: Any
    gate: Callable[[bool], None] | None
    confirm: Callable[[asyncio.Future[None] | None], asyncio.Future[None] | None] | None

    clock: Clock

    @property
    def advertised_url(self) -> str: ...

    def now(self) -> float: ...

    async def reopen(self, store: DiskStore, *, mirror: bool) -> None: ...

    def resumed(self) -> None: ...


class ReplicationNode:
    def __init__(
        self,
        service: Service,
        *,
        gossip: GossipNode | None,
        close_clients: Callable[[str], Awaitable[None]],
        on_change: Callable[[], None] = lambda: None,
        link_factory: LinkFactory = SyncLink,
    ) -> None:
        cfg = service.config
        self.service = service
        self.cfg = cfg.replication
        self.gossip = gossip
        self.name = service.node_name
        self.configured_role = cfg.replication.role
        self.secret = cfg.mq.secret_key
        # Both ends of the sync link make theirs with it: the follower (``Host``) and the
        # ``/sync/v1`` route; a fault injector gives a subclass (``kapok.testing.faults``).
        self.link_factory = link_factory
        self.directory = Path(cfg.storage.dir)
        self.state = PairState.load(self.directory, leading=self.configured_role == "master")
        self.role = Role.STARTING
        self.leader: Leader | None = None
        self.follower: Follower | None = None
        self._applier: Applier | None = None  # the mirror and what is journaled but not applied to it
        self.heartbeat_s = min(1.0, self.cfg.failover_timeout_s / 4)
        # A link with no frame for this long is dead, whatever TCP says (pings flow every
        # heartbeat); a follower never takes over before failover_timeout_s anyway.
        self.stall_s = max(self.cfg.failover_timeout_s, 3 * self.heartbeat_s)
        self.takeovers = 0
        self.hand_overs = 0
        self.step_downs = 0
        self.diverged_records = 0
        self._close_clients = close_clients
        self._on_change = on_change
        self._lock = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None
        self._following_url = ""
        self._retired: Follower | None = None  # a follower that handed over: its task ends itself
        self._stopping = False
        self.alone_since: int | None = None  # sync leader confirming alone since this LSN
        self._dialled_stale = False  # the node we follow answered that our epoch is newer
        self.partner = Partner(self.cfg, gossip, self.configured_role)

    # ------------------------------------------------------------ what the drivers use

    @property
    def http_url(self) -> str:
        """The URL this node gives out: the one it advertises in gossip."""
        return self.service.advertised_url

    def partner_url(self) -> str:
        return self.partner.url(self.state)

    def ask_back(self) -> bool:
        """A follower asks for its role back only as a returning configured master."""
        return self.configured_role == "master" and self.cfg.give_back and not self._stopping

    @property
    def replication(self) -> str:
        """What a write of this node waits for: ``sync`` (the follower), ``alone`` (this
        node only, its follower gone), ``async``; ``none`` when it takes no writes."""
        if self.role is not Role.LEADER:
            return "none"
        if self.alone_since is not None:
            return "alone"
        return self.cfg.mode if self.state.paired else "unpaired"

    @property
    def broker(self) -> Broker:
        return self.service.broker

    @property
    def wal(self) -> WriteAheadLog:
        store: DiskStore = self.service.store
        return store.wal

    @property
    def applier(self) -> Applier:
        """The mirror of the service's broker, applied lazily (``kapok.replication.applier``).
        A reopened store is another broker: what the old one had queued is in the log the
        new store recovered, so it starts afresh at the log's end."""
        applier = self._applier
        if applier is None or applier.mirror.broker is not self.service.broker:
            if applier is not None:
                applier.stop()
            applier = self._applier = Applier(Mirror(self.service.broker), self.wal.next_lsn, self.now)
            store: DiskStore = self.service.store
            if isinstance(store, DiskStore):
                store.before_snapshot = applier.catch_up  # a snapshot holds the whole log
            if self.role is Role.FOLLOWER:  # a full transfer reopened the store: go on applying
                applier.start()
        return applier

    def current_applier(self) -> Applier | None:
        """The mirror's applier as it is (None while leading), for the metrics: no side effects."""
        return self._applier

    def _mirror_whole(self) -> bool:
        """No batch was skipped because it could not be applied (``Applier.failed``)."""
        return self._applier is None or self._applier.failed is None

    def now(self) -> float:
        return self.service.now()

    @property
    def active(self) -> bool:
        return self.role is Role.LEADER and not self.in_doubt()

    def in_doubt(self) -> bool:
        """A paired leader that was frozen serves nothing until it has heard its partner
        again (``kapok.replication.partner``)."""
        return self.state.paired and self.role is Role.LEADER and self.partner.in_doubt()

    @property
    def pair_id(self) -> str:
        """The pair's name whatever its roles now: its configured master's name."""
        if self.configured_role == "master" or self.state.partner is None:
            return self.name
        return self.state.partner

    def _save(self, state: PairState) -> None:
        # A state the file holds already is not written again: a node that restarts in the
        # role and epoch it had writes nothing, so it starts on a full disk too.
        unchanged = state == self.state and (self.directory / FILE_NAME).exists()
        self.state = state
        if not unchanged:
            try:
                state.save(self.directory)
            except OSError as exc:  # one line naming the file (ENOSPC names none)
                where = self.directory / FILE_NAME
                raise OSError(exc.errno, f"cannot save the pair state in {where}: {exc.strerror}") from None
        self._on_change()

    def _become(self, event: Event) -> None:
        self.role = transition(self.role, event)
        self._on_change()

    def record_partner(self, name: str, url: str, token: str) -> None:
        log.info("paired with %s (%s)", name, url)
        self._save(self.state.paired_with(name, url, token))

    def adopt(self, leader: str, epoch: int, history: History, token: str) -> None:
        state = self.state.following(epoch, history).paired_with(leader, self.partner_url() or None, token)
        if state != self.state:
            self._save(state)

    def newer_partner(self, epoch: int) -> None:
        """The paired partner says it led at a higher epoch: believe it only once its own
        ``/health`` (or gossip, through the watchdog) shows it active at that epoch."""
        self.partner.probe(self.state)

    def newer_than_leader(self) -> None:
        """The node we dialled is behind our epoch: it steps down (a higher epoch leads,
        always), and on its next tick the watchdog makes us lead."""
        self._dialled_stale = True

    async def take_over(self, epoch: int | None) -> None:
        """Hand-over received: the leader told us to lead at ``epoch`` (called from the
        follower's own task, which ends once it has answered)."""
        async with self._lock:
            if self._stopping:  # a node on its way out takes no role: the master keeps it
                raise ReplicationError(f"{self.name} is stopping: it takes no hand-over")
            self._retired, self.follower = self.follower, None
            await self._lead(Event.PROMOTED, epoch, "the master handed over")
            self.hand_overs += 1

    async def receive_transfer(
        self, lsn: int, shared: int, chunks: Callable[[], Awaitable[bytes | None]]
    ) -> None:
        """A full transfer (``kapok.replication.transfer``); what diverged is counted."""
        diverged = await receive_transfer(
            self.service, lsn, shared, chunks, self.directory, self.state.epoch, lost=self.cfg.mode == "async"
        )
        self.diverged_records += diverged

    # ------------------------------------------------------------ the service's gate

    def gate(self, publish: bool) -> None:
        role = self.role
        if role is Role.LEADER and self.in_doubt():
            raise NotActiveError(f"{self.name} was frozen and is checking its partner before it serves again")
        if role is Role.LEADER:
            if publish and self.leader is not None:
                self.leader.check_writable()
            return
        if role is Role.FENCED:
            raise FencedError(
                f"{self.name} has lost its slave and sees fewer than half of the cluster, or has not yet "
                "learned its partner's epoch: it takes no writes"
            )
        where = self._following_url or self.partner_url() or "its master"
        raise NotActiveError(f"{self.name} is a passive slave; its master is {where}")

    def confirm(self, local: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
        leader = self.leader
        return local if leader is None else leader.confirm(local)

    # ------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self.service.gate = self.gate
        self.service.confirm = self.confirm
        self.partner.started()
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

    async def _stop_drivers(self) -> None:
        for follower in (self.follower, self._retired):
            if follower is not None:
                await follower.aclose()
        self.follower = self._retired = None
        if self._applier is not None:  # kept: the shutdown snapshot catches up with it
            await self._applier.aclose()
        if self.leader is not None:
            self.wal.replica = None
            await self.leader.aclose()
            self.leader = None
        self.alone_since = None

    # ------------------------------------------------------------ transitions

    async def _locked(self, step: Awaitable[None]) -> None:
        async with self._lock:
            if self.role is not Role.STOPPED:
                await step

    async def _lead(self, event: Event, epoch: int | None, why: str, *, partner_gone: bool = False) -> None:
        if self.role is Role.LEADER:
            return
        follower, self.follower = self.follower, None
        if follower is not None:
            await follower.aclose()
        wal = self.wal
        await wal.flush()
        state = self.state if epoch is None else self.state.raised(epoch, wal.next_lsn)
        self._save(state.with_role(True))  # durable before any write is taken at this epoch
        store: DiskStore = self.service.store
        was_fenced = self.role is Role.FENCED
        if not was_fenced:
            # The archive first: the takeover's requeues (written by ``resumed``) are archived too.
            await store.start_archive()
            # At start-up the log is this node's own: its deliveries in flight are a crash's.
            reason = "recovery" if event is Event.LEAD else "takeover"
            applier = self.applier
            unapplied = applier.records
            await applier.catch_up()  # and nothing awaited from here to the promotion
            redelivered = applier.mirror.promote(self.now(), reason)
            self._applier = None
            applier.stop()
            if unapplied:
                log.info("applied %d journaled records before leading", unapplied)
            self.service.resumed()
            log.warning(
                "now the active master (%s): epoch %d from LSN %d, %d deliveries requeued",
                why, self.state.epoch, wal.next_lsn, redelivered,
            )  # fmt: skip
        self.leader = Leader(
            self.cfg, self, heartbeat_s=self.heartbeat_s, stall_s=self.stall_s, partner_gone=partner_gone
        )
        wal.replica = self.leader
        self._following_url = ""
        self._become(event)

    async def _follow(self, event: Event, url: str, why: str, *, reopen: bool = True) -> None:
        self._become(event)  # the gate refuses clients from here on
        self._following_url = url
        if reopen:
            await self._close_clients(f"this node now follows {url}")
            await self._stop_drivers()
            await self.service.reopen(DiskStore(self.service.config.storage), mirror=True)
        elif self.follower is not None or self._retired is not None:
            await self._stop_drivers()
        self.applier.start()  # the state as replayed is the mirror now
        if self.state.leading:
            self._save(self.state.with_role(False))
        log.warning("following %s (%s)", url, why)
        self.follower = Follower(self.cfg, self, url, heartbeat_s=self.heartbeat_s, stall_s=self.stall_s)
        self.follower.start()

    async def _fence(self) -> None:
        self._become(Event.FENCE)
        self._set_alone(None)
        self.partner.fenced(self.state)
        log.error("fenced: the slave link is down and fewer than half of the cluster's members are alive")
        await self._close_clients("fenced: this master is cut off from its slave and the majority")

    def _set_alone(self, since: int | None) -> None:
        if since == self.alone_since:
            return
        leader = self.leader
        if since is not None:
            log.warning(
                "confirming writes alone from LSN %d: %s is gone and %s sees the majority of the cluster",
                since, self.state.partner, self.name,
            )  # fmt: skip
        elif self.alone_since is not None and self.role is Role.LEADER:
            log.warning("%s holds this node's log again: writes wait for it again", self.state.partner)
        self.alone_since = since
        if leader is not None:
            leader.alone = since is not None
            if since is not None:
                leader.release_waiters()
        self._on_change()

    async def _hand_over(self, *, stopping: bool = False) -> None:
        """Give the role to the connected follower (give-back, or a stop), then follow it,
        or, when stopping, only stop."""
        leader = self.leader
        if leader is None or leader.session is None:
            return
        url = self.partner_url() or leader.session.state.url
        self._become(Event.HAND_OVER)
        self._following_url = url
        await self._close_clients(f"handing over to {url}")
        timeout_s = self.cfg.failover_timeout_s if stopping else max(10.0, 3 * self.cfg.failover_timeout_s)
        handed = await leader.hand_over(timeout_s=timeout_s)
        if handed is None:
            log.warning(
                "hand-over to %s failed; %s",
                url,
                "stopping without one" if stopping else "staying the master",
            )
            self._become(Event.HAND_OVER_FAILED)
            return
        self.hand_overs += 1
        epoch, lsn = handed
        self._save(self.state.raised(epoch, lsn).with_role(False))  # our log ends where its epoch begins
        log.warning("handed over to %s at epoch %d%s", url, epoch, " before stopping" if stopping else "")
        if stopping:
            self._become(Event.STOP)
        else:
            await self._follow(Event.HANDED, url, f"handed over at epoch {epoch}")

    # ------------------------------------------------------------ the watchdog

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s / 2)
            leader = self.leader
            session = leader.session if leader is not None else None
            if self.partner.tick(self.state, session.state.last_heard if session is not None else None):
                self._on_change()
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
            in_doubt=self.partner.doubting(),
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

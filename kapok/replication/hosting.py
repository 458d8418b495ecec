"""The replication node's lowest layer: what it holds, and what the others may ask of it.

``ReplicationNode`` (``kapok.replication.node``, where its theory of operation is) is
built in layers, each using only those below it: this one, then the changes of role
(``kapok.replication.transitions``), then the node itself (its life cycle, its watchdog
and the operator's commands). This layer holds the node's fields, the durable pair state
and how a change of it is saved (``_save``), the one way its role is set (``_become``),
what the drivers of a role call back (``leaderstate.Pair``, ``follower.Host``) and the
service's ``gate`` and ``confirm``. None of it moves the node from one role to another:
it is a module of its own because it is all that the drivers and the service see of a
node, while what moves it sits above.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from kapok.clock import Clock
from kapok.cluster.node import GossipNode
from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.replay import Mirror
from kapok.errors import FencedError, NotActiveError
from kapok.replication.applier import Applier
from kapok.replication.follower import Follower
from kapok.replication.leader import Leader
from kapok.replication.link import LinkFactory, SyncLink
from kapok.replication.partner import Partner
from kapok.replication.protocol import Event, History, Role, transition
from kapok.replication.state import FILE_NAME, PairState
from kapok.replication.transfer import receive_transfer
from kapok.storage.disk import DiskStore
from kapok.storage.wal import WriteAheadLog

__all__ = ["Service"]

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


class _Hosting:
    """The node's fields and pair state, and what its drivers and its service call."""

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
        self._pulse: asyncio.Task[None] | None = None  # the freeze detector's tick (node._beat)
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

"""A node's place in its master/slave pair: its role, its epoch, and every change of them.

``ReplicationNode`` owns the durable pair state (``state``), the current ``Role`` and the
driver of that role: a ``Leader`` (backlog, follower session, sync confirmations) or a
``Follower`` (the link to the leader and the mirror). A watchdog gathers the facts (the
link, the gossip view, the partner's epoch) every tick and asks the state table
(``protocol.assess``) what to do; every transition runs under one lock:

* lead (start-up, take-over, hand-over received): end following, raise the epoch when
  asked (durably, with the LSN it starts at), make the mirror live (in-flight messages
  are delivered again), start the archive and the backlog, accept clients;
* follow (start-up, a higher epoch seen, hand-over given): refuse clients and close
  their connections, reopen the store as a mirror, dial the leader;
* fence / unfence: a leader cut off from its follower and from the majority of the
  cluster refuses writes until either is back.

Start-up picks the first role from what this node remembers and what its partner's
``/health`` says (``first_role``). The service asks ``gate`` before serving a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import orjson

from kapok.cluster.messages import State
from kapok.cluster.node import GossipNode
from kapok.config import Config
from kapok.core.broker import Broker
from kapok.core.replay import Mirror
from kapok.errors import FencedError, NotActiveError
from kapok.replication.follower import Follower
from kapok.replication.leader import Leader
from kapok.replication.protocol import Action, Facts, History, Role, assess, leads_at_start
from kapok.replication.state import PairState
from kapok.replication.transfer import receive_transfer
from kapok.storage.disk import DiskStore
from kapok.storage.wal import WriteAheadLog

__all__ = ["ReplicationNode", "Service"]

log = logging.getLogger("kapok.replication")

PROBE_TIMEOUT_S = 2.0


class Service(Protocol):
    """What the node needs of the broker service (``kapok.server.service.BrokerService``)."""

    config: Config
    node_name: str
    broker: Broker
    store: Any
    gate: Callable[[bool], None] | None
    confirm: Callable[[asyncio.Future[None] | None], asyncio.Future[None] | None] | None

    @property
    def http_url(self) -> str: ...

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
    ) -> None:
        cfg = service.config
        self.service = service
        self.cfg = cfg.replication
        self.gossip = gossip
        self.name = service.node_name
        self.configured_role = cfg.replication.role
        self.secret = cfg.mq.secret_key
        self.directory = Path(cfg.storage.dir)
        self.state = PairState.load(self.directory, leading=self.configured_role == "master")
        self.role = Role.STARTING
        self.leader: Leader | None = None
        self.follower: Follower | None = None
        self._mirror: Mirror | None = None
        self.heartbeat_s = min(1.0, self.cfg.failover_timeout_s / 4)
        self.takeovers = 0
        self.hand_overs = 0
        self.step_downs = 0
        self.diverged_records = 0
        self._close_clients = close_clients
        self._on_change = on_change
        self._lock = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None
        self._following_url = ""

    # ------------------------------------------------------------ what the drivers use

    @property
    def http_url(self) -> str:
        return self.service.http_url

    @property
    def broker(self) -> Broker:
        return self.service.broker

    @property
    def wal(self) -> WriteAheadLog:
        store: DiskStore = self.service.store
        return store.wal

    @property
    def mirror(self) -> Mirror:
        if self._mirror is None or self._mirror.broker is not self.service.broker:
            self._mirror = Mirror(self.service.broker)
        return self._mirror

    def now(self) -> float:
        return self.service.now()

    @property
    def active(self) -> bool:
        return self.role is Role.LEADER

    @property
    def pair_id(self) -> str:
        """The pair's name whatever its roles now: its configured master's name."""
        if self.configured_role == "master" or self.state.partner is None:
            return self.name
        return self.state.partner

    def _save(self, state: PairState) -> None:
        self.state = state
        state.save(self.directory)
        self._on_change()

    def record_partner(self, name: str, url: str) -> None:
        log.info("paired with %s (%s)", name, url)
        self._save(self.state.paired_with(name, url))

    def adopt(self, leader: str, url: str, epoch: int, history: History) -> None:
        state = self.state.following(epoch, history).paired_with(leader, url)
        if state != self.state:
            self._save(state)

    def newer_partner(self, epoch: int, url: str) -> None:
        """The partner leads (or led) at a higher epoch: stop leading, follow it."""
        asyncio.get_running_loop().create_task(self._step_down(epoch, url))

    def newer_than_leader(self) -> None:
        """The node we dialled is behind our epoch: it steps down, we lead."""
        asyncio.get_running_loop().create_task(self._locked(self._lead(None, "our epoch is the newer one")))

    async def take_over(self, epoch: int | None) -> None:
        """Hand-over received: the leader told us to lead at ``epoch``."""
        await self._lead(epoch, "the master handed over", stop_follower=False)
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
        if role is Role.LEADER:
            if publish and self.leader is not None:
                self.leader.check_writable()
            return
        if role is Role.FENCED:
            raise FencedError(
                f"{self.name} has lost its slave and sees fewer than half of the cluster: it takes no writes"
            )
        where = self._following_url or self.state.partner_url or self.cfg.master or "its master"
        raise NotActiveError(f"{self.name} is a passive slave; its master is {where}")

    def confirm(self, local: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
        leader = self.leader
        return local if leader is None else leader.confirm(local)

    # ------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self.service.gate = self.gate
        self.service.confirm = self.confirm
        role, url = await self._first_role()
        async with self._lock:
            if role is Role.LEADER:
                await self._lead(None, "start-up")
            else:
                await self._follow(url, "start-up", reopen=False)
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())

    async def _first_role(self) -> tuple[Role, str]:
        state = self.state
        url = state.partner_url or self.cfg.master
        health = await _probe(url) if state.paired else None
        partner = None if health is None else (int(health.get("epoch", 0)), bool(health.get("active")))
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
        """Stop; a master stopped on purpose first hands its role to a caught-up slave (when
        ``give_back`` will bring the role home again), so no failover timeout is waited out."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        async with self._lock:
            leader = self.leader
            session = leader.session if leader is not None else None
            if self.role is Role.LEADER and self.cfg.give_back and leader is not None and session is not None:
                # Clients go first, so the log stops growing and the slave can catch up.
                await self._close_clients(f"handing over to {session.url}")
                if await self._catch_up(leader, self.cfg.failover_timeout_s):
                    await self._hand_over(stopping=True)
            await self._stop_drivers()

    async def _catch_up(self, leader: Leader, timeout_s: float) -> bool:
        """Whether the follower holds everything logged, after waiting up to ``timeout_s``
        for its acks (its last ones are usually in flight: the closed clients' requeues),
        but no longer than the failover timeout, which a hand-over is there to beat."""
        deadline = time.monotonic() + timeout_s
        await self.wal.flush()
        if not leader.caught_up() and leader.session is not None:
            name = leader.session.name
            log.info("waiting up to %.1f s for %s to catch up before handing over", timeout_s, name)
        while not leader.caught_up():
            if leader.session is None or time.monotonic() >= deadline:
                log.warning("%s did not catch up: stopping without a hand-over", self.state.partner)
                return False
            await asyncio.sleep(0.01)
        return True

    async def _stop_drivers(self) -> None:
        if self.follower is not None:
            await self.follower.aclose()
            self.follower = None
        if self.leader is not None:
            self.wal.replica = None
            await self.leader.aclose()
            self.leader = None

    # ------------------------------------------------------------ transitions

    async def _locked(self, step: Awaitable[None]) -> None:
        async with self._lock:
            await step

    async def _lead(
        self, epoch: int | None, why: str, *, stop_follower: bool = True, partner_gone: bool = False
    ) -> None:
        if self.role is Role.LEADER:
            return
        if stop_follower and self.follower is not None:
            await self.follower.aclose()
        self.follower = None
        wal = self.wal
        await wal.flush()
        state = self.state if epoch is None else self.state.raised(epoch, wal.next_lsn)
        self._save(state.with_role(True))
        store: DiskStore = self.service.store
        if self.role is not Role.FENCED:
            redelivered = self.mirror.promote(self.now())
            self._mirror = None
            self.service.resumed()
            await store.start_archive()
            log.warning(
                "now the active master (%s): epoch %d from LSN %d, %d deliveries requeued",
                why, self.state.epoch, wal.next_lsn, redelivered,
            )  # fmt: skip
        self.leader = Leader(self.cfg, self, heartbeat_s=self.heartbeat_s, partner_gone=partner_gone)
        wal.replica = self.leader
        self.role = Role.LEADER
        self._following_url = ""
        self._on_change()

    async def _follow(self, url: str, why: str, *, reopen: bool = True) -> None:
        self.role = Role.FOLLOWER  # the gate refuses clients from here on
        self._following_url = url
        self._on_change()
        if reopen:
            await self._close_clients(f"this node now follows {url}")
            await self._stop_drivers()
            await self.service.reopen(DiskStore(self.service.config.storage), mirror=True)
        self._mirror = None
        if self.state.leading:
            self._save(self.state.with_role(False))
        log.warning("following %s (%s)", url, why)
        self.follower = Follower(self.cfg, self, url, heartbeat_s=self.heartbeat_s)
        self.follower.start()

    async def _step_down(self, epoch: int, url: str) -> None:
        async with self._lock:
            if self.role is Role.FOLLOWER or epoch <= self.state.epoch:
                return
            self.step_downs += 1
            await self._follow(url, f"the pair's epoch is now {epoch}")

    async def _fence(self) -> None:
        self.role = Role.FENCED
        self._on_change()
        log.error("fenced: the slave link is down and fewer than half of the cluster's members are alive")
        await self._close_clients("fenced: this master is cut off from its slave and the majority")

    def _unfence(self) -> None:
        self.role = Role.LEADER
        self._on_change()
        log.warning("no longer fenced")

    async def _hand_over(self, *, stopping: bool = False) -> None:
        """Give the role to the connected follower (give-back, or a stop), then follow it."""
        leader = self.leader
        if leader is None or leader.session is None:
            return
        url = leader.session.url
        self.role = Role.HANDING_OVER
        self._following_url = url
        self._on_change()
        await self._close_clients(f"handing over to {url}")
        handed = await leader.hand_over(timeout_s=max(10.0, 3 * self.cfg.failover_timeout_s))
        if handed is None:
            log.warning("hand-over to %s failed; staying the master", url)
            self.role = Role.LEADER
            self._on_change()
            return
        self.hand_overs += 1
        epoch, lsn = handed
        self._save(self.state.raised(epoch, lsn).with_role(False))  # our log ends where its epoch begins
        if stopping:
            self.role = Role.FOLLOWER
            log.warning("handed over to %s at epoch %d before stopping", url, epoch)
        else:
            await self._follow(url, f"handed over at epoch {epoch}")

    # ------------------------------------------------------------ the watchdog

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s / 2)
            try:
                async with self._lock:
                    await self._act(assess(self.facts()))
            except Exception:
                log.exception("replication watchdog step failed")

    async def _act(self, action: Action) -> None:
        if action is Action.TAKE_OVER:
            self.takeovers += 1
            epoch = max(self.state.epoch, self._partner_epoch()) + 1
            await self._lead(
                epoch, f"the master has been silent for {self.cfg.failover_timeout_s} s", partner_gone=True
            )
        elif action is Action.STEP_DOWN:
            row = self._partner_row()
            if row is not None:
                self.step_downs += 1
                await self._follow(row.meta.http_url, f"{row.name} leads at epoch {row.meta.epoch}")
        elif action is Action.FENCE:
            await self._fence()
        elif action is Action.UNFENCE:
            self._unfence()
        elif action is Action.GIVE_BACK:
            await self._hand_over()

    def facts(self) -> Facts:
        members = self.gossip.members() if self.gossip is not None else []
        row = self._partner_row()
        if self.follower is not None:
            link_up, silent = self.follower.link_up, self.follower.silent_s()
        elif self.leader is not None:
            link_up, silent = self.leader.link_up, self.leader.silent_s()
        else:
            link_up, silent = False, 0.0
        leader = self.leader
        return Facts(
            role=self.role,
            epoch=self.state.epoch,
            paired=self.state.paired,
            link_up=link_up,
            link_silent_s=silent,
            failover_timeout_s=self.cfg.failover_timeout_s,
            gossip=self.gossip is not None,
            partner_alive=row is not None and row.state is State.ALIVE,
            partner_epoch=row.meta.epoch if row is not None else 0,
            partner_active=row is not None and row.meta.active and row.state in (State.ALIVE, State.SUSPECT),
            members_alive=sum(1 for m in members if m.state is State.ALIVE),
            members_total=sum(1 for m in members if m.state is not State.LEFT),
            give_back=(
                self.cfg.give_back
                and self.configured_role == "slave"
                and leader is not None
                and leader.session is not None
                and leader.session.configured_role == "master"
            ),
            partner_caught_up=leader is not None and leader.caught_up(),
        )

    def _partner_row(self) -> Any:
        if self.gossip is None or self.state.partner is None:
            return None
        return next((m for m in self.gossip.members() if m.name == self.state.partner), None)

    def _partner_epoch(self) -> int:
        row = self._partner_row()
        return row.meta.epoch if row is not None else 0

    # ------------------------------------------------------------ operator

    async def unpair(self) -> None:
        """Forget the partner on purpose: a master then confirms writes alone again."""
        async with self._lock:
            if self.role is Role.FOLLOWER:
                raise NotActiveError(f"{self.name} is a slave: unpair its master instead")
            log.warning("unpaired from %s by the operator", self.state.partner)
            if self.leader is not None and self.leader.session is not None:
                await self.leader.session.link.close("unpaired by the operator")
            self._save(self.state.paired_with(None, None))

    def lag(self) -> tuple[int, int, float] | None:
        if self.follower is not None:
            return self.follower.lag
        return self.leader.lag() if self.leader is not None else None


async def _probe(url: str) -> dict[str, Any] | None:
    """The partner's ``/health``, or None when it does not answer."""
    if not url:
        return None
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + "/health") as resp,
        ):
            if resp.status != 200:
                return None
            body = orjson.loads(await resp.read())
            return body if isinstance(body, dict) else None
    except (OSError, aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None

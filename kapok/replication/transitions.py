"""The replication node's second layer: every change of its role, step by step.

Leading, following, fencing, confirming alone and handing over (the steps the docstring
of ``kapok.replication.node`` lists) are carried out here, on the fields and the pair
state of the layer below (``kapok.replication.hosting``); what decides to take one (the
watchdog, start-up, stop, the operator) is the layer above, ``ReplicationNode``. Each
step runs under the node's lock (its caller's; ``take_over`` takes it itself), and the
order within a step matters (durable before serving, the gate closed before the store is
reopened): it is a module of its own so that those orders read as one piece, apart from
the deciding around them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from kapok.errors import ReplicationError
from kapok.replication.follower import Follower
from kapok.replication.hosting import _Hosting
from kapok.replication.leader import Leader
from kapok.replication.protocol import Event, Role
from kapok.storage.disk import DiskStore

__all__: list[str] = []  # a layer of ``ReplicationNode``, for it alone

log = logging.getLogger("kapok.replication")


class _Transitions(_Hosting):
    """The node's changes of role: lead, follow, fence, alone, hand over, and the stop of the drivers."""

    # ------------------------------------------------------------ transitions

    # The follower calls it (``follower.Host``), but it is a change of role: it leads.
    async def take_over(self, epoch: int | None) -> None:
        """Hand-over received: the leader told us to lead at ``epoch`` (called from the
        follower's own task, which ends once it has answered)."""
        async with self._lock:
            if self._stopping:  # a node on its way out takes no role: the master keeps it
                raise ReplicationError(f"{self.name} is stopping: it takes no hand-over")
            self._retired, self.follower = self.follower, None
            await self._lead(Event.PROMOTED, epoch, "the master handed over")
            self.hand_overs += 1

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

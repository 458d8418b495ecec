"""The leading side of a pair: the backlog, the follower's session, sync confirmations.

While a node leads, its WAL hands every encoded batch to ``Leader.offer`` (the backlog),
whether a follower is connected or not, so a follower that comes back can resume. One
follower session at a time: ``serve`` checks its ``hello`` (the partner's name and the
pairing token; a stranger is refused and changes nothing; a live session is never
displaced), answers with a resume or a full transfer (``protocol``), then a sender
streams the backlog from the follower's position and a receiver takes its acks, each
capped at what this session sent. In sync mode ``confirm`` turns a publish's local
durability future into one that also waits for the follower's ack of the same LSN, or
fails with ``replication_unavailable`` after ``sync_timeout_ms``: never a silent
downgrade. The one exception is ``alone``, which only the node's state table sets (the
follower is gone and this node sees the cluster's majority): then a write is confirmed
by this node's durability, and says so. A follower too slow for the backlog is cut off
(and comes back for a full transfer); it never slows the leader down; a link silent for
``stall_s`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from kapok.clock import loop_time, wait_set
from kapok.config import ReplicationConfig
from kapok.core.broker import Broker
from kapok.core.replay import state_records
from kapok.errors import ReplicationError, ReplicationUnavailableError, ReplicationUnconfirmedError
from kapok.replication.backlog import Backlog
from kapok.replication.link import SyncLink
from kapok.replication.protocol import shared_end
from kapok.replication.session import (
    Acked,
    Behind,
    LeaderSession,
    Paired,
    Refusal,
    admit,
    control,
    parse_hello,
)
from kapok.replication.state import PairState
from kapok.replication.transfer import send_transfer
from kapok.tasks import cancel_all

if TYPE_CHECKING:
    from kapok.storage.wal import WriteAheadLog

__all__ = ["Leader", "Pair"]

log = logging.getLogger("kapok.replication")

HELLO_TIMEOUT_S = 10.0
UNPAIRED_BACKLOG_BYTES = 1024 * 1024  # see Leader.offer


class Pair(Protocol):
    """What the leader needs from the node it runs in (``kapok.replication.node``)."""

    name: str
    state: PairState

    @property
    def http_url(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def wal(self) -> WriteAheadLog: ...

    def now(self) -> float: ...

    def record_partner(self, name: str, url: str, token: str) -> None: ...

    def newer_partner(self, epoch: int) -> None: ...


class _Conn:
    """One follower's session as the driver holds it: the pure session, its link, and the
    signals the node waits on."""

    def __init__(self, link: SyncLink, session: LeaderSession) -> None:
        self.link = link
        self.state = session
        self.promoted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.cut = asyncio.Event()  # set to end the session from outside (fell out of the backlog)


class Leader:
    def __init__(
        self,
        cfg: ReplicationConfig,
        pair: Pair,
        *,
        heartbeat_s: float,
        stall_s: float,
        partner_gone: bool = False,
    ) -> None:
        self.cfg = cfg
        self.pair = pair
        self.heartbeat_s = heartbeat_s
        self.stall_s = stall_s
        self.alone = False  # sync mode: confirm writes without the follower (the node decides)
        self.bad_frames = 0  # sessions ended for a frame that broke the rules (a forged ack...)
        self.backlog = Backlog(cfg.backlog_bytes, pair.wal.next_lsn)
        self.session: _Conn | None = None
        self.full_transfers = 0
        self.resumes = 0
        self.sync_timeouts = 0
        # No follower yet. After a takeover the partner is known to be gone: a paired sync
        # master refuses writes at once rather than accept what it cannot confirm. Otherwise
        # (start-up, a hand-over) the slave is expected within sync_timeout_ms.
        self.link_lost_at = -math.inf if partner_gone else loop_time()
        self._wake = asyncio.Event()
        self._waiters: deque[tuple[int, asyncio.Future[None], float]] = deque()
        self._expiry: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ the log

    def offer(self, first_lsn: int, count: int, payload: bytes) -> None:
        """A batch the WAL just encoded (``kapok.storage.wal.ReplicaSink``).

        Until a slave has paired, the backlog keeps at most ``UNPAIRED_BACKLOG_BYTES``: a
        node that runs alone would otherwise hold ``backlog_bytes`` (64 MiB by default) of
        log no slave may ever read. A slave started beside its master still resumes from
        it; one that first pairs with a master that logged more gets a full transfer."""
        backlog = self.backlog
        backlog.max_bytes = (
            self.cfg.backlog_bytes
            if self.session is not None or self.pair.state.paired
            else min(self.cfg.backlog_bytes, UNPAIRED_BACKLOG_BYTES)
        )
        backlog.offer(first_lsn, count, payload, self.pair.now())
        self._wake.set()
        session = self.session
        if session is not None and session.state.acked >= 0 and not self.backlog.holds(session.state.acked):
            session.cut.set()  # it cannot resume from there: cut off, it comes back for a full transfer

    @property
    def link_up(self) -> bool:
        return self.session is not None and not self.session.link.closed

    def silent_s(self) -> float:
        """Seconds since the follower was last heard (since the link was lost, when it is)."""
        if self.session is None:
            return loop_time() - self.link_lost_at
        return loop_time() - self.session.state.last_heard

    def lag(self) -> tuple[int, int, float] | None:
        """The follower's lag: records, bytes, seconds (None without a follower)."""
        session = self.session
        if session is None:
            return None
        end, acked = self.pair.wal.next_lsn, max(session.state.acked, 0)
        logged = self.backlog.logged_at(acked)
        seconds = max(self.pair.now() - logged, 0.0) if logged is not None else 0.0
        return end - acked, self.backlog.bytes_after(acked), round(seconds, 3)

    def caught_up(self) -> bool:
        return self.session is not None and self.session.state.acked == self.pair.wal.next_lsn

    # ------------------------------------------------------------ sync mode

    def check_writable(self) -> None:
        """Sync mode: refuse a publish up front (nothing is stored) while the paired slave
        has been gone too long."""
        if self.cfg.mode != "sync" or not self.pair.state.paired or self.link_up or self.alone:
            return
        if self.silent_s() * 1000 >= self.cfg.sync_timeout_ms:
            raise ReplicationUnavailableError(
                f"sync replication: the paired slave {self.pair.state.partner} is not connected"
            )

    def confirm(self, local: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
        """What a publish's confirmation waits for: ``local`` and, in sync mode with a
        pairing, the follower's durable ack of everything logged so far."""
        if self.cfg.mode != "sync" or not self.pair.state.paired or self.alone:
            return local
        end = self.pair.wal.next_lsn
        if self.session is not None and self.session.state.acked >= end:
            return local
        loop = asyncio.get_running_loop()
        remote: asyncio.Future[None] = loop.create_future()
        self._waiters.append((end, remote, loop.time() + self.cfg.sync_timeout_ms / 1000))
        if self._expiry is None:
            self._arm_expiry()
        return remote if local is None else _both(local, remote)

    def _acked(self, lsn: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= lsn:
            _, future, _ = waiters.popleft()
            if not future.done():
                future.set_result(None)

    def _arm_expiry(self) -> None:
        loop = asyncio.get_running_loop()
        self._expiry = None
        if self._waiters:
            self._expiry = loop.call_at(self._waiters[0][2], self._expire)

    def _expire(self) -> None:
        now = asyncio.get_running_loop().time()
        waiters = self._waiters
        while waiters and waiters[0][2] <= now:
            _, future, _ = waiters.popleft()
            if not future.done():
                self.sync_timeouts += 1
                future.set_exception(
                    ReplicationUnconfirmedError(
                        f"sync replication: the slave did not confirm within {self.cfg.sync_timeout_ms} ms"
                    )
                )
                future.exception()  # retrieved here: the producer is told through its reply
        self._arm_expiry()

    def release_waiters(self) -> None:
        """Going alone: what waits for the follower is confirmed by this node's log alone."""
        self._acked(self.pair.wal.next_lsn)

    def fail_waiters(self, exc: Exception) -> None:
        while self._waiters:
            _, future, _ = self._waiters.popleft()
            if not future.done():
                future.set_exception(exc)
                future.exception()

    # ------------------------------------------------------------ the follower's session

    async def serve(self, link: SyncLink) -> None:
        """Run one follower's session until the link ends (the ``/sync/v1`` handler)."""
        hello = parse_hello(await link.receive_control("hello", HELLO_TIMEOUT_S))
        state, old = self.pair.state, self.session
        live = old is not None and old.state.silence_left(loop_time()) > 0
        refusal = admit(hello, self.pair.name, state, live_session=live)
        if refusal is not None:
            await self._refuse(link, refusal)
            if refusal.why == "newer_epoch":  # the other node says it led later: check, then step down
                self.pair.newer_partner(hello.epoch)
            return
        if old is not None:
            old.cut.set()  # silent past the stall limit: that connection is dead
        # A first pairing is recorded once the follower acks, which it does only after it has
        # stored the token: a follower that dies before that was never half-paired.
        token = state.token or hello.token or secrets.token_hex(16)
        pairing = (
            None
            if state.partner == hello.node and state.token is not None
            else Paired(hello.node, hello.http_url, token)
        )
        await self.pair.wal.flush()  # every record logged so far is in the backlog now
        leader_end, end = self.pair.wal.next_lsn, hello.lsn
        shared = shared_end(hello.history, end, self.pair.state.history, leader_end)
        start_fields: dict[str, Any] = {
            "leader": self.pair.name,
            "http_url": self.pair.http_url,
            "epoch": self.pair.state.epoch,
            "history": [list(h) for h in self.pair.state.history],
            "token": token,
        }
        if shared == end and self.backlog.holds(end):
            self.resumes += 1
            log.info("slave %s resumes from LSN %d (%d records behind)", hello.node, end, leader_end - end)
            await link.send(control("start", mode="resume", lsn=end, **start_fields))
            position = end
        else:
            self.full_transfers += 1
            position = await self._full_transfer(link, hello.node, end, shared, start_fields)
        conn = self.session = _Conn(
            link,
            LeaderSession(
                hello.node, hello.http_url, position=position, now=loop_time(), ask_back=hello.ask_back,
                acked=end if position == end else -1, pairing=pairing,
                heartbeat_s=self.heartbeat_s, stall_s=self.stall_s,
            ),
        )  # fmt: skip
        try:
            await _first_done(self._send(conn), self._receive(conn), conn.cut.wait())
        finally:
            if self.session is conn:
                self.session = None
                self.link_lost_at = conn.state.last_heard  # silence counts from the last frame heard
            if conn.cut.is_set():
                log.warning("cut off %s: it fell out of the backlog or stopped answering", hello.node)
            log.warning("the sync link to %s is down", hello.node)

    async def _refuse(self, link: SyncLink, refusal: Refusal) -> None:
        log.warning("sync link refused: %s", refusal.reason)
        with contextlib.suppress(ConnectionError):
            await link.send(refusal.frame())
        await link.close(refusal.reason)

    async def _full_transfer(
        self, link: SyncLink, name: str, end: int, shared: int, start_fields: dict[str, Any]
    ) -> int:
        """Stream the state (a fuzzy snapshot: the log from ``lsn`` on makes it exact)."""
        lsn = self.pair.wal.cut()  # the next batch starts at lsn: a boundary the backlog will hold
        why = "its log diverged" if shared < end else "its position is not in the backlog"
        log.info(
            "slave %s gets a full transfer at LSN %d (%s: it is at %d, shared %d)",
            name,
            lsn,
            why,
            end,
            shared,
        )
        await link.send(control("start", mode="full", lsn=lsn, shared=shared, **start_fields))
        # In slices, encoded off the loop: the master keeps serving (transfer.py says why).
        await send_transfer(link, state_records(self.pair.broker, self.pair.now()), lsn)
        return lsn

    async def _send(self, conn: _Conn) -> None:
        link, session = conn.link, conn.state
        while not link.closed:
            self._wake.clear()
            try:
                frames = session.outgoing(
                    loop_time(), self.backlog, epoch=self.pair.state.epoch, log_end=self.pair.wal.next_lsn,
                    lag=self.lag(),
                )  # fmt: skip
            except Behind:
                refusal = Refusal("behind", "the slave fell out of the backlog; it needs a full transfer")
                await self._refuse(link, refusal)
                return
            for frame in frames:
                await link.send(frame)
            if not session.more_to_send(self.backlog):
                await wait_set(self._wake, self.heartbeat_s)

    async def _receive(self, conn: _Conn) -> None:
        link, session = conn.link, conn.state
        while True:
            try:
                frame = await link.receive(max(session.silence_left(loop_time()), 0.0))
            except TimeoutError:
                log.warning("no frame from %s in %.1f s: a stalled link, closed", session.name, self.stall_s)
                return
            if frame is None:
                return
            try:
                effects = session.receive(frame, loop_time())
            except ReplicationError:
                self.bad_frames += 1
                raise
            for effect in effects:
                if isinstance(effect, Acked):
                    self._acked(effect.lsn)
                elif isinstance(effect, Paired):
                    self.pair.record_partner(effect.name, effect.url, effect.token)
                elif not conn.promoted.done():
                    conn.promoted.set_result(effect.epoch)

    # ------------------------------------------------------------ hand-over

    async def hand_over(self, timeout_s: float) -> tuple[int, int] | None:
        """Give the role to the connected follower: everything logged goes to it, then it is
        told to take over at the next epoch. Returns that epoch and the LSN it starts at once
        the follower confirms, None when it did not (the caller stays the leader)."""
        session = self.session
        if session is None:
            return None
        await self.pair.wal.flush()
        end = self.pair.wal.next_lsn
        epoch = self.pair.state.epoch + 1
        log.info("handing over to %s at LSN %d, epoch %d", session.state.name, end, epoch)
        session.state.hand_over(end, epoch)  # the sender sends it after the last record before it
        self._wake.set()
        try:
            confirmed = await asyncio.wait_for(asyncio.shield(session.promoted), timeout_s)
        except (TimeoutError, ConnectionError):
            return None
        return (epoch, end) if confirmed == epoch else None

    async def aclose(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.fail_waiters(ReplicationUnconfirmedError("stored, but this node is no longer the master"))
        if self.session is not None:
            await self.session.link.close("the master is stopping")


def _both(a: asyncio.Future[None], b: asyncio.Future[None]) -> asyncio.Future[None]:
    """A future done when both are, failed as soon as either fails."""
    out: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(_: asyncio.Future[None]) -> None:
        if out.done():
            return
        for f in (a, b):
            if f.done() and f.cancelled():
                out.set_exception(ReplicationUnavailableError("the confirmation was cancelled"))
                return
            if f.done() and (exc := f.exception()) is not None:
                out.set_exception(exc)
                return
        if a.done() and b.done():
            out.set_result(None)

    a.add_done_callback(done)
    b.add_done_callback(done)
    return out


async def _first_done(*coroutines: Any) -> None:
    """Run the coroutines until the first ends; cancel the rest; re-raise its error."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_all(*tasks)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()

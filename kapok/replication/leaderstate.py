"""What a leader holds and answers: the backlog, the follower's session, sync confirmations.

``LeaderState`` holds what ``Leader`` (``leader.py``) works on, and answers what the node
and the service ask of a leader: the backlog the WAL feeds (``offer``; at most
``UNPAIRED_BACKLOG_BYTES`` until a slave has paired), the follower's session as the driver
holds it (``Conn``) with its link, silence and lag, and sync mode's confirmations:
``check_writable`` refuses a publish up front while the paired slave has been gone too
long, ``confirm`` makes a publish also wait for the follower's ack, which the session's
receiver releases, or fails it after ``sync_timeout_ms``. ``Pair`` is what the leader
needs from the node it runs in. Serving the session is ``Leader``'s.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import TYPE_CHECKING, Protocol

from kapok.clock import loop_time
from kapok.config import ReplicationConfig
from kapok.core.broker import Broker
from kapok.errors import ReplicationUnavailableError, ReplicationUnconfirmedError
from kapok.replication.backlog import Backlog
from kapok.replication.link import SyncLink
from kapok.replication.session import LeaderSession
from kapok.replication.state import PairState

if TYPE_CHECKING:
    from kapok.storage.wal import WriteAheadLog

__all__ = ["UNPAIRED_BACKLOG_BYTES", "Conn", "LeaderState", "Pair"]

UNPAIRED_BACKLOG_BYTES = 1024 * 1024  # see LeaderState.offer


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


class Conn:
    """One follower's session as the driver holds it: the pure session, its link, and the
    signals the node waits on."""

    def __init__(self, link: SyncLink, session: LeaderSession) -> None:
        self.link = link
        self.state = session
        self.promoted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.cut = asyncio.Event()  # set to end the session from outside (fell out of the backlog)


class LeaderState:
    """The leader's backlog, its follower's session and the sync waiters; ``Leader`` serves
    the session."""

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
        self.session: Conn | None = None
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
        """A batch the WAL just encoded (``kapok.storage.walstate.ReplicaSink``).

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

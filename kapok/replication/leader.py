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
``stall_s`` is closed. The backlog, the follower's session as it is held, its lag and the
sync waiters are ``LeaderState``'s, in ``leaderstate.py``; ``Leader`` serves the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any

from kapok.clock import loop_time, wait_set
from kapok.core.replay import state_records
from kapok.errors import ReplicationError, ReplicationUnconfirmedError
from kapok.replication.leaderstate import Conn, LeaderState
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
from kapok.replication.transfer import send_transfer
from kapok.tasks import cancel_all

__all__ = ["Leader"]

log = logging.getLogger("kapok.replication")

HELLO_TIMEOUT_S = 10.0


class Leader(LeaderState):
    """``LeaderState`` with the follower's session served (``serve``) and the role handed
    over to it (``hand_over``)."""

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
        conn = self.session = Conn(
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

    async def _send(self, conn: Conn) -> None:
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

    async def _receive(self, conn: Conn) -> None:
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

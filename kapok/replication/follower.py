"""The following side of a pair: dial the leader, mirror its log, ack what is durable.

A follower keeps its own WAL and snapshots in step with its leader's log: the same
batches under the same LSNs. It says ``hello`` with the end of its log and its epoch
history; on ``resume`` it reads on from there, on ``full`` it empties its store, writes
the streamed snapshot as its own, and recovers from it (first setting aside, for the
operator, whatever its log held past the point it shares with the leader). Each ``R``
batch is appended to the WAL as it came, undecoded, and queued for the mirror, which
applies it later (``kapok.replication.applier``: in idle time, or at once past its bound,
and completely before the node leads); the LSN is acked once the WAL says it is durable.
On ``handover`` it waits until everything up to the given LSN is durable, asks its node to
take over at the given epoch (which applies the rest first), answers ``promoted``, and
ends: a follower never outlives its node's following.

The follower decides nothing about failures: it reports when it last heard from the
leader (``silent_s``), whether it is in sync (``in_sync``) and the link's state
(``link_state``), and its node's state table decides. In sync means it holds every write
the pair may have confirmed: it has acked, since this process started or since its last
full transfer, everything its leader had logged when it connected (the ``lsn`` of the
leader's first ping); from then on every confirmation waits for its acks. A follower
whose own log came back shorter than what it once acked (a damaged or truncated segment,
cut at recovery) is thus not in sync until it has fetched the rest again, and never
takes over before.

A full disk (``kapok.storage.wal``): the WAL keeps trying to write the batch in hand and
its ack waits; the follower reads nothing more until the WAL writes again, so its memory
stays bounded and its leader, which still holds every record not acked, keeps them. A full
transfer that finds the disk full says so once and waits until space was freed before it
asks again (``_wait_for_space``): never one transfer after another that cannot be written. A link
with no frame for ``stall_s`` is closed (a stalled TCP connection looks open). A leader
that refuses us (a wrong key, another slave, a pairing token it does not know) is an
operator's problem: one ERROR line with the cause in words, and retries back off to
``REFUSED_BACKOFF_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import random
import shutil
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp

from kapok.clock import loop_time, wait_set
from kapok.config import ReplicationConfig
from kapok.errors import KapokError, ReplicationError, SyncRefusedError
from kapok.protocol.sync import SNAPSHOT
from kapok.replication.applier import Applier
from kapok.replication.link import LinkFactory, SyncLink
from kapok.replication.protocol import History
from kapok.replication.session import Append, FollowerSession, HandOver, control, parse_start
from kapok.replication.state import PairState
from kapok.storage.wal import WriteAheadLog
from kapok.tasks import cancel_and_wait

__all__ = ["Follower", "Host"]

log = logging.getLogger("kapok.replication")

START_TIMEOUT_S = 30.0
BACKOFF_S = (0.1, 2.0)  # reconnect delays: first, cap (exponential with full jitter)
REFUSED_BACKOFF_S = 30.0  # the cap once the leader refused us: a person must act first
SPACE_POLL_S = 1.0  # a full disk: how often free space is looked at
SPACE_MARGIN = 1 << 20  # ...and how much must have been freed before a transfer is tried again

# Why a leader refused us, in words an operator acts on (``link_state`` shows the key).
_REFUSALS = {
    "wrong key": "the master refused our key: check mq.secret_key on both nodes",
    "throttled": "the master throttles this address after wrong keys: check mq.secret_key",
    "paired": "the master is paired with another slave: unpair it first (kapok replication unpair)",
    "stranger": "the master does not know our pairing token: it was paired anew; unpair it first",
    "behind": "we fell out of the master's backlog: a full transfer follows",
}


class _HandedOver(Exception):
    """The leader handed its role to us: this follower's work is done."""


class Host(Protocol):
    """What the follower needs from the node it runs in (``kapok.replication.node``)."""

    name: str
    state: PairState
    configured_role: str
    secret: str
    link_factory: LinkFactory  # makes this end's link over the WebSocket

    @property
    def http_url(self) -> str: ...

    @property
    def wal(self) -> WriteAheadLog: ...

    @property
    def applier(self) -> Applier: ...

    def adopt(self, leader: str, epoch: int, history: History, token: str) -> None: ...

    async def receive_transfer(
        self, lsn: int, shared: int, chunks: Callable[[], Awaitable[bytes | None]]
    ) -> None: ...

    async def take_over(self, epoch: int | None) -> None: ...

    def newer_than_leader(self) -> None: ...

    def ask_back(self) -> bool: ...


class Follower:
    def __init__(
        self, cfg: ReplicationConfig, host: Host, leader_url: str, *, heartbeat_s: float, stall_s: float
    ) -> None:
        self.cfg = cfg
        self.host = host
        self.leader_url = leader_url.rstrip("/")
        self.heartbeat_s = heartbeat_s
        self.stall_s = stall_s
        self.link: SyncLink | None = None
        self.session: FollowerSession | None = None  # the link's rules, from ``start`` on
        self.leader_name: str | None = None
        self.last_heard = loop_time()
        self.refusals = 0  # times the master refused us (paired with another slave...)
        self.link_state = "connecting"  # up, down, or refused (why): for the console and the CLI
        self.in_sync = False  # holds every write its leader confirmed: only then may it take over
        self._closing = asyncio.Event()  # set by aclose: the loop ends, whatever a cancel became
        self._ack_wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._rng = random.Random()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        # The flag, not the cancel alone, ends the loop: aiohttp's receive with a time-out can
        # turn a cancel into a TimeoutError, which the loop takes for a broken link.
        self._closing.set()
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self.link is not None:
            await self.link.close("the slave is stopping")

    @property
    def link_up(self) -> bool:
        return self.link is not None and not self.link.closed

    @property
    def lag(self) -> tuple[int, int, float] | None:
        """The lag as the leader last reported it (None without a link)."""
        return self.session.lag if self.session is not None else None

    def silent_s(self) -> float:
        heard = self.link.last_heard if self.link is not None else self.last_heard
        return loop_time() - max(heard, self.last_heard)

    # ------------------------------------------------------------ the connection

    async def _run(self) -> None:
        failures = 0
        refused_why = ""
        async with aiohttp.ClientSession() as http:
            while not self._closing.is_set():
                why = ""
                no_space: OSError | None = None
                try:
                    await self._session(http)
                    failures = 0
                except _HandedOver:
                    return
                except aiohttp.WSServerHandshakeError as exc:
                    why = {401: "wrong key", 429: "throttled"}.get(exc.status, "")
                    if not why:
                        log.info("sync link to %s: %s %s", self.leader_url, exc.status, exc.message)
                except SyncRefusedError as exc:
                    why = exc.why if exc.why in _REFUSALS else ""
                    if not why:
                        log.warning("sync link to %s: %s", self.leader_url, exc.message)
                except OSError as exc:  # ConnectionError and TimeoutError too
                    if exc.errno == errno.ENOSPC:  # writing a full transfer found the disk full
                        no_space = exc
                    else:
                        log.info("sync link to %s: %s", self.leader_url, exc or type(exc).__name__)
                except aiohttp.ClientError as exc:
                    log.info("sync link to %s: %s", self.leader_url, exc or type(exc).__name__)
                except KapokError as exc:
                    log.warning("sync link to %s: %s", self.leader_url, exc.message)
                finally:
                    self.session = None
                    if self.link is not None:
                        self.last_heard = max(self.last_heard, self.link.last_heard)
                        await self.link.close()
                        self.link = None
                if no_space is not None:
                    await self._wait_for_space(no_space)
                    continue
                if why == "behind":
                    self.in_sync = False
                elif why:
                    self.refusals += 1
                    if why != refused_why:  # once per cause: the state shows it meanwhile
                        log.error("sync link to %s refused: %s", self.leader_url, _REFUSALS[why])
                refused_why = why if why != "behind" else ""
                self.link_state = f"refused ({why})" if refused_why else "down"
                failures += 1
                first, cap = BACKOFF_S
                if refused_why:
                    cap = REFUSED_BACKOFF_S
                delay = self._rng.uniform(cap / 2 if refused_why else 0, min(cap, first * 2**failures))
                await wait_set(self._closing, delay)

    async def _wait_for_space(self, error: OSError) -> None:
        """A full transfer found the disk full. Fetching the whole state again at once
        would fail the same way (and cost the master a transfer each time): wait until the
        storage directory has gained ``SPACE_MARGIN`` bytes of free space, then dial."""
        directory = self.host.wal.directory
        baseline = shutil.disk_usage(directory).free  # the failed transfer's files are gone already
        self.link_state = "waiting (disk full)"
        self.in_sync = False
        log.error(
            "disk full: the state the master sent cannot be written in %s (%s); waiting for free space",
            directory, error.strerror or error,
        )  # fmt: skip
        while not self._closing.is_set():
            await wait_set(self._closing, SPACE_POLL_S)
            free = shutil.disk_usage(directory).free
            if free >= baseline + SPACE_MARGIN:
                log.warning("space again in %s (%d MiB free): asking the master again", directory, free >> 20)
                return

    async def _session(self, http: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.host.secret}"}
        ws = await http.ws_connect(
            self.leader_url + "/sync/v1",
            headers=headers,
            heartbeat=None,
            max_msg_size=0,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        )
        link = self.link = self.host.link_factory(ws)
        state, wal = self.host.state, self.host.wal
        await link.send_control(
            "hello",
            node=self.host.name,
            http_url=self.host.http_url,
            epoch=state.epoch,
            history=[list(h) for h in state.history],
            lsn=wal.next_lsn,
            role=self.host.configured_role,
            token=state.token or "",
            ask_back=self.host.ask_back(),
        )
        try:
            frame = await link.receive_control("start", START_TIMEOUT_S)
        except SyncRefusedError as exc:
            if exc.why == "newer_epoch":  # the other node was the stale one: it steps down
                self.host.newer_than_leader()
            raise
        start = parse_start(frame, epoch=state.epoch, log_end=self.host.wal.next_lsn)
        self.leader_name = start.leader
        if start.mode == "full":
            self.in_sync = False
            await self.host.receive_transfer(start.lsn, start.shared, lambda: self._chunk(link))
        self.host.adopt(start.leader, start.epoch, start.history, start.token)
        session = self.session = FollowerSession(
            log_end=self.host.wal.next_lsn,
            now=loop_time(),
            heartbeat_s=self.heartbeat_s,
            stall_s=self.stall_s,
        )
        self.link_state = "up"
        log.info("following %s from LSN %d (epoch %d, %s)", start.leader, start.lsn, start.epoch, start.mode)
        sender = asyncio.get_running_loop().create_task(self._send(link, session))
        try:
            await self._receive(link, session)
        finally:
            with contextlib.suppress(ConnectionError):
                await cancel_and_wait(sender)

    async def _chunk(self, link: SyncLink) -> bytes | None:
        """The next snapshot chunk of a full transfer; None at its end."""
        frame = await link.receive(max(self.stall_s, START_TIMEOUT_S))
        if frame is None:
            raise ConnectionResetError("the sync link closed during a full transfer")
        if isinstance(frame, dict):
            if frame["op"] == "snapshot_end":
                return None
            if frame["op"] == "ping":
                return b""
            raise ReplicationError(f"expected a snapshot chunk, got {frame['op']!r}")
        if frame[:1] != SNAPSHOT:
            raise ReplicationError("expected a snapshot chunk")
        return frame[1:]

    # ------------------------------------------------------------ streaming

    async def _receive(self, link: SyncLink, session: FollowerSession) -> None:
        wal, applier = self.host.wal, self.host.applier  # after a full transfer: the new store's
        while True:
            try:
                frame = await link.receive(max(session.silence_left(loop_time()), 0.0))
            except TimeoutError:
                raise ConnectionResetError(
                    f"no frame from the master in {self.stall_s} s: a stalled link"
                ) from None
            if frame is None:
                return
            bar = session.catch_up_to
            for effect in session.receive(frame, loop_time()):
                if isinstance(effect, Append):
                    if wal.full:  # the disk is full: take nothing more until the WAL writes again
                        await wal.wait_for_space()
                    wal.append_encoded(effect.payload, effect.count).add_done_callback(
                        functools.partial(self._made_durable, session, effect.end)
                    )
                    applier.journaled(effect)
                else:
                    await self._hand_over(link, effect)
            if session.catch_up_to != bar:  # the first ping set the bar for in-sync: look now
                self._ack_wake.set()

    async def _hand_over(self, link: SyncLink, handover: HandOver) -> None:
        await self.host.wal.flush()
        await self.host.take_over(handover.epoch)
        with contextlib.suppress(ConnectionError):
            await link.send(control("promoted", epoch=handover.epoch))
        raise _HandedOver

    def _made_durable(self, session: FollowerSession, end: int, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            session.made_durable(end)
            self._ack_wake.set()

    async def _send(self, link: SyncLink, session: FollowerSession) -> None:
        """Acks as the WAL makes batches durable, and a ping every heartbeat."""
        while not link.closed:
            for frame in session.outgoing(loop_time(), epoch=self.host.state.epoch):
                await link.send(frame)
            if session.caught_up:
                self.in_sync = True
            self._ack_wake.clear()
            await wait_set(self._ack_wake, self.heartbeat_s)

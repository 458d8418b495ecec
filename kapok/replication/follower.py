"""The following side of a pair: dial the leader, mirror its log, ack what is durable.

A follower keeps its own WAL and snapshots in step with its leader's log: the same
batches under the same LSNs. It says ``hello`` with the end of its log and its epoch
history; on ``resume`` it reads on from there, on ``full`` it empties its store, writes
the streamed snapshot as its own, and recovers from it (first setting aside, for the
operator, whatever its log held past the point it shares with the leader). Each ``R``
batch is appended to the WAL as it came and applied to the mirror
(``kapok.core.replay.Mirror``); the LSN is acked once the WAL says it is durable. On
``handover`` it waits until everything up to the given LSN is durable, asks its node to
take over at the given epoch, answers ``promoted``, and ends: a follower never outlives
its node's following.

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
stays bounded and its leader, which still holds every record not acked, keeps them. A link
with no frame for ``stall_s`` is closed (a stalled TCP connection looks open). A leader
that refuses us (a wrong key, another slave, a pairing token it does not know) is an
operator's problem: one ERROR line with the cause in words, and retries back off to
``REFUSED_BACKOFF_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from kapok.clock import loop_time, wait_set
from kapok.config import ReplicationConfig
from kapok.core.replay import Mirror
from kapok.errors import KapokError, ReplicationError, SyncRefusedError
from kapok.replication.link import SyncLink, refused
from kapok.replication.protocol import (
    RECORDS,
    SNAPSHOT,
    History,
    decode_records,
    get_int,
    get_str,
    history_from_json,
)
from kapok.replication.state import PairState
from kapok.storage.records import decode_payload
from kapok.storage.wal import WriteAheadLog

__all__ = ["Follower", "Host"]

log = logging.getLogger("kapok.replication")

START_TIMEOUT_S = 30.0
BACKOFF_S = (0.1, 2.0)  # reconnect delays: first, cap (exponential with full jitter)
REFUSED_BACKOFF_S = 30.0  # the cap once the leader refused us: a person must act first
PRUNE_EVERY_S = 1.0

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

    @property
    def http_url(self) -> str: ...

    @property
    def wal(self) -> WriteAheadLog: ...

    @property
    def mirror(self) -> Mirror: ...

    def now(self) -> float: ...

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
        self.leader_name: str | None = None
        self.last_heard = loop_time()
        self.lag: tuple[int, int, float] | None = None  # as the leader last reported it
        self.durable = 0  # the end of what the WAL has made durable
        self._acked = 0
        self.refusals = 0  # times the master refused us (paired with another slave...)
        self.link_state = "connecting"  # up, down, or refused (why): for the console and the CLI
        self.in_sync = False  # holds every write its leader confirmed: only then may it take over
        self._catch_up_to: int | None = None  # the leader's log end when we connected (first ping)
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
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.link is not None:
            await self.link.close("the slave is stopping")

    @property
    def link_up(self) -> bool:
        return self.link is not None and not self.link.closed

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
                except (OSError, aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                    log.info("sync link to %s: %s", self.leader_url, exc or type(exc).__name__)
                except KapokError as exc:
                    log.warning("sync link to %s: %s", self.leader_url, exc.message)
                finally:
                    if self.link is not None:
                        self.last_heard = max(self.last_heard, self.link.last_heard)
                        await self.link.close()
                        self.link = None
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

    async def _session(self, http: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.host.secret}"}
        ws = await http.ws_connect(
            self.leader_url + "/sync/v1",
            headers=headers,
            heartbeat=None,
            max_msg_size=0,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        )
        link = self.link = SyncLink(ws)
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
            start = await link.receive_control("start", START_TIMEOUT_S)
        except SyncRefusedError as exc:
            if exc.why == "newer_epoch":  # the other node was the stale one: it steps down
                self.host.newer_than_leader()
            raise
        epoch = get_int(start, "epoch")
        history = history_from_json(start.get("history"))
        self.leader_name = get_str(start, "leader")
        token = get_str(start, "token")
        lsn = get_int(start, "lsn")
        if epoch < state.epoch:
            raise ReplicationError(f"the master leads at epoch {epoch}, ours is {state.epoch}")
        if start.get("mode") == "full":
            self.in_sync = False
            await self.host.receive_transfer(lsn, get_int(start, "shared"), lambda: self._chunk(link))
        elif lsn != self.host.wal.next_lsn:
            raise ReplicationError(f"the master resumes at {lsn}, our log ends at {self.host.wal.next_lsn}")
        self.host.adopt(self.leader_name, epoch, history, token)
        self.durable = self.host.wal.next_lsn
        self._acked = -1  # so the first ack says where we are
        self._catch_up_to = None
        self.link_state = "up"
        log.info("following %s from LSN %d (epoch %d, %s)", self.leader_name, lsn, epoch, start.get("mode"))
        sender = asyncio.get_running_loop().create_task(self._send(link))
        try:
            await self._receive(link)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sender

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

    async def _receive(self, link: SyncLink) -> None:
        wal = self.host.wal
        mirror = self.host.mirror
        pruned = loop_time()
        while True:
            try:
                frame = await link.receive(self.stall_s)
            except TimeoutError:
                raise ConnectionResetError(
                    f"no frame from the master in {self.stall_s} s: a stalled link"
                ) from None
            if frame is None:
                return
            if isinstance(frame, bytes):
                if frame[:1] != RECORDS:
                    raise ReplicationError("expected a records frame")
                first, count, view = decode_records(frame)
                if first != wal.next_lsn:
                    raise ReplicationError(f"records from LSN {first}, but our log ends at {wal.next_lsn}")
                payload = bytes(view)
                records = decode_payload(payload)
                if len(records) != count:
                    raise ReplicationError(f"a batch said {count} records and held {len(records)}")
                end = first + count
                if wal.full:  # the disk is full: take nothing more until the WAL writes again
                    await wal.wait_for_space()
                wal.append_encoded(payload, count).add_done_callback(
                    functools.partial(self._made_durable, end)
                )
                for record in records:
                    mirror.apply(record)
            else:
                await self._control(link, frame)
            now = loop_time()  # pings come every heartbeat: an idle mirror is pruned too
            if now - pruned >= PRUNE_EVERY_S or mirror.over_retention:
                pruned = now
                mirror.prune(self.host.now())

    async def _control(self, link: SyncLink, frame: dict[str, Any]) -> None:
        op = frame["op"]
        if op == "ping":
            lag = frame.get("lag")
            if isinstance(lag, list) and len(lag) == 3:
                self.lag = (int(lag[0]), int(lag[1]), float(lag[2]))
            if self._catch_up_to is None:
                self._catch_up_to = get_int(frame, "lsn")
                self._ack_wake.set()
        elif op == "handover":
            lsn, epoch = get_int(frame, "lsn"), get_int(frame, "epoch")
            wal = self.host.wal
            if wal.next_lsn != lsn:
                raise ReplicationError(f"hand-over at LSN {lsn}, but our log ends at {wal.next_lsn}")
            await wal.flush()
            await self.host.take_over(epoch)
            with contextlib.suppress(ConnectionError):
                await link.send_control("promoted", epoch=epoch)
            raise _HandedOver
        elif op == "refused":
            raise refused(frame)
        else:
            raise ReplicationError(f"the master sent {op!r}")

    def _made_durable(self, end: int, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None and end > self.durable:
            self.durable = end
            self._ack_wake.set()

    async def _send(self, link: SyncLink) -> None:
        """Acks as the WAL makes batches durable, and a ping every heartbeat."""
        last_ping = 0.0
        while not link.closed:
            if self.durable > self._acked:
                self._acked = self.durable
                await link.send_control("ack", lsn=self._acked)
            if not self.in_sync and self._catch_up_to is not None and self._acked >= self._catch_up_to:
                self.in_sync = True
            now = loop_time()
            if now - last_ping >= self.heartbeat_s:
                last_ping = now
                await link.send_control("ping", epoch=self.host.state.epoch, lsn=self.durable)
            self._ack_wake.clear()
            await wait_set(self._ack_wake, self.heartbeat_s)

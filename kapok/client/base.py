"""What ``Producer`` and ``Consumer`` share: seeds, discovery, connections, the upkeep loop.

The upkeep loop is the one background task of a client. Every ``TICK_S`` it lets the
subclass look after its work (``_tick``: expire, retry, reconnect) and every
``refresh_interval_s`` — or soon after someone asked, at most every ``MIN_REFRESH_S`` —
it re-reads the cluster view and hands the active members, by pair, to ``_on_view``.
Errors ask for a refresh: that is how a takeover or a dead node is noticed before the
next periodic read.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Literal, Self, TypedDict

import aiohttp

from kapok.client.backoff import backoff_delay
from kapok.client.discovery import Discovery, normalize_seeds
from kapok.client.kapokmq import KapokMQSession
from kapok.client.native import connect_native
from kapok.client.pool import SessionPool
from kapok.client.session import Connector, NodeSession
from kapok.client.stats import Stats, Status
from kapok.client.view import Member, by_pair
from kapok.errors import ClientClosedError, ConnectionLostError, KapokError
from kapok.tasks import cancel_and_wait

__all__ = ["ClientBase", "ClientOptions", "WireProtocol"]

log = logging.getLogger("kapok.client")

WireProtocol = Literal["native", "kapokmq"]
PROTOCOLS: tuple[WireProtocol, ...] = ("native", "kapokmq")
TICK_S = 0.05
MIN_REFRESH_S = 0.2


class ClientOptions(TypedDict, total=False):
    """The keywords ``Producer`` and ``Consumer`` share (``**options: Unpack[ClientOptions]``:
    typed, so editors complete them and mypy checks them)."""

    secret: str
    protocol: WireProtocol
    name: str | None
    connect_timeout_s: float
    refresh_interval_s: float
    heartbeat_s: float
    backoff_base_s: float
    backoff_cap_s: float
    on_error: Callable[[KapokError], None] | None
    on_disconnected: Callable[[], None] | None
    on_reconnected: Callable[[], None] | None
    pool: SessionPool | None
    rng: random.Random | None
    connector: Connector | None
    http: aiohttp.ClientSession | None


class ClientBase:
    """Seeds, discovery, the upkeep loop and the status, with its lifecycle callbacks:
    ``on_disconnected`` when no node takes work any more (CONNECTED → RECONNECTING),
    ``on_reconnected`` when one does again, ``on_error`` with each error that no call of the
    caller's can raise (a node's error frame that answers no request; a consumer's feed that
    cannot subscribe). A callback that raises is logged and otherwise ignored."""

    def __init__(
        self,
        seeds: Sequence[str] | str,
        *,
        secret: str = "test",
        protocol: WireProtocol = "native",
        name: str | None = None,
        connect_timeout_s: float = 5.0,
        refresh_interval_s: float = 5.0,
        heartbeat_s: float = 15.0,
        backoff_base_s: float = 0.05,
        backoff_cap_s: float = 5.0,
        on_error: Callable[[KapokError], None] | None = None,
        on_disconnected: Callable[[], None] | None = None,
        on_reconnected: Callable[[], None] | None = None,
        pool: SessionPool | None = None,
        rng: random.Random | None = None,
        connector: Connector | None = None,
        http: aiohttp.ClientSession | None = None,
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol = protocol
        self.secret = secret
        self.name = name or f"kapok-client-{secrets.token_hex(4)}"
        self.connect_timeout_s = connect_timeout_s
        self.refresh_interval_s = refresh_interval_s
        self.heartbeat_s = heartbeat_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.on_error = on_error
        self.on_disconnected = on_disconnected
        self.on_reconnected = on_reconnected
        self.status = Status.NEW
        self.stats = Stats()
        self.view: dict[str, Member] = {}  # pair identity -> the active member
        self.pairs: set[str] = set()  # pairs with a live member (the view's, and those failing over)
        self._seeds = normalize_seeds(seeds)  # a bad seed fails here, before anything is opened
        self._rng = rng or random.Random()
        self._connector = connector
        self._pool = pool if protocol == "native" else None  # KapokMQ's routes cannot share a connection
        self._http = http
        self._own_http = http is None
        self._discovery: Discovery | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop  # the loop the client was started on
        self._refresh_wanted = False
        self._next_refresh = 0.0

    # ------------------------------------------------------------ life cycle

    async def start(self) -> Self:
        """Read the cluster view from the seeds (``ClusterUnavailableError`` if none answers)."""
        if self.status is not Status.NEW:
            return self
        self.status = Status.CONNECTING
        self._loop = asyncio.get_running_loop()
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self._discovery = Discovery(
            self._seeds, self._http, protocol=self.protocol, secret=self.secret,
            timeout_s=self.connect_timeout_s, rng=self._rng,
        )  # fmt: skip
        try:
            await self._refresh()
        except BaseException:
            await self._close_http()
            self.status = Status.CLOSED
            raise
        self._upkeep = self._loop.create_task(self._upkeep_loop())
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        raise NotImplementedError

    async def _stop_upkeep(self) -> None:
        if self._upkeep is not None:
            await cancel_and_wait(self._upkeep)
            self._upkeep = None
        await self._close_http()
        self.status = Status.CLOSED

    async def _close_http(self) -> None:
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None

    def _check_open(self) -> None:
        if self.status is Status.CLOSED:
            raise ClientClosedError(f"{type(self).__name__} is closed")
        if self.status is Status.NEW:
            raise ClientClosedError(f"{type(self).__name__} is not started (use 'async with' or start())")

    # ------------------------------------------------------------ view and upkeep

    def want_refresh(self) -> None:
        self._refresh_wanted = True

    async def _refresh(self) -> None:
        assert self._discovery is not None
        members = await self._discovery.refresh()
        self._next_refresh = time.monotonic() + self.refresh_interval_s
        self._refresh_wanted = False
        self.view = by_pair(members)
        self.pairs = self._discovery.pairs | self.view.keys()
        self._on_view()

    async def _upkeep_loop(self) -> None:
        last_refresh = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            try:
                self._tick(now)
                due = now >= self._next_refresh or self._refresh_wanted
                if due and now - last_refresh >= MIN_REFRESH_S:
                    last_refresh = now
                    await self._refresh()
            except KapokError as exc:
                log.warning("%s: cluster view not refreshed: %s", self.name, exc)
                self._next_refresh = now + self.refresh_interval_s
            except Exception:  # a bug must not end the upkeep of every connection
                log.exception("%s: upkeep failed", self.name)

    def _on_view(self) -> None:
        raise NotImplementedError

    def _tick(self, now: float) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ connections

    async def _connect(self, member: Member) -> NodeSession:
        """An open session to ``member``, bounded by ``connect_timeout_s``."""
        assert self._http is not None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self._connector is not None:
                    session = await self._connector(member)
                elif self.protocol == "kapokmq":
                    session = KapokMQSession(self._http, member, secret=self.secret, client=self.name)
                elif self._pool is not None:
                    key = (member.name, member.url, member.epoch, self.secret)
                    session = await self._pool.lease(key, lambda http: self._connect_native(http, member))
                else:
                    session = await self._connect_native(self._http, member)
        except TimeoutError:
            raise ConnectionLostError(f"connecting to {member.name} timed out", False) from None
        self.stats.node(member.name).connects += 1
        return session

    async def _connect_native(self, http: aiohttp.ClientSession, member: Member) -> NodeSession:
        return await connect_native(
            http, member, secret=self.secret, client=self.name,
            heartbeat_s=self.heartbeat_s, on_error=self._on_server_error,
        )  # fmt: skip

    def _on_server_error(self, exc: KapokError) -> None:
        self.stats.server_errors += 1
        log.warning("%s: a node reported: %s", self.name, exc)
        self._call(self.on_error, exc)

    # ------------------------------------------------------------ status and callbacks

    def _set_status(self, status: Status) -> None:
        """Move to ``status``; a CLOSED client stays closed. Fires the lifecycle callbacks."""
        old = self.status
        if old is status or old is Status.CLOSED:
            return
        self.status = status
        if old is Status.CONNECTED and status is Status.RECONNECTING:
            self._call(self.on_disconnected)
        elif old is Status.RECONNECTING and status is Status.CONNECTED:
            self._call(self.on_reconnected)

    def _call(self, callback: Callable[..., None] | None, *args: object) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # the caller's bug must not stop the client
            log.exception("%s: a callback failed", self.name)

    def backoff(self, attempt: int) -> float:
        base, cap = self.backoff_base_s, self.backoff_cap_s
        return backoff_delay(attempt, base_s=base, cap_s=cap, rand=self._rng.random())

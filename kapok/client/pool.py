"""``SessionPool``: one connection per node, shared by the producers and consumers given it.

nats-py multiplexes a client's publishes and subscriptions on one connection; Kapok's
native protocol can do the same (requests carry ids, pushes carry their subscription).
Producers and consumers created with the same ``pool=`` share one ``/v1/ws`` connection to
each node. Each user holds a ``Lease`` of it:

* ``close()`` of a lease gives it back: its subscriptions are cancelled on the node
  (``unsub``), and the connection closes when the last lease is given back;
* when the connection breaks, every user sees it break (a publish fails, ``wait_closed``
  returns) and leases a new one, which the pool opens once for all of them.

The connection is opened with the first user's name and ``on_error``: the node counts the
pool's users as one client. KapokMQ mode has no such multiplexing (a KapokMQ producer and
consumer are separate routes), so a pool only serves ``protocol="native"``.

The pool has its own HTTP client, so a connection outlives the user that opened it; use it
as ``async with SessionPool() as pool:`` around its users (``close()`` closes what is left).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Self

import aiohttp

from kapok.client.session import ConfirmsSettles, Deliver, NodeSession, SubSpec, Unsubscribes
from kapok.client.view import Member
from kapok.errors import ConnectionLostError, KapokError, UnsupportedError
from kapok.protocol.native import Settle

__all__ = ["Lease", "SessionPool"]

PoolKey = tuple[str, str, int, str]  # member name, URL, epoch, secret


class _Shared:
    def __init__(self, opening: asyncio.Task[NodeSession]) -> None:
        self.opening = opening
        self.users = 0

    def usable(self) -> bool:
        task = self.opening
        if not task.done():
            return True
        return not task.cancelled() and task.exception() is None and not task.result().closed


class SessionPool:
    """Connections to nodes, shared by every client given this pool."""

    def __init__(self) -> None:
        self._shared: dict[PoolKey, _Shared] = {}
        self._http: aiohttp.ClientSession | None = None

    @property
    def connections(self) -> int:
        """Connections open or opening now."""
        return len(self._shared)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection (their users see them end) and the pool's HTTP client."""
        shared, self._shared = list(self._shared.values()), {}
        for one in shared:
            one.users = 0  # its users' later give-backs find it ended already
            await self._end(one)
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def lease(
        self, key: PoolKey, open_session: Callable[[aiohttp.ClientSession], Awaitable[NodeSession]]
    ) -> Lease:
        shared = self._shared.get(key)
        if shared is None or not shared.usable():
            if self._http is None:
                self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            shared = self._shared[key] = _Shared(asyncio.ensure_future(open_session(self._http)))
        shared.users += 1
        try:
            session = await asyncio.shield(shared.opening)
        except BaseException:
            await self._give_back(key, shared)
            raise
        return Lease(session, lambda: self._give_back(key, shared))

    async def _give_back(self, key: PoolKey, shared: _Shared) -> None:
        shared.users -= 1
        if shared.users:
            return
        if self._shared.get(key) is shared:
            del self._shared[key]
        await self._end(shared)

    @staticmethod
    async def _end(shared: _Shared) -> None:
        """Close a shared connection (or stop its opening)."""
        if not shared.opening.done():
            shared.opening.cancel()
        with contextlib.suppress(BaseException):
            session = await shared.opening
            await session.close()


class Lease:
    """One user's hold on a shared connection: a ``NodeSession`` that gives it back on close."""

    def __init__(self, session: NodeSession, give_back: Callable[[], Awaitable[None]]) -> None:
        self._session = session
        self._give_back = give_back
        self._subs: set[int] = set()
        self._released = False
        self.member: Member = session.member
        self.supports_nack = session.supports_nack

    @property
    def closed(self) -> bool:
        return self._released or self._session.closed

    def _check(self) -> None:
        if self._released:
            raise ConnectionLostError(f"this user gave its connection to {self.member.name} back", False)

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        self._check()
        return await self._session.publish(msgs, topic)

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        self._check()
        sub = await self._session.subscribe(spec, deliver)
        self._subs.add(sub)
        return sub

    def settle(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        self._check()
        self._session.settle(op, sub, codes, requeue)

    async def settle_confirmed(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        self._check()
        if not isinstance(self._session, ConfirmsSettles):
            raise UnsupportedError("this connection cannot confirm a settle")
        await self._session.settle_confirmed(op, sub, codes, requeue)

    async def wait_closed(self) -> str | None:
        return await self._session.wait_closed()

    async def close(self) -> None:
        if self._released:
            return
        self._released = True
        subs, self._subs = self._subs, set()
        if subs and isinstance(self._session, Unsubscribes) and not self._session.closed:
            for sub in subs:
                self._session.unsubscribe(sub)
        await self._give_back()

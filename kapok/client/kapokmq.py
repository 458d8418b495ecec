"""``NodeSession`` over KapokMQ's protocol, so the client works with any KapokMQ-compatible node.

KapokMQ's routes carry less than the native protocol, and this mode says so instead of
pretending: a producer socket per topic (``/Producers/Conn/{topic}/{id}``) takes one JSON
frame per message and answers a raw ``ok`` (or ``{"code": -1, "msg": ...}``) per frame, in
order, without the message's code (``publish`` returns ``""`` as the code); a consumer
socket (``/Consumers/Conn/{topic}/{id}``) pushes PascalCase messages and takes a raw code
as the ack. There is no duplicate filter, routing key, priority, TTL, group choice,
prefetch, nack or touch on these routes. Both sockets start with the secret-key handshake.

An ack is the raw code written to the consumer socket, and KapokMQ's node answers nothing
to it (an unknown code is only counted on the node). So ``settle_confirmed`` — what
``Message.ack(wait=True)`` calls — can only wait until the code has been *written* to the
socket: it raises ``ConnectionLostError`` when the socket is gone or the write fails, and
it cannot report a code the node does not hold.

Any socket of a session that ends ends the session (the consumer reconnects it whole);
``wait_closed`` returns why. ``close`` closes every socket at once, each bounded by
``CLOSE_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from kapok.client.native import CLOSE_TIMEOUT_S
from kapok.client.session import Deliver, SubSpec
from kapok.client.view import Member
from kapok.errors import (
    AuthError,
    ConnectionLostError,
    KapokError,
    NotActiveError,
    UnsupportedError,
)
from kapok.protocol.kapokmq import ASK_KEY, KEY_OK, decode_push, decode_reply, encode_produce
from kapok.protocol.native import Settle
from kapok.tasks import spawn

__all__ = ["KapokMQSession", "compat_frame"]

HANDSHAKE_TIMEOUT_S = 10.0

_sub_ids = itertools.count(1)


def compat_frame(msg: dict[str, Any]) -> str:
    """A native message object as KapokMQ's producer frame; what it cannot carry is an error."""
    extra = set(msg) - {"topic", "data", "delay_s", "dedup_id", "key"}
    if extra or msg.get("enc"):
        what = "binary data" if msg.get("enc") else ", ".join(sorted(extra))
        raise UnsupportedError(f"the KapokMQ protocol cannot carry {what}")
    return encode_produce(msg["data"], math.ceil(msg.get("delay_s", 0)))


async def _open(http: aiohttp.ClientSession, url: str, secret: str, name: str) -> Any:
    try:
        timeout = aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT_S)
        ws = await http.ws_connect(url, timeout=timeout, heartbeat=30.0)
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 503:
            raise NotActiveError(f"{name} takes no clients now (HTTP 503)") from None
        raise ConnectionLostError(f"{name}: WebSocket upgrade failed: HTTP {exc.status}", False) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ConnectionLostError(f"cannot connect to {name}: {exc}", False) from None
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            ask = await ws.receive_str()
            if ask != ASK_KEY:
                raise ConnectionLostError(f"{name}: unexpected greeting {ask[:80]!r}", False)
            await ws.send_str(secret)
            if (answer := await ws.receive_str()) != KEY_OK:
                raise AuthError(f"{name} refused the secret key: {answer[:80]!r}")
    except (TypeError, TimeoutError, aiohttp.ClientError, ConnectionError) as exc:  # closed mid-handshake
        await ws.close()
        raise ConnectionLostError(f"{name}: the key handshake failed: {exc!r}", False) from None
    except KapokError:
        await ws.close()
        raise
    return ws


class _ProducerSocket:
    """One topic's producer socket: replies come one per frame, in order."""

    def __init__(self, ws: Any, name: str) -> None:
        self.ws = ws
        self.name = name
        self.waiting: collections.deque[asyncio.Future[str | KapokError]] = collections.deque()
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type is not WSMsgType.TEXT or not self.waiting:
                    break
                refusal = decode_reply(msg.data)
                self.waiting.popleft().set_result("" if refusal is None else KapokError(refusal))
        finally:
            for future in self.waiting:
                future.set_exception(ConnectionLostError(f"lost the producer connection to {self.name}"))
            self.waiting.clear()


class KapokMQSession:
    supports_nack = False

    def __init__(self, http: aiohttp.ClientSession, member: Member, *, secret: str, client: str) -> None:
        self.member = member
        self._http = http
        self._secret = secret
        self._client = client
        self._producers: dict[str, _ProducerSocket] = {}
        self._consumers: dict[int, Any] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._reason: str | None = None
        self._done = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._closed

    def _url(self, kind: str, topic: str, ident: str) -> str:
        return f"{self.member.ws_url}/{kind}/Conn/{topic}/{ident}"

    async def _producer(self, topic: str) -> _ProducerSocket:
        sock = self._producers.get(topic)
        if sock is None or sock.ws.closed:
            url = self._url("Producers", topic, self._client)
            ws = await _open(self._http, url, self._secret, self.member.name)
            sock = self._producers[topic] = _ProducerSocket(ws, self.member.name)
            sock.reader.add_done_callback(lambda _: self._lost(f"the producer socket of {topic!r} closed"))
        return sock

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        if self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)
        frames = [compat_frame(m) for m in msgs]
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[str | KapokError]] = []
        for msg, frame in zip(msgs, frames, strict=True):
            sock = await self._producer(msg.get("topic") or topic or "")
            future: asyncio.Future[str | KapokError] = loop.create_future()
            sock.waiting.append(future)
            futures.append(future)
            try:
                await sock.ws.send_str(frame)
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                break  # the reader fails what waits
        return list(await asyncio.gather(*futures))

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        if spec.group or spec.key or spec.prefetch or spec.weight or spec.ack != "manual":
            raise UnsupportedError("the KapokMQ protocol has no group, key, prefetch, weight or auto ack")
        sub = next(_sub_ids)
        url = self._url("Consumers", spec.topic, f"{self._client}-{sub}")
        ws = await _open(self._http, url, self._secret, self.member.name)
        self._consumers[sub] = ws
        task = asyncio.get_running_loop().create_task(self._pushes(ws, sub, deliver))
        self._track(task)
        return sub

    async def _pushes(self, ws: Any, sub: int, deliver: Deliver) -> None:
        reason = "closed by the node"
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    reason = f"a {msg.type.name} frame where a push was due"
                    break
                message = decode_push(msg.data)
                if message is not None:  # else {"code": -1, ...}: nothing to deliver
                    deliver(sub, [message])
        except KapokError as exc:
            reason = f"a malformed push: {exc}"
        except Exception as exc:  # a push without the fields it needs, say
            reason = f"a push it could not read: {type(exc).__name__}: {exc}"
        finally:
            self._lost(reason)

    def settle(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        if op != "ack":
            raise UnsupportedError(f"the KapokMQ protocol has no {op}")
        ws = self._consumers.get(sub)
        if ws is None or ws.closed or self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)

        async def send() -> None:
            for code in codes:
                await ws.send_str(code)

        self._track(asyncio.get_running_loop().create_task(send()))

    async def settle_confirmed(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        """Write the codes and return once they are written (the node answers no ack)."""
        if op != "ack":
            raise UnsupportedError(f"the KapokMQ protocol has no {op}")
        ws = self._consumers.get(sub)
        if ws is None or ws.closed or self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)
        try:
            for code in codes:
                await ws.send_str(code)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            raise ConnectionLostError(f"the ack to {self.member.name} was not written: {exc}") from None

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lost(self, reason: str) -> None:
        # Any socket of the session that closes ends the session: the caller reconnects it whole.
        if not self._closed:
            self._closed = True
            self._reason = reason
            spawn(self.close())

    async def wait_closed(self) -> str | None:
        await self._done.wait()
        return self._reason

    async def close(self) -> None:
        self._closed = True
        self._reason = self._reason or "closed by the client"
        sockets = [sock.ws for sock in self._producers.values()] + list(self._consumers.values())
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        self._done.set()

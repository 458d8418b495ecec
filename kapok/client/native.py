"""``NodeSession`` over the native protocol: one ``/v1/ws`` WebSocket per node.

Requests carry ids and wait for the reply with that id; a subscription's ``deliver``
callback is registered when its ``subok`` is *read* (the node sends ``subok`` before the
subscription's first ``msg``, and the reader handles frames in order, so no push can
arrive for an unknown subscription). Acks, nacks and touches are fire-and-forget and
batched: every call of one loop turn goes out in one frame per (op, subscription).
aiohttp's heartbeat pings the node and closes a connection that stops answering.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from kapok.client.session import Deliver, SubSpec, remote_error
from kapok.client.view import Member
from kapok.errors import AuthError, ConnectionLostError, KapokError, NotActiveError
from kapok.protocol.fields import MAX_CODES
from kapok.protocol.native import Settle, decode_frame, encode_pong, encode_pub, encode_settle, encode_sub
from kapok.tasks import spawn

__all__ = ["MAX_FRAME_BYTES", "NativeSession", "connect_native"]

log = logging.getLogger("kapok.client")

MAX_FRAME_BYTES = 64 * 1024 * 1024  # a push frame is ~256 KiB; bounded all the same
_DATA = (WSMsgType.TEXT, WSMsgType.BINARY)


async def connect_native(
    http: aiohttp.ClientSession,
    member: Member,
    *,
    secret: str,
    client: str,
    heartbeat_s: float,
    on_error: Callable[[KapokError], None],
) -> NativeSession:
    """Open ``/v1/ws`` on ``member``; failures are mapped as ``session`` describes."""
    try:
        ws = await http.ws_connect(
            f"{member.ws_url}/v1/ws",
            params={"client": client},
            headers={"Authorization": f"Bearer {secret}"},
            heartbeat=heartbeat_s,
            max_msg_size=MAX_FRAME_BYTES,
            decode_text=False,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        )
    except aiohttp.WSServerHandshakeError as exc:
        if exc.status == 401:
            raise AuthError(f"{member.name} refused the secret key") from None
        if exc.status == 503:  # a passive slave, or the node is out of connections
            raise NotActiveError(f"{member.name} takes no clients now (HTTP 503)") from None
        message = f"{member.name}: WebSocket upgrade failed: HTTP {exc.status}"
        raise ConnectionLostError(message, False) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ConnectionLostError(f"cannot connect to {member.name} ({member.url}): {exc}", False) from None
    return NativeSession(member, ws, on_error)


class NativeSession:
    supports_nack = True

    def __init__(self, member: Member, ws: Any, on_error: Callable[[KapokError], None]) -> None:
        self.member = member
        self._ws = ws
        self._on_error = on_error
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._subscribing: dict[int, Deliver] = {}
        self._deliver: dict[int, Deliver] = {}
        self._settles: dict[tuple[Settle, int, bool], list[str]] = {}
        self._flushing = False
        self._closed = False
        self._done = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ requests

    def _new_id(self) -> int:
        if self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    async def _request(self, rid: int, frame: bytes) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            await self._ws.send_bytes(frame)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            self._lost(f"write failed: {exc}")
        return await future

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        rid = self._new_id()
        reply = await self._request(rid, encode_pub(rid, msgs, topic))
        codes: list[str | KapokError] = reply["codes"]
        return codes

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        rid = self._new_id()
        options = {"group": spec.group, "key": spec.key, "prefetch": spec.prefetch, "weight": spec.weight}
        frame = encode_sub(rid, spec.topic, spec.ack, **options)
        self._subscribing[rid] = deliver
        reply = await self._request(rid, frame)
        sub: int = reply["sub"]
        return sub

    def settle(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        if self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)
        self._settles.setdefault((op, sub, requeue), []).extend(codes)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush_settles)

    def _flush_settles(self) -> None:
        self._flushing = False
        settles, self._settles = self._settles, {}
        frames = [
            encode_settle(op, sub, codes[i : i + MAX_CODES], requeue)
            for (op, sub, requeue), codes in settles.items()
            for i in range(0, len(codes), MAX_CODES)
        ]
        if frames and not self._closed:
            spawn(self._send_all(frames))

    async def _send_all(self, frames: list[bytes]) -> None:
        try:
            for frame in frames:
                await self._ws.send_bytes(frame)
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            # The node requeues what this connection held; the reader reports the loss.
            log.debug("acks to %s not sent: %s", self.member.name, exc)

    # ------------------------------------------------------------ reading

    async def _read(self) -> None:
        reason = "closed by the node"
        try:
            async for msg in self._ws:
                if msg.type in _DATA:
                    self._on_frame(msg.data)
                elif msg.type is WSMsgType.ERROR:
                    reason = f"error: {self._ws.exception()}"
                    break
        except Exception as exc:  # a malformed frame is a broken connection, not a crash
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            self._lost(reason)
            if not self._ws.closed:
                await self._ws.close()
            self._done.set()

    def _on_frame(self, raw: bytes) -> None:
        frame = decode_frame(raw)
        op = frame.get("op")
        if op == "msg":
            sub: Any = frame.get("sub")
            deliver = self._deliver.get(sub)
            if deliver is not None:
                deliver(sub, frame["msgs"])
            return
        rid: Any = frame.get("id")
        if op == "subok":
            deliver = self._subscribing.pop(rid, None)
            if deliver is not None:
                self._deliver[frame["sub"]] = deliver
        elif op == "ping":
            spawn(self._send_all([encode_pong(rid)]))
            return
        elif op == "error":
            self._subscribing.pop(rid, None)
            exc = remote_error(frame.get("code"), frame.get("message"), frame.get("codes"))
            future = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if future is None:
                self._on_error(exc)  # e.g. an ack of a code the node no longer holds
            elif not future.done():
                future.set_exception(exc)
            return
        future = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if future is not None and not future.done():
            future.set_result(frame)

    def _lost(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, {}
        message = f"lost the connection to {self.member.name}: {reason}"
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionLostError(message))
        self._deliver.clear()
        self._subscribing.clear()

    async def wait_closed(self) -> None:
        await self._done.wait()

    async def close(self) -> None:
        self._lost("closed by the client")
        await self._ws.close()
        await self._reader

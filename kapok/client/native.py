"""``NodeSession`` over the native protocol: one ``/v1/ws`` WebSocket per node.

Requests carry ids and wait for the reply with that id; a subscription's ``deliver``
callback is registered when its ``subok`` is *read* (the node sends ``subok`` before the
subscription's first ``msg``, and the reader handles frames in order, so no push can
arrive for an unknown subscription). Acks, nacks and touches are fire-and-forget and
batched: every call of one loop turn goes out in one frame per (op, subscription).
``settle_confirmed`` sends one with a request id instead and waits for the node's ``ok``
or ``error``; it goes through the same queue as the batched frames, after them, so a
touch queued before a confirmed ack cannot overtake it. One writer task drains that queue.

aiohttp's heartbeat pings the node and closes a connection that stops answering. A frame
that cannot be read (not JSON, a push without its fields) breaks the connection: the
reason says so, and ``wait_closed`` returns it for the consumer's report. ``close`` writes
what is queued, sends the close frame and waits at most ``CLOSE_TIMEOUT_S`` for the node's
answer, then drops the connection: a node that stopped reading cannot hold a close up.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import WSMsgType

from kapok.client.session import Deliver, SubSpec, remote_error
from kapok.client.view import Member
from kapok.errors import AuthError, ConnectionLostError, KapokError, NotActiveError
from kapok.protocol.fields import MAX_CODES
from kapok.protocol.native import (
    Settle,
    decode_frame,
    encode_pong,
    encode_pub,
    encode_settle,
    encode_sub,
    encode_unsub,
)
from kapok.tasks import spawn

__all__ = ["CLOSE_TIMEOUT_S", "MAX_FRAME_BYTES", "NativeSession", "connect_native"]

log = logging.getLogger("kapok.client")

MAX_FRAME_BYTES = 64 * 1024 * 1024  # a push frame is ~256 KiB; bounded all the same
CLOSE_TIMEOUT_S = 0.5  # a node answers a close frame in milliseconds, or has stopped reading
_WRITE_ERRORS = (ConnectionError, RuntimeError, aiohttp.ClientError)
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
            timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT_S),
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
        self._out: collections.deque[bytes] = collections.deque()  # frames for the writer, in order
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._reason: str | None = None
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
        except _WRITE_ERRORS as exc:
            self._lost(f"write failed: {exc}")
        return await future

    async def publish(self, msgs: list[dict[str, Any]], topic: str | None = None) -> list[str | KapokError]:
        rid = self._new_id()
        reply = await self._request(rid, encode_pub(rid, msgs, topic))
        codes: list[str | KapokError] = reply["codes"]
        return codes

    async def subscribe(self, spec: SubSpec, deliver: Deliver) -> int:
        rid = self._new_id()
        options = {
            "group": spec.group, "key": spec.key, "prefetch": spec.prefetch, "weight": spec.weight,
            "consumer": spec.consumer,
        }  # fmt: skip
        frame = encode_sub(rid, spec.topic, spec.ack, **options)
        self._subscribing[rid] = deliver
        reply = await self._request(rid, frame)
        sub = reply.get("sub")
        if not isinstance(sub, int) or reply.get("op") != "subok":
            self._lost(f"a {reply.get('op')!r} frame with no subscription id answered the subscription")
            raise ConnectionLostError(f"lost the connection to {self.member.name}: {self._reason}", False)
        return sub

    def settle(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        if self._closed:
            raise ConnectionLostError(f"the connection to {self.member.name} is closed", False)
        self._settles.setdefault((op, sub, requeue), []).extend(codes)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush_settles)

    def unsubscribe(self, sub: int) -> None:
        """Cancel a subscription, after the settles queued for it (the node requeues what it held)."""
        self._deliver.pop(sub, None)
        if not self._closed:
            self._flush_settles()
            self._enqueue([encode_unsub(sub)])

    async def settle_confirmed(self, op: Settle, sub: int, codes: list[str], requeue: bool = True) -> None:
        rid = self._new_id()
        frame: dict[str, Any] = {"op": op, "id": rid, "sub": sub, "codes": codes}
        if op == "nack":
            frame["requeue"] = requeue
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._flush_settles()  # what was queued before goes first
        self._enqueue([orjson.dumps(frame)])
        await future

    def _flush_settles(self) -> None:
        self._flushing = False
        settles, self._settles = self._settles, {}
        frames = [
            encode_settle(op, sub, codes[i : i + MAX_CODES], requeue)
            for (op, sub, requeue), codes in settles.items()
            for i in range(0, len(codes), MAX_CODES)
        ]
        if frames and not self._closed:
            self._enqueue(frames)

    def _enqueue(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        if self._writer is None or self._writer.done():
            self._writer = spawn(self._write())

    async def _write(self) -> None:
        # The only task that writes queued frames: they leave in the order they were queued.
        try:
            while self._out:
                await self._ws.send_bytes(self._out.popleft())
        except _WRITE_ERRORS as exc:
            # The node requeues what this connection held; waiting requests fail here.
            self._out.clear()
            self._lost(f"write failed: {exc}")

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
            if self._ws.close_code is not None and reason == "closed by the node":
                reason = f"closed by the node (WebSocket close code {self._ws.close_code})"
        except KapokError as exc:  # a malformed frame is a broken connection, not a crash
            reason = f"a malformed frame: {exc}"
        except Exception as exc:  # a frame without the fields its op needs, say
            reason = f"a frame it could not read: {type(exc).__name__}: {exc}"
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
            if not self._closed:
                self._enqueue([encode_pong(rid)])
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
        self._reason = reason
        pending, self._pending = self._pending, {}
        message = f"lost the connection to {self.member.name}: {reason}"
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionLostError(message))
        self._deliver.clear()
        self._subscribing.clear()

    async def wait_closed(self) -> str | None:
        await self._done.wait()
        return self._reason

    async def close(self) -> None:
        """Write what is queued (acks of messages already handled), close, drop the
        connection if the node has not answered within ``CLOSE_TIMEOUT_S``."""
        if not self._closed:
            self._flush_settles()
            queued, self._out = list(self._out), collections.deque()
            self._lost("closed by the client")
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    for frame in queued:  # a transport write each; no answer awaited
                        await self._ws.send_bytes(frame)
            except (TimeoutError, *_WRITE_ERRORS):
                pass
        await self._ws.close()
        await self._reader

"""The native protocol's WebSocket route, ``/v1/ws`` (its frames: ``kapok.protocol.native``).

``puback`` is sent only once the batch is durable under ``storage.fsync``.
Pushes for one subscription are batched into ``msg`` frames. Errors never
close the connection; they answer the request that caused them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.errors import (
    BadRequestError,
    KapokError,
    SubscriptionError,
    UnavailableError,
    UnknownCodeError,
    UnknownOpError,
)
from kapok.protocol.fields import client_label, decode_object, get_bool, get_codes, get_int, get_str
from kapok.protocol.native import (
    CLIENT_OPS,
    draft_from_json,
    encode_error,
    encode_msg,
    encode_ok,
    encode_pong,
    encode_puback,
    encode_subok,
    message_json,
)
from kapok.server.guard.clients import ClientInfo, Clients
from kapok.server.keys import CLIENTS, SERVICE
from kapok.server.ws.base import open_ws
from kapok.server.ws.outbox import Outbox
from kapok.service import BrokerService

__all__ = ["NativeConnection", "routes"]

log = logging.getLogger("kapok.server")

routes = web.RouteTableDef()

# Pushes are cut into frames of about this many payload bytes, so one
# frame never holds a whole prefetch window of large messages.
PUSH_FRAME_BYTES = 256 * 1024
# The consoles list at most this many topics a connection has published to.
MAX_LISTED_TOPICS = 100


class NativeConnection:
    """One ``/v1/ws`` client: its subscriptions and the handlers of its frames."""

    def __init__(self, service: BrokerService, clients: Clients, outbox: Outbox, info: ClientInfo) -> None:
        self.service = service
        self.clients = clients
        self.outbox = outbox
        self.info = info  # what the consoles list: the topics it publishes to, its subscriptions
        self.name = info.client_id
        self.subs: dict[int, Consumer] = {}
        self._sub_rid: Any = None
        outbox.on_room = self._share_room
        self._ops: dict[str, Callable[[dict[str, Any], Any], None]] = {
            "pub": self.on_pub,
            "sub": self.on_sub,
            "unsub": self.on_unsub,
            "ack": self.on_ack,
            "nack": self.on_nack,
            "touch": self.on_touch,
            "credit": self.on_credit,
            "ping": self.on_ping,
            "pong": self.on_pong,
        }
        assert tuple(self._ops) == CLIENT_OPS

    def feed(self, frames: list[str | bytes]) -> None:
        """The frames of one socket read, each handled in turn."""
        for raw in frames:
            self.handle(raw)

    def handle(self, raw: str | bytes) -> None:
        rid: Any = None
        try:
            frame = decode_object(raw)
            rid = frame.get("id")
            op = frame.get("op")
            handler = self._ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise UnknownOpError(f"unknown op {op!r}; expected one of {', '.join(self._ops)}")
            handler(frame, rid)
        except KapokError as exc:
            if not isinstance(exc, UnavailableError):  # the node's state, not the frame's fault
                self.clients.count_bad_input(f"v1_{exc.code}")
            self.outbox.send(encode_error(exc, rid))
        except Exception:  # a bug: keep the connection and the node alive
            log.exception("unexpected error handling a /v1/ws frame")
            self.outbox.send(encode_error(KapokError("internal error; see the node's log"), rid))

    def reply(self, rid: Any, **fields: Any) -> None:
        if rid is not None:
            self.outbox.send(encode_ok(rid, **fields))

    # ------------------------------------------------------------ producing

    def on_pub(self, frame: dict[str, Any], rid: Any) -> None:
        msgs = frame.get("msgs")
        limit = self.service.config.server.max_batch
        if not isinstance(msgs, list) or not 1 <= len(msgs) <= limit:
            raise BadRequestError(f"'msgs' must be a list of 1 to {limit} messages")
        topic = frame.get("topic")
        if topic is not None and not isinstance(topic, str):
            raise BadRequestError("field 'topic' must be a string")
        drafts = [draft_from_json(m, self.name, default_topic=topic) for m in msgs]
        codes, durable = self.service.publish(drafts)
        published = self.info.published
        if len(published) < MAX_LISTED_TOPICS:
            published.update({d.topic for d in drafts})
        self.outbox.send(
            encode_puback(rid, codes),
            after=durable,
            refuse=lambda exc: encode_error(exc, rid),
        )

    # ------------------------------------------------------------ consuming

    def on_sub(self, frame: dict[str, Any], rid: Any) -> None:
        ack_mode = get_str(frame, "ack", "manual")
        if ack_mode not in ("manual", "auto"):
            raise BadRequestError('field \'ack\' must be "manual" or "auto"')
        group = frame.get("group")
        if group is not None and not isinstance(group, str):
            raise BadRequestError("field 'group' must be a string")
        key = frame.get("key")
        if key is not None and not isinstance(key, str):
            raise BadRequestError("field 'key' must be a string")
        # The subscription's consumer name (archived with each delivery): its own, else
        # the connection's (see native_ws).
        name = client_label(get_str(frame, "consumer", ""), "field 'consumer'") or self.name
        self._sub_rid = rid
        consumer = self.service.subscribe(
            self,
            get_str(frame, "topic"),
            group=group,
            key=key,
            prefetch=get_int(frame, "prefetch", self.service.config.mq.prefetch, lo=1, hi=1_000_000),
            auto_ack=ack_mode == "auto",
            weight=get_int(frame, "weight", 1, lo=1, hi=1000),
            name=name,
            room=self.outbox.free_bytes // (len(self.subs) + 1),
        )
        if consumer.id not in self.subs:
            self._confirm(consumer)

    def _confirm(self, consumer: Consumer) -> None:
        # subok must precede the subscription's first msg frame, which the
        # broker may produce inside subscribe() already.
        self.subs[consumer.id] = consumer
        self.info.subscriptions.add(consumer.id)
        self.outbox.send(encode_subok(self._sub_rid, consumer.id, consumer.group.name, consumer.prefetch))

    def _share_room(self, room: int) -> None:
        """The outbox drained: share what it can take among the subscriptions that ran out."""
        starved = [c.id for c in self.subs.values() if c.room <= 0]
        if starved:
            share = max(1, room // len(self.subs))
            for cid in starved:
                self.service.set_room(cid, share)

    def push(self, consumer: Consumer, entries: list[Entry], after: asyncio.Future[None] | None) -> None:
        if consumer.id not in self.subs:
            self._confirm(consumer)
        msgs: list[dict[str, Any]] = []
        size = 0
        for entry in entries:
            msg = entry.msg
            msgs.append(message_json(msg, entry))
            size += len(msg.data)
            if size >= PUSH_FRAME_BYTES:
                self._send_msgs(consumer, msgs, after)
                msgs, size = [], 0
        if msgs:
            self._send_msgs(consumer, msgs, after)

    def _send_msgs(
        self, consumer: Consumer, msgs: list[dict[str, Any]], after: asyncio.Future[None] | None
    ) -> None:
        on_sent = self._auto_acker(consumer.id, [m["code"] for m in msgs]) if consumer.auto_ack else None
        self.outbox.send(encode_msg(consumer.id, msgs), after=after, on_sent=on_sent)

    def _auto_acker(self, consumer_id: int, codes: list[str]) -> Callable[[], None]:
        def ack() -> None:
            if consumer_id in self.subs:
                self.service.ack(consumer_id, codes)

        return ack

    def _sub(self, frame: dict[str, Any]) -> int:
        sub = frame.get("sub")
        if isinstance(sub, bool) or not isinstance(sub, int) or sub not in self.subs:
            raise SubscriptionError(f"no subscription {sub!r} on this connection")
        return sub

    def on_unsub(self, frame: dict[str, Any], rid: Any) -> None:
        sub = self._sub(frame)
        del self.subs[sub]
        self.info.subscriptions.discard(sub)
        self.service.unsubscribe(sub)
        self.reply(rid)

    def _settled(self, rid: Any, unknown: list[str]) -> None:
        if unknown:
            raise UnknownCodeError(f"{len(unknown)} code(s) are not held by this subscription", unknown)
        self.reply(rid)

    def on_ack(self, frame: dict[str, Any], rid: Any) -> None:
        sub = self._sub(frame)
        self._settled(rid, self.service.ack(sub, get_codes(frame)))

    def on_nack(self, frame: dict[str, Any], rid: Any) -> None:
        sub = self._sub(frame)
        requeue = get_bool(frame, "requeue", True)
        self._settled(rid, self.service.nack(sub, get_codes(frame), requeue))

    def on_touch(self, frame: dict[str, Any], rid: Any) -> None:
        sub = self._sub(frame)
        self._settled(rid, self.service.touch(sub, get_codes(frame)))

    def on_credit(self, frame: dict[str, Any], rid: Any) -> None:
        sub = self._sub(frame)
        got = self.service.set_prefetch(sub, get_int(frame, "prefetch", None, lo=1, hi=1_000_000))
        self.reply(rid, prefetch=got)

    def on_ping(self, frame: dict[str, Any], rid: Any) -> None:
        self.outbox.send(encode_pong(rid))

    def on_pong(self, frame: dict[str, Any], rid: Any) -> None:
        return None  # any frame proves liveness; the socket's heartbeat does the rest

    def close(self) -> None:
        for sub in list(self.subs):
            self.service.unsubscribe(sub)
        self.subs.clear()


def _connection_name(number: int, request: web.Request) -> str:
    """An unnamed connection's name: ``conn-<number>@<peer address>:<port>``.

    The node's connection counter alone (``conn-7``) starts again at every start and on
    every node, so archives merged from several nodes, or from before and after a
    restart, would give one name to many connections. The peer's address and port tell
    the client host and its socket (what an operator can look up), and no two
    connections open at once share them; the counter keeps a port the client reuses
    later apart. The ``run`` of an archive line tells the node that wrote it.
    """
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"conn-{number}@[{host}]:{port}" if ":" in host else f"conn-{number}@{host}:{port}"
    return f"conn-{number}@{request.remote or 'unknown'}"


@routes.get("/v1/ws")
async def native_ws(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]  # the auth middleware has checked the key
    name = client_label(request.query.get("client", ""), "query parameter 'client'")
    async with open_ws(request) as (ws, outbox):
        info = ClientInfo(name, request.remote or "", service.now(), "v1")
        clients = request.app[CLIENTS]
        client = clients.add(info)
        # Rate limits and the console count per producer, and the archive per consumer:
        # without a name of its own, each connection is its own producer and consumer.
        info.client_id = info.client_id or _connection_name(client, request)
        conn = NativeConnection(service, clients, outbox, info)
        try:
            ws.deliver(conn.feed, outbox)
            await ws.wait_closed()
        finally:
            clients.remove(client)
            conn.close()
    return ws.response

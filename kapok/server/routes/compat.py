"""KapokMQ's producer and consumer routes, byte-compatible with its clients.

Same paths, handshake strings, raw ``ok`` and raw-code acks as KapokMQ, with
its bugs fixed: ``ok`` is sent only once the message is stored (and durable
per ``storage.fsync``); a malformed frame gets a ``{"code":-1,"msg":...}``
reply instead of a silently closed socket (one reply per frame, so a Go
client's ``ProducerAck`` still pairs replies with sends); consumers get
messages that waited for them; a disconnect requeues what the consumer held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, TypeVar

from aiohttp import web

from kapok.core.broker import Draft
from kapok.core.consumers import Consumer
from kapok.core.model import Entry
from kapok.errors import BadRequestError, KapokError, UnavailableError
from kapok.protocol.fields import client_label
from kapok.protocol.kapokmq import KEY_ERROR, decode_produce, draft_from_fields, encode_error, encode_pushes
from kapok.protocol.kapokmq import OK as OK_TEXT
from kapok.server.guard.auth import check_key, compat_handshake
from kapok.server.guard.clients import ClientInfo, Clients
from kapok.server.keys import CLIENTS, SERVICE
from kapok.server.routes.responses import json_response, read_form
from kapok.server.ws.base import open_ws
from kapok.server.ws.outbox import Outbox
from kapok.service import BrokerService

__all__ = ["routes"]

T = TypeVar("T")

log = logging.getLogger("kapok.server")
routes = web.RouteTableDef()

OK = OK_TEXT.encode()
_TEXT_ONLY = "frames must be text: a JSON object with MessageData and DelayTime"


def _client_ip(request: web.Request) -> str:
    return request.remote or ""


class _Batch(Generic[T]):
    """Collects what a socket read delivered and handles it as one batch.

    KapokMQ clients send one frame per message (and per ack); a frame at a time the
    broker, the WAL and the reply path would each pay their fixed cost per message.
    The socket hands over every frame of one read at once (``ServerSocket.deliver``):
    ``collect`` gathers them, at most ``limit`` to a batch, and the caller ``flush``es.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[T] = []

    def collect(self, item: T) -> None:
        self.items.append(item)
        if len(self.items) >= self.limit:
            self.flush()

    def flush(self) -> None:
        items, self.items = self.items, []
        if items:
            self.handle(items)

    def handle(self, items: list[T]) -> None:
        raise NotImplementedError


class _Publisher(_Batch[Draft]):
    """Publishes a producer's frames of one socket read together. Each frame still gets its
    own reply, in order: a batch the broker refuses (it refuses whole batches: a limit, a
    rate) is retried frame by frame, which gives every frame the answer it would have had
    alone."""

    def __init__(
        self,
        service: BrokerService,
        clients: Clients,
        outbox: Outbox,
        limit: int,
        topic: str,
        producer_id: str,
    ) -> None:
        super().__init__(limit)
        self.service = service
        self.clients = clients
        self.outbox = outbox
        self.topic = topic
        self.producer_id = producer_id

    def error(self, kind: str, message: str) -> None:
        """Reply with an error to a frame that was not a message (after the frames before it)."""
        self.flush()
        self.clients.count_bad_input(kind)
        self.outbox.send(encode_error(message))

    def feed(self, frames: list[str | bytes]) -> None:
        """The frames of one socket read, published at once."""
        for frame in frames:
            if not isinstance(frame, str):
                self.error("compat_binary_frame", _TEXT_ONLY)
                continue
            try:
                self.collect(decode_produce(frame, self.topic, self.producer_id))
            except KapokError as exc:
                self.error("compat_producer_frame", exc.message)
        self.flush()
        # All of this read is published: written now if cheap (fsync never or interval),
        # its oks go out on this turn, not two turns later (the round trip's loop turns).
        self.service.write_now()
        self.outbox.write_ready()

    def handle(self, drafts: list[Draft]) -> None:
        try:
            _, durable = self.service.publish(drafts)
        except UnavailableError as exc:  # the node takes no writes now: not the frames' fault
            self.outbox.send_many([encode_error(exc.message)] * len(drafts))
            return
        except KapokError as exc:
            if len(drafts) == 1:
                self.clients.count_bad_input("compat_producer_frame")
                self.outbox.send(encode_error(exc.message))
                return
            for draft in drafts:
                self.handle([draft])
            return
        except Exception:  # a bug: answer every frame, keep the socket and the node
            log.exception("unexpected error publishing KapokMQ frames")
            self.outbox.send_many([encode_error("internal error; see the node's log")] * len(drafts))
            return
        self.outbox.send_many([OK] * len(drafts), after=durable, refuse=_refusal)


def _refusal(exc: KapokError) -> bytes:
    return encode_error(exc.message)


@routes.get("/Producers/Conn/{topic}/{producer_id}")
async def producer_ws(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    topic = request.match_info["topic"]
    producer_id = client_label(request.match_info["producer_id"], "producer id")
    async with open_ws(request, handshake=True) as (ws, outbox):
        if not await compat_handshake(ws, request):
            return ws.response
        info = ClientInfo(producer_id, _client_ip(request), service.now(), "kapokmq", published={topic})
        clients = request.app[CLIENTS]
        client = clients.add(info)
        publisher = _Publisher(service, clients, outbox, service.config.server.max_batch, topic, producer_id)
        try:
            ws.deliver(publisher.feed, outbox)
            await ws.wait_closed()
        finally:
            clients.remove(client)
    return ws.response


class _CompatConsumer:
    """Pushes one PascalCase JSON frame per message, as KapokMQ clients expect."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def push(self, consumer: Consumer, entries: list[Entry], after: asyncio.Future[None] | None) -> None:
        self.outbox.send_many(encode_pushes([entry.msg for entry in entries]), after=after)


@routes.get("/Consumers/Conn/{topic}/{consumer_id}")
async def consumer_ws(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    topic = request.match_info["topic"]
    # KapokMQ clients name every consumer connection (the path's consumerId): it is the
    # consumer's name in the console and in the archive's deliveries, as the client gave it.
    consumer_id = client_label(request.match_info["consumer_id"], "consumer id")
    async with open_ws(request, handshake=True) as (ws, outbox):
        if not await compat_handshake(ws, request):
            return ws.response
        try:
            sink = _CompatConsumer(outbox)
            consumer = service.subscribe(sink, topic, name=consumer_id, room=outbox.free_bytes)
        except KapokError as exc:
            # Written directly: the outbox is torn down with the socket below.
            await ws.send_str(encode_error(exc.message).decode())
            await ws.close()
            return ws.response
        cid = consumer.id
        outbox.on_room = lambda room: service.set_room(cid, room) if consumer.room <= 0 else None
        ip = _client_ip(request)
        info = ClientInfo(consumer_id, ip, service.now(), "kapokmq", subscriptions={consumer.id})
        clients = request.app[CLIENTS]
        client = clients.add(info)
        acker = _Acker(service, clients, consumer.id, service.config.server.max_batch)
        try:
            ws.deliver(acker.feed, outbox)
            await ws.wait_closed()
        finally:
            clients.remove(client)
            service.unsubscribe(consumer.id)  # what it acked before leaving is not requeued
    return ws.response


class _Acker(_Batch[str]):
    """Acks a consumer's codes of one loop turn with one broker call (one dispatch, one WAL
    append). KapokMQ clients expect no reply to an ack, so an unknown code is only counted
    and logged (once per connection)."""

    def __init__(self, service: BrokerService, clients: Clients, consumer_id: int, limit: int) -> None:
        super().__init__(limit)
        self.service = service
        self.clients = clients
        self.consumer_id = consumer_id
        self._warned = False

    def feed(self, frames: list[str | bytes]) -> None:
        """The frames of one socket read, acked at once."""
        for frame in frames:
            if isinstance(frame, str):
                self.collect(frame.strip())
            else:
                self.bad("compat_binary_frame")
        self.flush()

    def handle(self, codes: list[str]) -> None:
        for _ in self.service.ack(self.consumer_id, codes):
            self.bad("compat_unknown_ack")

    def bad(self, kind: str) -> None:
        self.clients.count_bad_input(kind)
        if not self._warned:
            log.warning("consumer %s sent an ack that matches nothing it holds (%s)", self.consumer_id, kind)
            self._warned = True


@routes.post("/Producer/Send")
async def producer_send(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    try:
        if not await check_key(request, request.headers.get("secretKey")):
            return json_response({"code": -1, "msg": KEY_ERROR})
        form = await read_form(request)
        data, topic, delay = form.get("messageData"), form.get("topic"), form.get("delayTime")
        if not data or not topic:
            raise BadRequestError("Required data cannot be empty")
        try:
            delay_s = int(delay or "")
        except ValueError:
            raise BadRequestError("delayTime must be an integer number of seconds") from None
        draft = draft_from_fields(data, delay_s, topic, "http:" + _client_ip(request))
        codes, durable = service.publish([draft])
        if durable is not None:
            await durable
    except KapokError as exc:
        if not isinstance(exc, UnavailableError):  # the node's state (a full disk...), not bad input
            request.app[CLIENTS].count_bad_input("compat_http_send")
        return json_response({"code": -1, "msg": exc.message})
    return json_response({"code": 0, "msg": codes[0]})

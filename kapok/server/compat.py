"""KapokMQ's producer and consumer routes, byte-compatible with its clients.

Same paths, handshake strings, raw ``ok`` and raw-code acks as KapokMQ, with
its bugs fixed: ``ok`` is sent only once the message is stored (and durable
per ``storage.fsync``); a malformed frame gets a ``{"code":-1,"msg":...}``
reply instead of a silently closed socket (one reply per frame, so a Go
client's ``ProducerAck`` still pairs replies with sends); consumers get
messages that waited for them; a disconnect requeues what the consumer held.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import WSMsgType, web

from kapok.core.model import Consumer, Entry
from kapok.errors import BadRequestError, KapokError
from kapok.server.auth import KEY_ERROR, compat_handshake, key_matches
from kapok.server.codec import client_label, compat_draft, compat_fields_draft, compat_push
from kapok.server.keys import SERVICE
from kapok.server.outbox import Outbox
from kapok.server.responses import json_response, read_form
from kapok.server.service import BrokerService, ClientInfo
from kapok.server.wsbase import open_ws

__all__ = ["routes"]

log = logging.getLogger("kapok.server")
routes = web.RouteTableDef()

OK = b"ok"


def compat_error(message: str) -> bytes:
    return orjson.dumps({"code": -1, "msg": message})


def _client_ip(request: web.Request) -> str:
    return request.remote or ""


@routes.get("/Producers/Conn/{topic}/{producer_id}")
async def producer_ws(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    topic = request.match_info["topic"]
    producer_id = client_label(request.match_info["producer_id"], "producer id")
    async with open_ws(request, text=True) as (ws, outbox):
        if not await compat_handshake(ws, service):
            return ws
        info = ClientInfo("producer", producer_id, topic, _client_ip(request), service.now(), "kapokmq")
        client = service.add_client(info)
        try:
            async for msg in ws:
                await outbox.wait_writable()
                if msg.type is not WSMsgType.TEXT:
                    service.count_bad_input("compat_binary_frame")
                    outbox.send(
                        compat_error("frames must be text: a JSON object with MessageData and DelayTime")
                    )
                    continue
                try:
                    draft = compat_draft(msg.data, topic, producer_id)
                    _, durable = service.publish([draft])
                except KapokError as exc:
                    service.count_bad_input("compat_producer_frame")
                    outbox.send(compat_error(exc.message))
                    continue
                outbox.send(OK, after=durable)
        finally:
            service.remove_client(client)
    return ws


class _CompatConsumer:
    """Pushes one PascalCase JSON frame per message, as KapokMQ clients expect."""

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    def push(self, consumer: Consumer, entries: list[Entry]) -> None:
        for entry in entries:
            self.outbox.send(compat_push(entry.msg))


@routes.get("/Consumers/Conn/{topic}/{consumer_id}")
async def consumer_ws(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    topic = request.match_info["topic"]
    consumer_id = request.match_info["consumer_id"]
    async with open_ws(request, text=True) as (ws, outbox):
        if not await compat_handshake(ws, service):
            return ws
        try:
            consumer = service.subscribe(_CompatConsumer(outbox), topic, name=consumer_id)
        except KapokError as exc:
            # Written directly: the outbox is torn down with the socket below.
            await ws.send_str(compat_error(exc.message).decode())
            await ws.close()
            return ws
        info = ClientInfo("consumer", consumer_id, topic, _client_ip(request), service.now(), "kapokmq")
        client = service.add_client(info)
        try:
            await _read_acks(ws, service, consumer.id)
        finally:
            service.remove_client(client)
            service.unsubscribe(consumer.id)
    return ws


async def _read_acks(ws: web.WebSocketResponse, service: BrokerService, consumer_id: int) -> None:
    warned = False
    async for msg in ws:
        if msg.type is WSMsgType.TEXT:
            code = msg.data.strip()
            if not service.ack(consumer_id, [code]):
                continue
            kind = "compat_unknown_ack"
        else:
            kind = "compat_binary_frame"
        # KapokMQ clients do not expect replies to acks: count, log once per connection.
        service.count_bad_input(kind)
        if not warned:
            log.warning("consumer %s sent an ack that matches nothing it holds (%s)", consumer_id, kind)
            warned = True


@routes.post("/Producer/Send")
async def producer_send(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not key_matches(request.headers.get("secretKey"), service.config.mq.secret_key):
        service.auth_failures += 1
        return json_response({"code": -1, "msg": KEY_ERROR})
    try:
        form = await read_form(request)
        data, topic, delay = form.get("messageData"), form.get("topic"), form.get("delayTime")
        if not data or not topic:
            raise BadRequestError("Required data cannot be empty")
        try:
            delay_s = int(delay or "")
        except ValueError:
            raise BadRequestError("delayTime must be an integer number of seconds") from None
        draft = compat_fields_draft(data, delay_s, topic, "http:" + _client_ip(request))
        codes, durable = service.publish([draft])
        if durable is not None:
            await durable
    except KapokError as exc:
        service.count_bad_input("compat_http_send")
        return json_response({"code": -1, "msg": exc.message})
    return json_response({"code": 0, "msg": codes[0]})

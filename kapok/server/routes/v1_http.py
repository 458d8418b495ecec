"""The native HTTP API (JSON): publish, pull with leases, ack/nack, topic stats.

Errors are ``{"error": <code>, "message": <text>}`` with the status of the
error class (see ``kapok.errors``); the error middleware writes them.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kapok.core.broker import Settle
from kapok.core.changes import EARLIEST
from kapok.core.claims import check_claim
from kapok.core.topics import Topic
from kapok.errors import BadRequestError, NotFoundError
from kapok.protocol.fields import client_label, decode_object, get_bool, get_codes, get_str
from kapok.protocol.native import draft_from_json, message_json
from kapok.server.keys import SERVICE
from kapok.server.routes.responses import json_response, number_field

__all__ = ["routes", "topic_stats"]

routes = web.RouteTableDef()

MAX_PULL = 1000


async def _json_body(request: web.Request) -> dict[str, Any]:
    return decode_object(await request.read(), "request body")


@routes.post("/v1/topics/{topic}/messages")
async def publish(request: web.Request) -> web.Response:
    """Body: one message object, or ``{"messages": [...]}``; answer ``{"codes": [...]}``."""
    service = request.app[SERVICE]
    body = await _json_body(request)
    topic = request.match_info["topic"]
    producer = client_label(request.headers.get("X-Kapok-Producer", ""), "X-Kapok-Producer")
    producer = producer or f"http:{request.remote}"
    if "messages" in body:
        items = body["messages"]
        limit = service.config.server.max_batch
        if not isinstance(items, list) or not 1 <= len(items) <= limit:
            raise BadRequestError(f"'messages' must be a list of 1 to {limit} messages")
    else:
        items = [body]
    codes, durable = service.publish([draft_from_json(item, producer, route_topic=topic) for item in items])
    if durable is not None:
        await durable
    return json_response({"codes": codes})


def _query_number(request: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    return number_field(request.query, name, default, lo, hi, what=f"query parameter {name!r}")


@routes.get("/v1/topics/{topic}/messages")
async def pull(request: web.Request) -> web.Response:
    """Lease messages: ``group``, ``max`` (1-1000), ``wait`` (long-poll seconds), ``lease_s``,
    ``claim`` (a name for the lease: ``kapok.core.claims``), ``start`` (``earliest``: a group
    this pull makes gets every live message of the topic; ``latest``, the default: only
    what is published from now on); header ``X-Kapok-Consumer``: who pulls.

    Leased messages must be acked by code (or by claim) before the lease ends, or they
    are delivered again (counting toward ``max_deliveries``). Under a claim that still
    has messages in flight, the answer is those messages, their leases renewed.
    """
    service = request.app[SERVICE]
    topic = request.match_info["topic"]
    cfg = service.config
    max_n = int(_query_number(request, "max", 1, 1, MAX_PULL))
    wait_s = _query_number(request, "wait", 0.0, 0.0, cfg.server.long_poll_max_s)
    lease_s = _query_number(request, "lease_s", cfg.mq.topic(topic).ack_timeout_s, 0.001, 86400.0)
    group = request.query.get("group")
    claim = request.query.get("claim")
    if claim is not None:
        check_claim(claim)
    start = request.query.get("start", "latest")
    if start not in ("latest", EARLIEST):
        raise BadRequestError("query parameter 'start' must be 'latest' or 'earliest'")
    # Named as a publish names its producer: the client's name, else its address.
    consumer = client_label(request.headers.get("X-Kapok-Consumer", ""), "X-Kapok-Consumer")
    consumer = consumer or f"http:{request.remote}"
    entries = await service.pull(topic, group, max_n, lease_s, wait_s, claim or "", start, consumer)
    if claim is not None and entries:
        # The lease must outlive a crash or a takeover before its reader sees it: a reader
        # that writes a batch and then acks its claim would otherwise get it again.
        durable = service.durable()
        if durable is not None:
            await durable
    messages = []
    for entry in entries:
        item = message_json(entry.msg, entry)
        item["group"] = entry.group.name
        item["lease_until"] = entry.deadline
        messages.append(item)
    if claim is not None:
        return json_response({"messages": messages, "claim": claim})
    return json_response({"messages": messages})


async def _settle(request: web.Request, ack: bool) -> web.Response:
    service = request.app[SERVICE]
    body = await _json_body(request)
    group = body.get("group")
    if group is not None and not isinstance(group, str):
        raise BadRequestError("field 'group' must be a string")
    claim = body.get("claim")
    if claim is not None:
        check_claim(claim)
    codes = get_codes(body) if claim is None or "codes" in body else []
    if ack:
        how = Settle.ACK
    else:
        how = Settle.REQUEUE if get_bool(body, "requeue", True) else Settle.REJECT
    if claim is None:
        unknown = service.settle_in_group(request.match_info["topic"], group, codes, how)
        return json_response({"settled": len(codes) - len(unknown), "unknown": unknown})
    settled, unknown = service.settle_leases(request.match_info["topic"], group, codes, claim, how)
    durable = service.durable()  # answered once it outlives a crash or a takeover, as the lease did
    if durable is not None:
        await durable
    return json_response({"settled": settled, "unknown": unknown})


@routes.post("/v1/topics/{topic}/ack")
async def ack(request: web.Request) -> web.Response:
    """Body ``{"group": g, "codes": [...]}`` and/or ``"claim": c`` (every message in flight
    under the claim); unknown codes are listed, the rest settled."""
    return await _settle(request, ack=True)


@routes.post("/v1/topics/{topic}/nack")
async def nack(request: web.Request) -> web.Response:
    """Body ``{"group": g, "codes": [...], "requeue": true}`` (or a ``"claim"``, as for an
    ack); ``requeue: false`` dead-letters."""
    return await _settle(request, ack=False)


def topic_stats(topic: Topic) -> dict[str, Any]:
    groups = [
        {
            "name": group.name,
            "durable": group.durable,
            "ready": group.ready_count,
            "inflight": group.inflight_count(),
            "consumers": group.consumer_count(),
        }
        for group in topic.groups.values()
    ]
    return {
        "name": topic.name,
        "mode": "p2p" if topic.cfg.push_type == 1 else "pubsub",
        "live": topic.live_count,
        "live_bytes": topic.live_bytes,
        "delayed": topic.delayed_count,
        "groups": groups,
    }


@routes.get("/v1/topics")
async def list_topics(request: web.Request) -> web.Response:
    broker = request.app[SERVICE].broker
    return json_response({"topics": [topic_stats(t) for t in broker.topics.values()]})


@routes.get("/v1/topics/{topic}")
async def get_topic(request: web.Request) -> web.Response:
    broker = request.app[SERVICE].broker
    topic = broker.topics.get(request.match_info["topic"])
    if topic is None:
        raise NotFoundError(f"no topic {request.match_info['topic']!r}")
    return json_response(topic_stats(topic))


@routes.get("/v1/messages/{code}")
async def get_message(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    msg = service.broker.messages.get(request.match_info["code"])
    if msg is None:
        raise NotFoundError("no message with that code")
    out = message_json(msg)
    out["groups"] = {
        name: {"status": e.status.value, "attempts": e.attempts} for name, e in msg.entries.items()
    }
    out["finished_at"] = msg.finished_at or None
    return json_response(out)


@routes.delete("/v1/messages/{code}")
async def delete_message(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    code = get_str({"code": request.match_info["code"]}, "code")
    if not service.delete(code):
        raise NotFoundError("no message with that code")
    return json_response({"deleted": code})


@routes.post("/v1/messages/{code}/requeue")
async def requeue_dead_letter(request: web.Request) -> web.Response:
    """Publish a dead letter (a message of a ``.dlq`` topic) again to its original topic."""
    service = request.app[SERVICE]
    code, durable = service.requeue_dead_letter(request.match_info["code"])
    if durable is not None:
        await durable
    return json_response({"code": code, "requeued": request.match_info["code"]})

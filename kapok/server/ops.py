"""Operational routes: health, Prometheus metrics, the cluster view.

These carry no message data, so they need no key (load balancers and
scrapers call them); everything that does carry data is authenticated.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kapok import __version__
from kapok.server.keys import REGISTRY, SERVICE
from kapok.server.responses import json_response
from kapok.server.service import BrokerService

__all__ = ["member_view", "routes"]

routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    cfg = service.config
    return json_response(
        {
            "status": "ok",
            "node": service.node_name,
            "role": cfg.replication.role,
            "active": cfg.replication.role == "master",
            "version": __version__,
            "uptime_s": round(service.now() - service.started_at, 3),
            "clients": len(service.clients),
        }
    )


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def member_view(service: BrokerService) -> dict[str, Any]:
    """This node in the ``/cluster/nodes`` shape (the gossip view adds the others)."""
    cfg = service.config
    return {
        "name": service.node_name,
        "http_url": service.http_url,
        "gossip_addr": cfg.cluster.advertise or cfg.cluster.bind if cfg.cluster.enabled else None,
        "state": "alive",
        "incarnation": 0,
        "role": cfg.replication.role,
        "pair": None,
        "epoch": 0,
        "version": __version__,
    }


@routes.get("/cluster/nodes")
async def cluster_nodes(request: web.Request) -> web.Response:
    return json_response([member_view(request.app[SERVICE])])

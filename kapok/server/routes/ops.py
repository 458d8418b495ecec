"""Operational routes: health (metrics are in metrics.py, the cluster view in cluster_view.py).

These carry no message data, so they need no key (load balancers and
scrapers call them); everything that does carry data is authenticated.
"""

from __future__ import annotations

from aiohttp import web

from kapok import __version__
from kapok.replication.node import ReplicationNode
from kapok.replication.protocol import Role
from kapok.server.keys import CLIENTS, REPLICATION, SERVICE
from kapok.server.routes.responses import json_response

__all__ = ["pair_role", "routes"]

routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    node = request.app[REPLICATION]
    # A full disk is "degraded", with the reason, and still a 200: the node refuses new
    # messages but serves its consumers, acks and reads, so a load balancer must keep it
    # in rotation for them (producers learn of it from their 507 storage_full).
    full = service.store.full()
    status = {"status": "ok"} if full is None else {"status": "degraded", "reason": f"storage_full: {full}"}
    return json_response(
        {
            **status,
            "node": service.node_name,
            "role": pair_role(node),
            "configured_role": node.configured_role,
            "active": node.active,
            "epoch": node.state.epoch,
            "pair": node.state.partner,
            "replication": node.replication,
            "link": node.link_state(),
            "version": __version__,
            "uptime_s": round(service.now() - service.started_at, 3),
            "clients": len(request.app[CLIENTS]),
        }
    )


def pair_role(node: ReplicationNode) -> str:
    """``master`` while a node leads its pair (fenced or handing over included), ``slave``
    while it follows; while it starts, the role it is configured for."""
    if node.role is Role.STARTING:
        return node.configured_role
    return "slave" if node.role is Role.FOLLOWER else "master"

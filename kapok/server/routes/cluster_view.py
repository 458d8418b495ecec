"""The node's view of the cluster: ``/cluster/nodes``, the KapokMQ node lists, gossip metrics.

With ``cluster.enabled`` the rows come from the gossip view (``app[GOSSIP]``); without
it the cluster is this node alone, in the same shapes, so clients need no special case.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kapok import __version__
from kapok.cluster.messages import NodeMeta, NodeState, State
from kapok.cluster.node import GossipNode, format_addr
from kapok.server.keys import CLIENTS, GOSSIP, REGISTRY, REPLICATION, SERVICE
from kapok.server.routes.ops import pair_role
from kapok.server.routes.responses import json_response
from kapok.tasks import cancel_and_wait

__all__ = ["announce", "compat_nodes", "gossip_ctx", "member_rows", "node_meta", "routes"]

routes = web.RouteTableDef()

_LIVE = (State.ALIVE, State.SUSPECT)  # members that take traffic (a suspect may still refute)


def node_meta(app: web.Application) -> NodeMeta:
    """What this node tells the cluster about itself."""
    service, node = app[SERVICE], app[REPLICATION]
    return NodeMeta(
        name=service.node_name,
        http_url=service.advertised_url,
        role=pair_role(node),
        pair=node.state.partner,
        version=__version__,
        load=float(len(app[CLIENTS])),
        epoch=node.state.epoch,
        active=node.active,
        lag=node.lag(),
        pair_id=node.pair_id,
        alone_since=node.alone_since,
    )


def announce(app: web.Application) -> None:
    """Gossip this node's metadata now (a role or epoch changed: others must know at once)."""
    gossip = app.get(GOSSIP)
    if gossip is not None and gossip.swim is not None:
        gossip.set_meta(node_meta(app))


def _members(app: web.Application) -> list[NodeState]:
    """The gossip view, or without clustering this node alone in the same shape."""
    gossip = app.get(GOSSIP)
    if gossip is not None:
        return gossip.members()
    service = app[SERVICE]
    return [NodeState(service.node_name, "", 0, State.ALIVE, node_meta(app))]


def _views(app: web.Application) -> list[tuple[NodeState, NodeMeta]]:
    """Every member with its metadata: our own as of now, the others' as last gossiped."""
    own = app[SERVICE].node_name
    return [(m, node_meta(app) if m.name == own else m.meta) for m in _members(app)]


def _superseded(views: list[tuple[NodeState, NodeMeta]]) -> set[str]:
    """Members whose claim to be active is stale: a live member of the same pair claims it
    at a higher epoch (the epoch rule; gossip may carry the old claim a moment longer, e.g.
    through a hand-over)."""
    best: dict[str, int] = {}
    for m, meta in views:
        if meta.active and m.state in _LIVE:
            pair = meta.pair_id or m.name
            best[pair] = max(best.get(pair, -1), meta.epoch)
    return {m.name for m, meta in views if meta.active and meta.epoch < best.get(meta.pair_id or m.name, -1)}


def member_rows(app: web.Application) -> list[dict[str, Any]]:
    """``GET /cluster/nodes``: every member this node knows, itself included."""
    service = app[SERVICE]
    views = _views(app)
    stale = _superseded(views)
    rows = []
    for m, meta in views:
        me = m.name == service.node_name
        lag = meta.lag
        rows.append(
            {
                "name": m.name,
                "http_url": meta.http_url,
                "gossip_addr": m.addr or None,
                "state": m.state.value,
                "incarnation": m.incarnation,
                "role": meta.role,
                # Takes producers and consumers now: a dead or departed member's last
                # metadata may still claim it, and a superseded claim is stale too.
                "active": meta.active and m.state in _LIVE and m.name not in stale,
                "pair": meta.pair,
                "pair_id": meta.pair_id or m.name,  # the pair, whatever its roles now
                "epoch": meta.epoch,
                "lag": None if lag is None else {"records": lag[0], "bytes": lag[1], "seconds": lag[2]},
                "alone_since": meta.alone_since,  # confirms writes without its partner since this LSN
                "version": meta.version,
                "load": meta.load,
                "self": me,
            }
        )
    return rows


def compat_nodes(app: web.Application, *, masters_only: bool) -> list[dict[str, str]]:
    """Live members in Serena's registry format, ``{"Name": "mq:host:port", "Addr", "Port"}``
    with the *HTTP* address, which is what the KapokMQ cluster producer connects to."""
    out = []
    views = _views(app)
    stale = _superseded(views)
    for m, meta in views:
        if m.state not in _LIVE or (masters_only and (not meta.active or m.name in stale)):
            continue
        url = urlsplit(meta.http_url)
        if url.hostname is None or url.port is None:
            continue
        name = "mq:" + format_addr(url.hostname, url.port)
        out.append({"Name": name, "Addr": url.hostname, "Port": str(url.port)})
    return out


@routes.get("/cluster/nodes")
async def cluster_nodes(request: web.Request) -> web.Response:
    return json_response(member_rows(request.app))


class _GossipCollector(Collector):
    def __init__(self, node: GossipNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node, swim = self.node, self.node.swim
        members = GaugeMetricFamily(
            "kapok_cluster_members", "Members by state, this node included", labels=["state"]
        )
        states = [m.state for m in node.members()]
        for state in State:
            members.add_metric([state.value], states.count(state))
        yield members
        if swim is None:
            return
        health = GaugeMetricFamily("kapok_gossip_health_score", "Lifeguard local health (0 is healthy)")
        health.add_metric([], swim.awareness)
        yield health
        incarnation = GaugeMetricFamily("kapok_gossip_incarnation", "This node's incarnation number")
        incarnation.add_metric([], swim.incarnation)
        yield incarnation
        dropped = CounterMetricFamily(
            "kapok_gossip_dropped_packets", "Gossip input dropped, by reason", labels=["reason"]
        )
        events = CounterMetricFamily(
            "kapok_gossip_events", "Gossip protocol and transport events", labels=["event"]
        )
        for name, n in sorted((swim.stats + node.stats).items()):
            if name.startswith("drop_"):
                dropped.add_metric([name.removeprefix("drop_")], n)
            else:
                events.add_metric([name], n)
        yield dropped
        yield events


async def gossip_ctx(app: web.Application) -> AsyncIterator[None]:
    """Join at start-up (after recovery, so a node is ready before others see it) and leave
    gracefully at shutdown (before the broker closes, so others see ``left``, not ``dead``)."""
    node = app.get(GOSSIP)
    if node is None:
        yield
        return
    service = app[SERVICE]
    node.meta = node_meta(app)  # the runner knows the real HTTP port by now
    await node.start()
    app[REGISTRY].register(_GossipCollector(node))
    print(f"kapok: node {service.node_name} gossip on {node.addr}", flush=True)
    refresh = asyncio.get_running_loop().create_task(_refresh_meta(node, app))
    try:
        yield
    finally:
        await cancel_and_wait(refresh)
        await node.aclose()


async def _refresh_meta(node: GossipNode, app: web.Application) -> None:
    """Re-publish the metadata when it changed (the load figure, a slave's lag), at most once
    per push-pull period: each change costs a new incarnation gossiped to every member.
    Role and epoch changes go out at once (``announce``)."""
    while True:
        await asyncio.sleep(node.swim_config.push_pull_interval_s)
        meta = node_meta(app)
        if meta != node.meta:
            node.set_meta(meta)

"""``make_app(config)``: the one place where a node's HTTP application is assembled (and
so where ``Seams`` put other parts in than the real ones)."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import WSCloseCode, web

from kapok.clock import Clock
from kapok.cluster.messages import NodeMeta
from kapok.cluster.node import GossipNode
from kapok.config import Config
from kapok.console import setup_console
from kapok.node.seams import Seams
from kapok.replication.applier import UnappliedCollector
from kapok.replication.link import SyncLink
from kapok.replication.node import ReplicationNode
from kapok.server.busypoll import BusyPoll
from kapok.server.guard.bodies import expect_handler, guard_middleware
from kapok.server.guard.clients import Clients
from kapok.server.guard.connections import GUARD, ConnectionGuard, guard_ctx
from kapok.server.keys import (
    BUSY_POLL,
    CLIENTS,
    CONFIG,
    CONNECTIONS,
    GOSSIP,
    REGISTRY,
    REPLICATION,
    SERVICE,
    OpenSockets,
)
from kapok.server.routes import (
    cluster_view,
    compat,
    compat_console,
    metrics,
    openapi,
    ops,
    sync,
    v1_http,
    v1_ws,
)
from kapok.server.routes.metrics import make_registry
from kapok.server.routes.middlewares import auth_middleware, error_middleware
from kapok.server.ws.base import frame_limit
from kapok.service import BrokerService
from kapok.storage import Store
from kapok.storage.disk import DiskStore

__all__ = ["make_app", "wind_down"]

log = logging.getLogger("kapok.server")


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    # Recovered as a mirror: replication (started after gossip) decides whether this node
    # leads, and only then makes the state live.
    await service.start(mirror=True)
    yield
    await service.aclose()


async def _close_connections(app: web.Application, reason: str = "node shutting down") -> None:
    sockets: OpenSockets = app[CONNECTIONS]
    if not sockets:
        return
    # What the push consumers hold goes back to the front of its queues when their sockets
    # close (the handlers unsubscribe them), journaled before the store closes.
    held = sum(len(c.held) for c in app[SERVICE].broker.consumers.values() if not c.is_pull)
    count = len(sockets)
    for ws in list(sockets):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=reason.encode()[:120])
    log.info(
        "closed %d client connections (%s); %d unacked deliveries go back to their queues",
        count, reason, held,
    )  # fmt: skip


async def wind_down(app: web.Application) -> None:
    """The first steps of a graceful stop, to be taken while the node still reads its
    connections (from the start of its runner's cleanup aiohttp drops whatever arrives):
    a master hands its role over on its slave's live link (``ReplicationNode.aclose``, whose
    call by the cleanup context is then a no-op), then clients are told why they go."""
    await app[REPLICATION].aclose()
    await _close_connections(app)


def _add_routes(app: web.Application, table: web.RouteTableDef) -> None:
    """Like ``app.add_routes``, with an ``Expect: 100-continue`` answer that refuses a body
    too large before the client sends it."""
    for route in table:
        if isinstance(route, web.RouteDef):
            app.router.add_route(route.method, route.path, route.handler, expect_handler=expect_handler,
                                 **route.kwargs)  # fmt: skip
        else:
            route.register(app.router)


SEAMS: Final = web.AppKey("seams", Seams)


async def _gossip_started_ctx(app: web.Application) -> AsyncIterator[None]:
    """Runs ``Seams.on_gossip_started`` right after ``cluster_view.gossip_ctx`` started gossip."""
    on_started = app[SEAMS].on_gossip_started
    if on_started is not None:
        on_started()
    yield


def make_app(
    config: Config, *, store: Store | None = None, clock: Clock | None = None, seams: Seams | None = None
) -> web.Application:
    max_body = frame_limit(config.mq.max_message_bytes, config.server.max_batch)
    app = web.Application(
        middlewares=[guard_middleware, error_middleware, auth_middleware], client_max_size=max_body
    )
    if store is None:
        store = DiskStore(config.storage)
    service = BrokerService(config, store=store, clock=clock)
    app[CONFIG] = config
    app[SERVICE] = service
    clients = app[CLIENTS] = Clients(config.server)
    app[CONNECTIONS] = OpenSockets()
    app[REGISTRY] = make_registry(service, clients)
    if config.server.busy_poll_us:
        busy_poll = app[BUSY_POLL] = BusyPoll(config.server.busy_poll_us / 1e6)
        app[REGISTRY].register(busy_poll)
    seams = app[SEAMS] = seams or Seams()
    # Connection limits and time-outs; a site that accepts through it (kapok.node.runner)
    # makes them real, the in-process test server goes without.
    guard = app[GUARD] = ConnectionGuard(config)
    app[REGISTRY].register(guard)
    app.cleanup_ctx.append(guard_ctx)
    app.cleanup_ctx.append(_service_ctx)
    gossip = None
    if config.cluster.enabled:
        transport = seams.gossip_transport() if seams.gossip_transport is not None else None
        gossip = app[GOSSIP] = GossipNode(config.cluster, NodeMeta(service.node_name), transport=transport)
        app.cleanup_ctx.append(cluster_view.gossip_ctx)  # after the service: joins once recovered
        if seams.on_gossip_started is not None:
            app.cleanup_ctx.append(_gossip_started_ctx)
    app[REPLICATION] = ReplicationNode(
        service,
        gossip=gossip,
        close_clients=functools.partial(_close_connections, app),
        on_change=functools.partial(cluster_view.announce, app),
        link_factory=seams.sync_link or SyncLink,
    )
    app.cleanup_ctx.append(sync.replication_ctx)  # after gossip: the first role may depend on it
    app[REGISTRY].register(UnappliedCollector(app[REPLICATION].current_applier))
    app.on_shutdown.append(_close_connections)
    for table in (
        compat.routes,
        compat_console.routes,
        v1_ws.routes,
        v1_http.routes,
        ops.routes,
        metrics.routes,
        cluster_view.routes,
        sync.routes,
        openapi.routes,
    ):
        _add_routes(app, table)
    setup_console(app)  # GET / and /console/...
    return app

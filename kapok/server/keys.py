"""Typed application keys: the only way handlers reach shared objects."""

from __future__ import annotations

from typing import Final, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from kapok.cluster.node import GossipNode
from kapok.config import Config
from kapok.replication.node import ReplicationNode
from kapok.server.busypoll import BusyPoll
from kapok.server.guard.clients import Clients
from kapok.service import BrokerService

__all__ = ["BUSY_POLL", "CLIENTS", "CONFIG", "CONNECTIONS", "GOSSIP", "REGISTRY", "REPLICATION", "SERVICE"]

CONFIG: Final = web.AppKey("config", Config)
SERVICE: Final = web.AppKey("service", BrokerService)
CLIENTS: Final = web.AppKey("clients", Clients)  # client connections, auth state


# Open WebSocket handlers, so that shutdown can close them and the
# max_connections limit can be enforced.
class Closable(Protocol):
    """An open WebSocket as shutdown sees it (``kapok.server.ws.socket.ServerSocket``)."""

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool: ...


class OpenSockets(set[Closable]):
    """The node's open WebSockets."""


CONNECTIONS: Final = web.AppKey("connections", OpenSockets)
REGISTRY: Final = web.AppKey("metrics_registry", CollectorRegistry)
# Set only when cluster.enabled; read it with ``app.get(GOSSIP)``.
GOSSIP: Final = web.AppKey("gossip", GossipNode)
REPLICATION: Final = web.AppKey("replication", ReplicationNode)
# Set unless server.busy_poll_us is 0.
BUSY_POLL: Final = web.AppKey("busy_poll", BusyPoll)

"""A node running inside the test's own event loop, on a real socket."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer

from kapok.core.broker import Broker
from kapok.server.keys import SERVICE
from kapok.server.service import BrokerService

__all__ = ["InProcessNode"]


class InProcessNode:
    """A running app behind an aiohttp ``TestServer``: its service and base URLs."""

    def __init__(self, server: TestServer, app: web.Application) -> None:
        self.server = server
        self.app = app
        self.service: BrokerService = app[SERVICE]
        self.service.http_port = server.port or 0

    @property
    def broker(self) -> Broker:
        return self.service.broker

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"
